"""The runbook's fix for rows logged as statements (docs/runbook.md, "Rows logged as statements"),
performed as an operator would: the error line gives the commands, and following them ends with a
target equal to the source; `setl status` stops showing the error once the position is reset."""

from __future__ import annotations

import re

import pytest

from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target
from tests.e2e.test_bad_input import error_line

pytestmark = pytest.mark.timeout(300)


def test_rows_logged_as_statements_are_passed_and_copied_again_by_the_commands_the_error_gives(
        tmp_path, mariadb_source, source_db, mariadb_target, mysql_db) -> None:
    """Statement-logged INSERT and UPDATE (a session with binlog_format=STATEMENT) in one
    transaction with a row-logged change of another table: the pipeline pauses at the transaction's
    end naming both tables; `setl position reset --to`, `setl snapshot --table` for each table it
    names and `setl resume`, as the line says, bring the target level with the source."""
    conn = mariadb_source.connect(database=source_db)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
        cur.execute("CREATE TABLE u (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=MyISAM")
        cur.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, start="snapshot"),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\.(t|u)", "target": f"{mysql_db}.{{table}}"}])
    first = setl.start_until_caught_up()
    assert first.returncode == 0, first.stderr[-3000:]
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = STATEMENT")
        cur.execute("BEGIN")
        cur.execute("INSERT INTO u VALUES (7, 'myisam')")  # MyISAM: logged apart from the InnoDB statement
        cur.execute("INSERT INTO t VALUES (3, 'statement')")
        cur.execute("UPDATE t SET v = 'changed' WHERE id = 1")
        cur.execute("COMMIT")
        cur.execute("SET SESSION binlog_format = ROW")
        cur.execute("INSERT INTO t VALUES (4, 'row')")
    conn.close()
    for _ in range(4):  # each refused transaction once; bounded
        result = setl.start_until_caught_up()
        if result.returncode == 0:
            break
        line = error_line(result)
        assert "logged as a statement" in line and "SET GLOBAL binlog_format=ROW" in line
        commands = re.findall(r"`(setl [^`]+)`", line)
        assert [c.split()[1] for c in commands] == ["position", "snapshot", "resume"], line
        reset, snapshot, _ = commands
        to = reset.split("--to ")[1]
        done = setl.run("position", "reset", "--pipeline", setl.name, "--to", to)
        assert done.returncode == 0, done.stderr
        row = setl.status()
        assert row["error"] is None and row["status"] == "paused", row  # the old error no longer shown
        tables = snapshot.split("--table ")[1:]
        assert tables and all(name.strip().startswith(f"{source_db}.") for name in tables)
        requested = setl.run("snapshot", "--pipeline", setl.name, *[a for name in tables
                                                                   for a in ("--table", name.strip())])
        assert requested.returncode == 0, requested.stderr
        assert setl.run("resume", "--pipeline", setl.name).returncode == 0
    else:
        pytest.fail("the pipeline did not catch up after following the fix four times")
    for table in ("t", "u"):
        assert mariadb_target.query(f"SELECT id, v FROM `{mysql_db}`.{table} ORDER BY id") == \
            mariadb_source.query(f"SELECT id, v FROM `{source_db}`.{table} ORDER BY id"), table
