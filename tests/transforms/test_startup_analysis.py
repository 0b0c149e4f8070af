"""Transform steps analysed at startup against the source tables' columns (issue 13.7)."""

from __future__ import annotations

import time

import pytest

from setl.model import TableName
from setl.sources.mysql_binlog import MysqlBinlogSource
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, spawned

BAD_STEPS = [
    {"use": "filter", "condition": "no_such_column > 1"},
    {"use": "add_column", "name": "x", "expr": "no_such_function(id)"},
    {"use": "sql", "query": "SELECT *, FROM batch"},
]


def _source(server, db: str) -> dict:
    """The test's source table with two rows; returns the `start` before them (the shared server's binlog
    holds every earlier test's events, which this test's pipeline must not replay)."""
    head = binlog_head(server)
    server.query(f"CREATE TABLE `{db}`.orders (id INT PRIMARY KEY, amount DECIMAL(12,2) NOT NULL, "
                 "note VARCHAR(20), created DATETIME, secret TEXT)")
    server.query(f"INSERT INTO `{db}`.orders VALUES (1, 5.50, 'a', '2020-01-01 00:00:00', 's'), "
                 "(2, 0.25, 'b', NULL, 't')")
    return {"file": head.log, "pos": head.offset}


def _setl(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db, steps, *, start: dict,
          **rule) -> SetlProcess:
    return SetlProcess(tmp_path, source=mysql_source(mariadb_source, start=start),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}",
                                "transforms": steps, **rule}])


def test_binlog_source_describes_the_selected_tables(mariadb_source, source_db):
    """describe() lists only the selected tables, with columns in order, MySQL types, nullability and key."""
    _source(mariadb_source, source_db)
    mariadb_source.query(f"CREATE TABLE `{source_db}`.other (k INT PRIMARY KEY)")
    source = MysqlBinlogSource(host=mariadb_source.host, port=mariadb_source.port, user=mariadb_source.user,
                               password=mariadb_source.password,
                               selects=lambda schema, table: schema == source_db and table == "orders")
    described = source.describe()
    assert [t.table for t in described] == [TableName(source_db, "orders")]
    orders = described[0]
    assert orders.names == ("id", "amount", "note", "created", "secret")
    assert orders.primary_key == ("id",)
    assert [(c.type, c.nullable) for c in orders.columns][:3] == [("int(11)", False), ("decimal(12,2)", False),
                                                                   ("varchar(20)", True)]


@pytest.mark.parametrize("bad", BAD_STEPS, ids=[step["use"] for step in BAD_STEPS])
def test_a_bad_step_fails_setl_start_before_anything_is_read(tmp_path, mariadb_source, source_db, mariadb_target,
                                                               mysql_db, bad):
    """A step Spark SQL rejects makes `setl start` exit 2 at startup in one line; the target is untouched."""
    start = _source(mariadb_source, source_db)
    setl = _setl(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db,
                 [{"use": "rename", "columns": {"note": "remark"}}, bad], start=start)
    result = setl.start_until_caught_up(timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("setl: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    line = errors[0]
    assert len(line) < 1000 and "org.apache" not in line, line
    assert f"pipeline={setl.name}" in line and f"table={mysql_db}.orders" in line
    assert f"plugin={bad['use']}" in line and f"step 2 ({bad['use']}) cannot run on the columns" in line
    assert "org.apache" not in result.stderr and "Traceback" not in result.stderr
    assert mariadb_target.query("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
                                (mysql_db,))[0][0] == 0
    assert setl.acked() is None


def test_a_step_sees_the_columns_after_extract_renames_and_filters(tmp_path, mariadb_source, source_db,
                                                                   mariadb_target, mysql_db):
    """The startup analysis sees Extract's renames and column filters: a step on a dropped column fails."""
    start = _source(mariadb_source, source_db)
    setl = _setl(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db,
                 [{"use": "filter", "condition": "secret IS NOT NULL"}], start=start,
                 columns={"exclude": ["secret"]})
    result = setl.start_until_caught_up(timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "step 1 (filter) cannot run on the columns" in result.stderr
    assert setl.acked() is None


def test_a_good_chain_starts_and_replicates(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    """A chain Spark SQL accepts (on renamed, typed columns) passes the startup analysis and replicates."""
    start = _source(mariadb_source, source_db)
    steps = [{"use": "filter", "condition": "cost > 1"},
             {"use": "add_column", "name": "note", "expr": "upper(note)"},
             {"use": "sql", "query": "SELECT * FROM batch WHERE to_date(created) IS NOT NULL OR _setl_op = 'delete'"}]
    setl = _setl(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db, steps, start=start,
                 rename={"amount": "cost"}, columns={"exclude": ["secret"]})
    result = setl.start_until_caught_up(timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = mariadb_target.query(f"SELECT id, cost, note FROM `{mysql_db}`.orders ORDER BY id")
    assert [(r[0], str(r[1]), r[2]) for r in rows] == [(1, "5.50", "A")]
    assert setl.acked() is not None


def test_a_table_created_later_gets_the_first_batch_analysis(tmp_path, mariadb_source, source_db, mariadb_target,
                                                            mysql_db):
    """A table created after startup is analysed at its first batch: the pipeline pauses with one line."""
    start = _source(mariadb_source, source_db)
    setl = _setl(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db,
                 [{"use": "filter", "condition": "amount > 1"}], start=start)
    with spawned(setl):
        deadline = time.monotonic() + 240
        while setl.acked() is None:
            assert time.monotonic() < deadline, setl.logs()[-3000:]
            time.sleep(0.5)
        mariadb_source.query(f"CREATE TABLE `{source_db}`.late (id INT PRIMARY KEY, price INT)")
        mariadb_source.query(f"INSERT INTO `{source_db}`.late VALUES (1, 2)")
        deadline = time.monotonic() + 120
        while "cannot run on the table's columns" not in (setl.status().get("error") or ""):
            assert time.monotonic() < deadline, setl.logs()[-3000:]
            time.sleep(0.5)
    error = setl.status()["error"]
    assert "\n" not in error and len(error) < 1000 and "org.apache" not in error
    assert f"table={mysql_db}.late" in error and "plugin=filter" in error
    assert mariadb_target.query(f"SELECT id FROM `{mysql_db}`.orders") == [(1,)]


def test_debug_shows_the_java_cause(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    """With --debug the startup analysis error keeps Spark's cause, Java classes and all."""
    start = _source(mariadb_source, source_db)
    setl = _setl(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db, [BAD_STEPS[0]], start=start)
    result = setl.run("--debug", "start", "--pipeline", setl.name, "--until-caught-up", timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "StartupAnalysisError" in result.stderr and "AnalysisException" in result.stderr
    assert "org.apache" in result.stderr
