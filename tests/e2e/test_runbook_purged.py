"""The runbook's fix for a purged binlog (docs/runbook.md, "Purged binlog"), performed as an operator
would from the error line: truncate the target tables, set `source.start: snapshot`, `setl position
reset --start`, start (`setl resume` first if paused); the target ends equal to the source, and
`setl status` stops showing the error once the position is reset."""

from __future__ import annotations

import pytest

from setl.testing.servers import wait_until
from tests.e2e.setl_process import binlog_head, mysql_target
from tests.e2e.test_bad_input import ROWS, error_line, insert_rows, make_table, pipeline_for, target_rows

pytestmark = pytest.mark.timeout(300)


def test_a_purged_position_is_rebuilt_by_the_runbook_commands(tmp_path, mariadb_factory, mariadb_target,
                                                               mysql_db) -> None:
    """Inserts, an update and a delete lost with a purged binlog file: following the runbook's four
    steps from the error line brings the target equal to the source (the deleted row gone too)."""
    source = mariadb_factory(server_id=9)
    make_table(source, "shop", log_bin=False)
    make_table(mariadb_target, mysql_db)
    insert_rows(source, "shop", 1)
    setl = pipeline_for(tmp_path, source, "shop", mysql_target(mariadb_target), mysql_db)
    first = setl.start_until_caught_up()
    assert first.returncode == 0, first.stderr[-3000:]
    assert len(target_rows(mariadb_target, mysql_db)) == ROWS

    source.query("FLUSH BINARY LOGS")
    insert_rows(source, "shop", ROWS + 1)  # lost with the purged file, with the changes below
    source.query("UPDATE shop.items SET v = 'changed' WHERE id = 3")
    source.query("DELETE FROM shop.items WHERE id = 2")
    source.query("FLUSH BINARY LOGS")
    insert_rows(source, "shop", 2 * ROWS + 1)
    newest = binlog_head(source).log

    def purged() -> bool:
        source.query(f"PURGE BINARY LOGS TO '{newest}'")
        return source.query("SHOW BINARY LOGS")[0][0] == newest

    wait_until(purged, timeout=30, interval=0.2, message=f"the binlogs before {newest} to be purged")
    line = error_line(setl.start_until_caught_up())
    assert f"was purged from the server; the oldest available is {newest}:4" in line, line
    command = f"setl position reset --pipeline {setl.name} --start"
    assert "truncate them on the target, set source.start: snapshot" in line and f"`{command}`" in line, line
    assert "was purged" in (setl.status()["error"] or ""), setl.status()

    mariadb_target.query(f"TRUNCATE TABLE `{mysql_db}`.items")  # 1. the target tables
    setl.config["source"]["start"] = "snapshot"  # 2.
    setl.write_config()
    reset = setl.run(*command.split()[1:])  # 3.
    assert reset.returncode == 0, reset.stderr
    status = setl.status()
    assert status["error"] is None, status
    if status["status"] == "paused":  # 4.
        assert setl.run("resume", "--pipeline", setl.name).returncode == 0
    started = setl.start_until_caught_up()
    assert started.returncode == 0, started.stderr[-3000:]
    rows = target_rows(mariadb_target, mysql_db)
    assert rows == source.query("SELECT id, v FROM shop.items ORDER BY id"), rows
    assert len(rows) == 3 * ROWS - 1 and (3, "changed") in rows and 2 not in [r[0] for r in rows]
    assert setl.status()["error"] is None, setl.status()
