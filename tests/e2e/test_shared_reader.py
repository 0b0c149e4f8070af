"""Three pipelines of one `setl start` on one source with `sources.shared_reader_server_id`: one
binlog connection on the server, each target equal to its source table (split transactions
included, with rows of a table no pipeline reads between theirs: the shared stream counts those
without decoding them), through a SIGKILL of the node mid-run and a restart."""

from __future__ import annotations

import time

import pytest
import yaml

from setl.meta import SqliteMetaStore
from setl.model import Ack, Position
from setl.scheduler.cutter import IDLE_ACK_SECONDS
from setl.testing.servers import wait_until
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target

pytestmark = pytest.mark.timeout(240)

TABLES = ("a", "b", "c")
WRITTEN = (*TABLES, "d")  # d: no pipeline reads it


def dumps(server) -> int:
    """The binlog streams `server` serves now."""
    return int(server.query("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                            "WHERE COMMAND LIKE 'Binlog Dump%'")[0][0])


def write(server, db: str, first: int, count: int, tables: tuple[str, ...] = WRITTEN) -> None:
    """`count` rows into each table in small transactions, then one transaction over all three tables
    large enough to be split into pieces, with updates and deletes."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            for start in range(first, first + count, 50):
                ids = range(start, min(start + 50, first + count))
                for t in tables:
                    cur.execute(f"INSERT INTO {t} (id, v) VALUES " + ", ".join(f"({i}, '{t}{i}')" for i in ids))
            cur.execute("BEGIN")
            for t in tables:
                cur.execute(f"UPDATE {t} SET v = CONCAT(v, '+') WHERE MOD(id, 3) = 0 AND id >= %s", (first,))
                cur.execute(f"DELETE FROM {t} WHERE MOD(id, 7) = 0 AND id >= %s", (first,))
            cur.execute("COMMIT")
    finally:
        conn.close()


def contents(server, table: str) -> list[tuple]:
    return [tuple(r) for r in server.query(f"SELECT id, v FROM {table} ORDER BY id")]


def acked(setl: SetlProcess, name: str) -> Position | None:
    if not setl.meta_path.exists():
        return None
    meta = SqliteMetaStore(setl.meta_path)
    try:
        ack = meta.position(name)
    finally:
        meta.close()
    return None if ack is None else ack.position


def ack_of(setl: SetlProcess, name: str) -> Ack | None:
    meta = SqliteMetaStore(setl.meta_path)
    try:
        return meta.position(name)
    finally:
        meta.close()


def test_three_pipelines_share_one_stream_and_survive_a_sigkill(tmp_path, mariadb_source, source_db,
                                                                   mariadb_target, mysql_db):
    """One binlog connection serves three pipelines; after a SIGKILL and a restart every target table is equal."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.d (id INT PRIMARY KEY, v VARCHAR(40))")
    for t in TABLES:
        mariadb_source.query(f"CREATE TABLE `{source_db}`.{t} (id INT PRIMARY KEY, v VARCHAR(40))")
        mariadb_target.query(f"CREATE TABLE `{mysql_db}`.{t} (id INT PRIMARY KEY, v VARCHAR(40))")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1, 600)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=2101,
                                                     start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target), tables=[], name="pa",
                       pipeline={"parallelism": 2, "batch": {"max_rows": 200, "max_wait_ms": 20},
                                 "retry": {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 500}})
    names = {t: f"p{t}" for t in TABLES}
    for i, (t, name) in enumerate(names.items()):
        setl.name = name
        setl.config["source"]["server_id"] = 2101 + i
        setl.config["tables"] = [{"source": rf"{source_db}\.{t}", "target": f"{mysql_db}.{t}"}]
        setl.write_config()
    node = yaml.safe_load((setl.conf / "setl.yaml").read_text())
    node["sources"] = {"shared_reader_server_id": 2199}
    (setl.conf / "setl.yaml").write_text(yaml.safe_dump(node))
    args = [arg for name in names.values() for arg in ("--pipeline", name)]
    wait_until(lambda: dumps(mariadb_source) == 0, timeout=15, message="no other binlog reader")

    proc = setl.spawn("start", *args)
    try:
        wait_until(lambda: all(acked(setl, n) is not None for n in names.values()), timeout=60,
                   message=f"every pipeline acked once; log:\n{setl.logs()[-3000:]}")
        wait_until(lambda: dumps(mariadb_source) == 1, timeout=20, message="one binlog stream")
        write(mariadb_source, source_db, 2000, 600)  # more while running: the kill strikes in the middle of it
    finally:
        proc.kill()
        proc.wait(10)
    head = binlog_head(mariadb_source)
    behind = [n for n in names.values() if (acked(setl, n) or start) < head]
    assert behind, "the kill struck after every pipeline had caught up: nothing left to prove"

    write(mariadb_source, source_db, 4000, 300)
    final = setl.run("start", *args, "--until-caught-up", timeout=120)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "rows events of tables it does not read" in final.stderr + setl.logs(), "the shared stream skipped d's"
    for t in TABLES:
        assert contents(mariadb_target, f"`{mysql_db}`.{t}") == contents(mariadb_source, f"`{source_db}`.{t}")
        assert len(contents(mariadb_target, f"`{mysql_db}`.{t}")) > 1000


def test_an_idle_pipeline_on_the_shared_stream_acks_rarely_and_resumes_exactly_after_a_sigkill(
        tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    """A pipeline whose table gets no rows acks only position marks (about once a second), and after a
    SIGKILL in the middle of its neighbour's rows and a restart, its table's later rows all arrive."""
    for t in ("a", "e"):
        mariadb_source.query(f"CREATE TABLE `{source_db}`.{t} (id INT PRIMARY KEY, v VARCHAR(40))")
        mariadb_target.query(f"CREATE TABLE `{mysql_db}`.{t} (id INT PRIMARY KEY, v VARCHAR(40))")
    start = binlog_head(mariadb_source)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=2201,
                                                     start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target), tables=[], name="busy",
                       pipeline={"parallelism": 2, "batch": {"max_rows": 200, "max_wait_ms": 20}})
    for i, (name, t) in enumerate((("busy", "a"), ("idle", "e"))):
        setl.name = name
        setl.config["source"]["server_id"] = 2201 + i
        setl.config["tables"] = [{"source": rf"{source_db}\.{t}", "target": f"{mysql_db}.{t}"}]
        setl.write_config()
    node = yaml.safe_load((setl.conf / "setl.yaml").read_text())
    node["sources"] = {"shared_reader_server_id": 2299}
    (setl.conf / "setl.yaml").write_text(yaml.safe_dump(node))
    args = ("--pipeline", "busy", "--pipeline", "idle")
    wait_until(lambda: dumps(mariadb_source) == 0, timeout=15, message="no other binlog reader")
    write(mariadb_source, source_db, 1, 300, ("a",))
    proc = setl.spawn("start", *args)
    try:
        wait_until(lambda: (acked(setl, "busy") or start) >= binlog_head(mariadb_source), timeout=60,
                   message=f"the busy pipeline caught up; log:\n{setl.logs()[-3000:]}")
        caught = binlog_head(mariadb_source)
        wait_until(lambda: (acked(setl, "idle") or start) >= caught, timeout=10,
                   message="the idle pipeline acked the marks of its neighbour's rows")
        before = ack_of(setl, "idle")
        began = time.monotonic()
        conn = mariadb_source.connect(database=source_db)
        try:
            with conn.cursor() as cur:
                for i in range(1000, 1030):  # 30 transactions over 1.5 s, none of them the idle one's
                    cur.execute("INSERT INTO a (id, v) VALUES (%s, 'paced')", (i,))
                    time.sleep(0.05)  # pacing the writer, not waiting for a state
        finally:
            conn.close()
        wait_until(lambda: (acked(setl, "busy") or start) >= binlog_head(mariadb_source), timeout=60,
                   message="the busy pipeline caught up again")
        elapsed = time.monotonic() - began
        after = ack_of(setl, "idle")
        write(mariadb_source, source_db, 3000, 1500, ("a",))  # the kill strikes in the middle of these
    finally:
        proc.kill()
        proc.wait(10)
    assert before is not None and after is not None
    # Marks only: one batch (one target transaction and ack) per IDLE_ACK_SECONDS, not per max_wait_ms (20 ms).
    assert after.batch_id - before.batch_id <= elapsed / IDLE_ACK_SECONDS + 2, (before, after, elapsed)
    assert (acked(setl, "busy") or start) < binlog_head(mariadb_source), "the kill struck after the busy one caught up"
    write(mariadb_source, source_db, 5000, 100, ("e", "a"))
    final = setl.run("start", *args, "--until-caught-up", timeout=120)
    assert final.returncode == 0, final.stderr[-3000:]
    for t in ("a", "e"):
        assert contents(mariadb_target, f"`{mysql_db}`.{t}") == contents(mariadb_source, f"`{source_db}`.{t}")
    assert len(contents(mariadb_target, f"`{mysql_db}`.e")) > 50
