"""Bad input through the CLI on real servers: each exits non-zero with one line naming what is
wrong (no traceback without --debug), and leaves the target untouched."""

from __future__ import annotations

import contextlib
import subprocess

import pymysql
import pytest

from setl.testing.servers import MariaDBServer, wait_until
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target

ROWS = 10


@pytest.fixture(scope="module")
def lossy_server():
    """A MariaDB started with binlog_format=STATEMENT and binlog_row_metadata=MINIMAL."""
    server = MariaDBServer(server_id=7, options={"binlog_format": "STATEMENT", "binlog_row_metadata": "MINIMAL"})
    try:
        yield server.start()
    finally:
        server.cleanup()


def make_table(server, database: str, table: str = "items", *, log_bin: bool = True) -> None:
    with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
        if not log_bin:
            cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        cur.execute(f"CREATE TABLE `{database}`.`{table}` (id INT PRIMARY KEY, v VARCHAR(20))")


def insert_rows(server, database: str, first: int, count: int = ROWS, tables=("items",)) -> None:
    """`count` rows into each of `tables`, all in one transaction."""
    with contextlib.closing(pymysql.connect(**server.connect_args(autocommit=False))) as conn, conn.cursor() as cur:
        for table in tables:
            cur.executemany(f"INSERT INTO `{database}`.`{table}` VALUES (%s, %s)",
                            [(i, f"row {i}") for i in range(first, first + count)])
        conn.commit()


def pipeline_for(tmp_path, source, source_db: str, target: dict, target_db: str, **source_options) -> SetlProcess:
    return SetlProcess(tmp_path, source=mysql_source(source, **source_options), target=target,
                       tables=[{"source": rf"{source_db}\..*", "target": f"{target_db}.{{table}}"}],
                       pipeline={"batch": {"max_wait_ms": 50},
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20}})


def error_line(result: subprocess.CompletedProcess, exit_code: int = 1) -> str:
    """The one `setl: error:` line of a failed run (asserting there is exactly one, and no traceback)."""
    assert result.returncode == exit_code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("setl: error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def target_rows(target, database: str, table: str = "items") -> list[tuple]:
    return target.query(f"SELECT id, v FROM `{database}`.`{table}` ORDER BY id")


def target_position_rows(target, pipeline: str) -> list[tuple]:
    if not target.query("SHOW DATABASES LIKE 'setl'"):
        return []
    if not target.query("SHOW TABLES FROM setl LIKE 'setl_position'"):
        return []
    return target.query("SELECT `log`, `offset` FROM setl.setl_position WHERE pipeline = %s", (pipeline,))


def test_server_settings_that_lose_data_are_refused(tmp_path, lossy_server, mariadb_target, mysql_db):
    """binlog_format=STATEMENT, then binlog_row_metadata=MINIMAL: each stops `setl start` with a line naming it."""
    make_table(lossy_server, "shop")
    make_table(mariadb_target, mysql_db)
    insert_rows(lossy_server, "shop", 1)
    setl = pipeline_for(tmp_path, lossy_server, "shop", mysql_target(mariadb_target), mysql_db)

    line = error_line(setl.start_until_caught_up())
    assert "binlog_format=STATEMENT" in line and "needs binlog_format=ROW" in line
    assert f"{lossy_server.host}:{lossy_server.port}" in line and f"pipeline={setl.name}" in line

    lossy_server.query("SET GLOBAL binlog_format = ROW")  # still started with MINIMAL metadata
    line = error_line(setl.start_until_caught_up())
    assert "binlog_row_metadata=MINIMAL" in line and "needs binlog_row_metadata=FULL" in line

    debug = setl.run("--debug", "start", "--pipeline", setl.name, "--until-caught-up")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert target_rows(mariadb_target, mysql_db) == []
    assert target_position_rows(mariadb_target, setl.name) == []


@pytest.mark.parametrize("side", ["source", "target"])
def test_wrong_credentials_name_the_server_and_account(tmp_path, side, mariadb_source, source_db,
                                                        mariadb_target, mysql_db):
    """A wrong password for the source or the target is one line naming the stage and the denied account."""
    make_table(mariadb_source, source_db, log_bin=False)
    make_table(mariadb_target, mysql_db)
    start = binlog_head(mariadb_source)
    insert_rows(mariadb_source, source_db, 1)
    source = mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset})
    target = mysql_target(mariadb_target)
    (source if side == "source" else target)["password"] = "not-the-password"
    setl = SetlProcess(tmp_path, source=source, target=target,
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}"}])

    line = error_line(setl.start_until_caught_up())
    assert "Access denied for user 'root'" in line
    assert "not-the-password" not in line
    if side == "source":
        assert "stage=select" in line and f"cannot connect to {mariadb_source.host}:{mariadb_source.port}" in line
    else:
        assert "stage=load" in line and "cannot connect to the mysql target" in line
    assert target_rows(mariadb_target, mysql_db) == []
    assert target_position_rows(mariadb_target, setl.name) == []


def test_purged_binlog_position_is_an_error_not_a_skip(tmp_path, mariadb_factory, mariadb_target, mysql_db):
    """A restart whose acked position was purged names it and the oldest available one, and applies nothing more."""
    source = mariadb_factory(server_id=8)
    make_table(source, "shop", log_bin=False)
    make_table(mariadb_target, mysql_db)
    insert_rows(source, "shop", 1)
    setl = pipeline_for(tmp_path, source, "shop", mysql_target(mariadb_target), mysql_db)
    first = setl.start_until_caught_up()
    assert first.returncode == 0, first.stderr[-3000:]
    acked = setl.acked().position
    assert len(target_rows(mariadb_target, mysql_db)) == ROWS

    source.query("FLUSH BINARY LOGS")
    insert_rows(source, "shop", ROWS + 1)  # in a file about to be purged: must never be skipped silently
    source.query("FLUSH BINARY LOGS")
    insert_rows(source, "shop", 2 * ROWS + 1)
    newest = binlog_head(source).log

    def purged() -> bool:
        # MariaDB keeps a file until its binlog checkpoint has moved on (a warning, not an error)
        source.query(f"PURGE BINARY LOGS TO '{newest}'")
        return source.query("SHOW BINARY LOGS")[0][0] == newest

    wait_until(purged, timeout=30, interval=0.2, message=f"the binlogs before {newest} to be purged")

    line = error_line(setl.start_until_caught_up())
    assert f"position {acked.log}:{acked.offset}" in line and "was purged" in line
    assert f"oldest available is {newest}:4" in line
    assert len(target_rows(mariadb_target, mysql_db)) == ROWS
    assert target_position_rows(mariadb_target, setl.name) == [(acked.log, acked.offset)]


def test_missing_target_table_fails_the_whole_batch(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    """A table missing in the target (with ``create_tables: false``) fails with a line naming it, and its
    batch's other rows are not applied."""
    make_table(mariadb_source, source_db, "items", log_bin=False)
    make_table(mariadb_source, source_db, "extras", log_bin=False)
    make_table(mariadb_target, mysql_db, "items")  # no `extras` in the target
    start = binlog_head(mariadb_source)
    insert_rows(mariadb_source, source_db, 1, tables=("items", "extras"))
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}"}],
                       pipeline={"create_tables": False,
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20}})

    line = error_line(setl.start_until_caught_up())
    assert f"table={mysql_db}.extras" in line and "does not exist" in line and "stage=load" in line
    assert target_rows(mariadb_target, mysql_db) == []
    assert target_position_rows(mariadb_target, setl.name) == []
    assert setl.status()["status"] == "paused"


@pytest.mark.parametrize(
    "section, bad, key_path",
    [
        ("source", {"sever_id": 5}, "source.sever_id: unknown key"),
        ("target", {"databse": "x"}, "target.databse: unknown key"),
        ("pipeline", {"batch": {"max_row": 10}}, "pipeline.batch.max_row: unknown key"),
    ],
)
def test_unknown_config_keys_exit_2_naming_file_and_key(tmp_path, section, bad, key_path, mariadb_source,
                                                         mariadb_target, mysql_db):
    """An unknown key in a real pipeline file exits 2 with one line naming the file and the key path."""
    setl = pipeline_for(tmp_path, mariadb_source, "nothing", mysql_target(mariadb_target), mysql_db)
    setl.config[section] = {**setl.config[section], **bad}
    setl.write_config()
    line = error_line(setl.start_until_caught_up(), exit_code=2)
    assert str(setl.config_path) in line and key_path in line
    assert target_position_rows(mariadb_target, setl.name) == []
