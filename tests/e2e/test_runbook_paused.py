"""The runbook's fix for a pipeline paused on a missing target table (docs/runbook.md, "A paused
pipeline"), performed as an operator would: read the error in `setl status`, create the table on the
target, `setl resume`, start; the target ends equal to the source and the error is gone."""

from __future__ import annotations

import pytest

from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target
from tests.e2e.test_bad_input import error_line, insert_rows, make_table, target_rows

pytestmark = pytest.mark.timeout(240)


def test_a_missing_target_table_is_created_and_the_pipeline_resumed(tmp_path, mariadb_source, source_db,
                                                                     mariadb_target, mysql_db) -> None:
    """A batch writing a table the target lacks (``create_tables: false``) pauses the pipeline naming
    it; after the table is created and `setl resume` run, the next start applies every row."""
    make_table(mariadb_source, source_db, "items", log_bin=False)
    make_table(mariadb_source, source_db, "extras", log_bin=False)
    make_table(mariadb_target, mysql_db, "items")
    start = binlog_head(mariadb_source)
    insert_rows(mariadb_source, source_db, 1, tables=("items", "extras"))
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}"}],
                       pipeline={"create_tables": False,
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20}})
    line = error_line(setl.start_until_caught_up())
    assert f"table={mysql_db}.extras" in line and "does not exist" in line, line
    status = setl.status()
    assert status["status"] == "paused" and "does not exist" in (status["error"] or ""), status
    again = setl.start_until_caught_up()  # a paused pipeline waits for `setl resume`
    assert again.returncode == 1 and f"setl resume --pipeline {setl.name}" in again.stderr, again.stderr[-3000:]

    make_table(mariadb_target, mysql_db, "extras")  # create it on the target
    resumed = setl.run("resume", "--pipeline", setl.name)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    started = setl.start_until_caught_up()
    assert started.returncode == 0, started.stderr[-3000:]
    for table in ("items", "extras"):
        assert target_rows(mariadb_target, mysql_db, table) == (
            mariadb_source.query(f"SELECT id, v FROM `{source_db}`.`{table}` ORDER BY id")), table
    assert setl.status()["error"] is None, setl.status()
