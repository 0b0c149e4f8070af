"""`setl repair` on real servers: injected drift of every kind (a deleted row, an extra row, changed
values, a keyless duplicate) is copied again through the pipeline, and the tables verify equal,
into MariaDB with the pipeline running and into PostgreSQL with it stopped (served by the next
`setl start --until-caught-up`)."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator

import pytest

from tests.e2e.setl_process import mysql_target, postgres_target
from tests.verify.test_verify import MARIADB_DRIFT, POSTGRES_DRIFT, by_table, fill, make_setl, running, verify

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def writing(server, db: str) -> Iterator[list[int]]:
    """A writer on the source while the block runs: updates of repaired keys (2 to 6) and of others,
    and new rows; yields [statements written]."""
    stop = threading.Event()
    written = [0]

    def run() -> None:
        conn = server.connect(database=db)
        with contextlib.closing(conn), conn.cursor() as cur:
            n = 0
            while not stop.wait(0.05):
                n += 1
                cur.execute("UPDATE types SET i = i + 1 WHERE id = %s", (2 + n % 5,))
                cur.execute("UPDATE types SET t = %s WHERE id = %s", (f"w{n}", 20 + n % 20))
                cur.execute("INSERT INTO types (id, i) VALUES (%s, %s)", (3000 + n, n))
                written[0] += 3

    thread = threading.Thread(target=run, name="test-writer")
    thread.start()
    try:
        yield written
    finally:
        stop.set()
        thread.join(30)


def test_repair_mariadb_target_running(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """While the pipeline runs and the source is written (the repaired keys too), repair (from verify's
    report) fixes deleted, extra and changed rows by key and the keyless table whole, through the pipeline;
    the tables then verify equal."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2211)
    with running(setl, mariadb_source):
        conn = mariadb_target.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            for statement in MARIADB_DRIFT:
                cur.execute(statement.format(t=f"`{mysql_db}`."))
        code, report = verify(setl)
        assert code == 1
        path = tmp_path / "report.json"
        path.write_text(json.dumps(report))
        with writing(mariadb_source, source_db) as written:
            result = setl.run("repair", "--pipeline", setl.name, "--from-report", str(path), "--wait-timeout", "30",
                              "--json", timeout=150)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + setl.logs()[-3000:]
        assert written[0] > 0
        repaired = json.loads(result.stdout[result.stdout.index("{"):])
        assert repaired["equal"] and {t["source"].split(".", 1)[1] for t in repaired["tables"]} == {
            "types", "docs", "bag", "named"}
        assert f"{source_db}.types: 12 key(s) to copy again" in result.stdout
        assert f"{source_db}.bag: copied whole" in result.stdout
        code, report = verify(setl)
        assert code == 0 and report["equal"], report
        conn = mariadb_target.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(f"DELETE FROM `{mysql_db}`.types WHERE id = 7")
        again = setl.run("repair", "--pipeline", setl.name, "--table", f"{source_db}.types", timeout=150)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "verifying first" in again.stderr and f"{source_db}.types: 1 key(s) to copy again" in again.stdout
        assert f"{source_db}.types -> {mysql_db}.types: equal" in again.stdout, again.stdout
        result = setl.run("repair", "--pipeline", setl.name, timeout=150)
        assert result.returncode == 0 and "nothing to repair" in result.stdout, result.stdout + result.stderr
        conn = mariadb_target.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(f"SELECT id FROM `{mysql_db}`.types WHERE id IN (1, 1000) ORDER BY id")
            assert [row[0] for row in cur.fetchall()] == [1]
            cur.execute(f"SELECT COUNT(*) FROM `{mysql_db}`.bag")
            assert cur.fetchone()[0] == 40
    logs = setl.logs()
    assert re.search(r"table=\S+\.types position=\S+ repair \S+: 11 row\(s\) copied again, 1 deleted", logs), logs
    assert re.search(r"table=\S+\.named position=\S+ repair \S+: 2 row\(s\) copied again, 0 deleted", logs), logs
    assert re.search(r"repair \S+ acked", logs)


def test_repair_postgresql_target_stopped(tmp_path, mariadb_source, postgres_server, source_db, postgres_db):
    """With the pipeline stopped, repair --from-report queues the keys (exit 1: nothing verified yet);
    `setl start --until-caught-up` serves them before it ends, and verify then finds the tables equal."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                     f"{source_db}.{{table}}", server_id=2212)
    with running(setl, mariadb_source):
        for statement in POSTGRES_DRIFT:
            postgres_server.query(statement.format(t=f'"{source_db}".'), dbname=postgres_db)
        code, report = verify(setl)
        assert code == 1
    assert by_table(report)["types"]["extra"] == [{"key": {"id": "1000"}}]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    result = setl.run("repair", "--pipeline", setl.name, "--from-report", str(path), "--table",
                      f"{source_db}.types", "--table", f"{source_db}.named", "--table", f"{source_db}.docs",
                      timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "is not running: the repair is served by its next start" in result.stdout
    done = setl.start_until_caught_up(timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"table=\S+\.types position=\S+ repair \S+: 12 row\(s\) copied again, 1 deleted",
                     done.stderr + setl.logs()), done.stderr[-3000:]
    with running(setl, mariadb_source):
        code, report = verify(setl)
    tables = by_table(report)
    assert all(tables[t]["equal"] for t in ("types", "named", "docs")), report
    # the keyless table was left out with --table: its extra row is still reported
    assert tables["bag"]["extra"] == [{"row": {"x": "1", "y": "y1"}, "count": 1}] and code == 1
    rows = postgres_server.query(f'SELECT id FROM "{source_db}".types WHERE id IN (1, 1000) ORDER BY id',
                                 dbname=postgres_db)
    assert [int(r[0]) for r in rows] == [1], rows
