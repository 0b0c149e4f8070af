"""`setl repair` on real servers: injected drift of every kind (a deleted row, an extra row, changed
values, a keyless duplicate) is copied again through the pipeline, and the tables verify equal,
into MariaDB with the pipeline running and into PostgreSQL with it stopped (served by the next
`setl start --until-caught-up`)."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from tests.e2e.setl_process import mysql_target, postgres_target
from tests.verify.test_verify import MARIADB_DRIFT, POSTGRES_DRIFT, by_table, fill, make_setl, running, verify

pytestmark = pytest.mark.timeout(180)


def test_repair_mariadb_target_running(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """While the pipeline runs, repair (verify first) fixes deleted, extra and changed rows by key and the
    keyless table whole, through the pipeline; the tables then verify equal and the requests are gone."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2211)
    with running(setl, mariadb_source):
        conn = mariadb_target.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            for statement in MARIADB_DRIFT:
                cur.execute(statement.format(t=f"`{mysql_db}`."))
        result = setl.run("repair", "--pipeline", setl.name, "--wait-timeout", "30", "--json", timeout=150)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + setl.logs()[-3000:]
        repaired = json.loads(result.stdout[result.stdout.index("{"):])
        assert repaired["equal"] and {t["source"].split(".", 1)[1] for t in repaired["tables"]} == {
            "types", "docs", "bag", "named"}
        assert f"{source_db}.types: 12 key(s) to copy again" in result.stdout
        assert f"{source_db}.bag: copied whole" in result.stdout
        code, report = verify(setl)
        assert code == 0 and report["equal"], report
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
