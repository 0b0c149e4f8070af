"""`setl verify` knows a table's ``schema_changes`` policy: a column ``ignore_drops`` keeps on the
target is not a difference, and a table whose refused DDL stopped the pipeline is reported as
stopped (never equal), on real servers through a running `setl start`."""

from __future__ import annotations

import contextlib
import re

import pytest

from setl.meta.base import PipelineState, Status
from setl.model import DdlChange, Position, TableName
from setl.routing import Route
from setl.snapshot.reader import TablePlan
from setl.verify.plan import plan_table
from setl.verify.report import Report
from setl.verify.run import schema_refusal
from tests.e2e.setl_process import binlog_head, postgres_target, spawned
from tests.helpers.wait import wait_until
from tests.verify.test_verify import make_setl, verify

pytestmark = pytest.mark.timeout(120)


COPY_T = TableName("copy", "t")


def route(policy: str, target: TableName = COPY_T) -> Route:
    return Route(0, TableName("s", "t"), target, None, frozenset(), {}, None, (), policy)


def test_plan_names_target_only_columns_and_why_without_comparing_them():
    """A target column the source lacks is not compared: under ignore_drops it is named as kept by the
    policy, under another policy as the target's own; the shared columns are compared."""
    source = TablePlan(TableName("s", "t"), ("id", "v"), {"id": "int", "v": "int"}, ("id",), 2)
    types = {"id": "int", "v": "int", "gone": "varchar"}
    kept = plan_table(source, route("ignore_drops"), types, "mysql", pipeline="p")
    assert [c.target for c in kept.columns] == ["id", "v"]
    assert kept.unchecked == {"gone": "kept on the target by schema_changes: ignore_drops (not in the source)"}
    other = plan_table(source, route("apply"), types, "postgresql", pipeline="p")
    assert other.unchecked == {"gone": "only in the target (not in the source)"}


def test_a_refused_table_of_a_paused_pipeline_is_stopped_and_never_equal():
    """A pipeline paused at a DDL its policy refuses marks that table (and no other, and not when
    running) as stopped; a report holding it is not equal and says STOPPED."""
    change = DdlChange("copy", "t", "ALTER TABLE t ADD c INT", Position("log", 5),
                       refused="schema_changes is refuse: it refuses every schema change (rule tables[0])")
    error = str(change.refusal("p", 3, Position("log", 5)))
    paused = PipelineState("p", Status.PAUSED, error)
    why = schema_refusal(paused, route("refuse"))
    assert why is not None and why.endswith(error) and "policy (refuse)" in why
    assert schema_refusal(paused, route("refuse", TableName("copy", "u"))) is None
    assert schema_refusal(PipelineState("p", Status.RUNNING, error), route("refuse")) is None
    assert schema_refusal(PipelineState("p", Status.PAUSED, "pipeline=p stage=load table=copy.t: other"),
                          route("refuse")) is None
    report = Report("p", stopped={"s.t": why})
    assert not report.equal and report.lines()[0] == f"s.t: STOPPED, {why}"
    assert report.to_dict()["stopped"] == [{"source": "s.t", "why": why}]


@pytest.mark.parametrize("target_kind", ["mariadb", "postgresql"])
def test_verify_follows_ignore_drops_and_reports_a_refused_table_as_stopped(tmp_path, request, mariadb_source,
                                                                           source_db, target_kind):
    """A column the source dropped and ignore_drops kept (holding its old values, the default for a new
    row) is not compared and the table verifies equal; after a DDL the refuse policy stops, that table
    verifies as stopped (exit 1), naming policy and statement; into MariaDB and into PostgreSQL."""
    if target_kind == "mariadb":
        server, database = request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db")
        target = {"type": "mysql", "host": server.host, "port": server.port, "user": server.user,
                  "password": server.password}
        schema, server_id = database, 2207

        def target_rows(sql: str) -> list:
            return server.query(sql)
    else:
        server, database = request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db")
        target, schema, server_id = postgres_target(server, database), "app", 2208

        def target_rows(sql: str) -> list:
            return server.query(sql, dbname=database)

    conn = mariadb_source.connect(database=source_db)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE TABLE kept (id INT PRIMARY KEY, gone VARCHAR(10) DEFAULT 'dflt', v INT)")
        cur.execute("CREATE TABLE locked (id INT PRIMARY KEY, v INT)")
        cur.executemany("INSERT INTO kept VALUES (%s, %s, %s)", [(n, f"g{n}", n) for n in range(1, 21)])
        cur.executemany("INSERT INTO locked VALUES (%s, %s)", [(n, n) for n in range(1, 21)])
    db = re.escape(source_db)
    rules = [{"source": rf"{db}\.kept", "target": f"{schema}.{{table}}", "schema_changes": "ignore_drops"},
             {"source": rf"{db}\.locked", "target": f"{schema}.{{table}}", "schema_changes": "refuse"}]
    setl = make_setl(tmp_path, mariadb_source, source_db, target, "", server_id=server_id, tables=rules)
    with spawned(setl) as proc:
        wait_until(lambda: (setl.status()["snapshot"] or [{}])[0].get("status") == "done"
                   and all(c["status"] == "done" for c in setl.status()["snapshot"]), timeout=60, interval=0.3,
                   message=lambda: setl.logs()[-2000:])
        mariadb_source.query(f"ALTER TABLE `{source_db}`.kept DROP COLUMN gone")
        mariadb_source.query(f"INSERT INTO `{source_db}`.kept VALUES (21, 21)")
        mariadb_source.query(f"UPDATE `{source_db}`.kept SET v = 0 WHERE id = 1")
        head = binlog_head(mariadb_source)

        def caught_up() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            ack = setl.acked()
            return ack is not None and ack.position >= head

        wait_until(caught_up, timeout=60, interval=0.2, message=lambda: setl.logs()[-2000:])
        assert target_rows(f"SELECT id, gone, v FROM {schema}.kept WHERE id IN (1, 2, 21) ORDER BY id") \
            == [(1, "g1", 0), (2, "g2", 2), (21, "dflt", 21)]
        code, report = verify(setl, "--table", f"{source_db}.kept")
        assert code == 0, report
        (table,) = report["tables"]
        assert table["equal"] and table["rows"] == 21
        assert table["unchecked_columns"] == {
            "gone": "kept on the target by schema_changes: ignore_drops (not in the source)"}

        mariadb_source.query(f"ALTER TABLE `{source_db}`.locked ADD COLUMN n INT NULL")
        wait_until(lambda: setl.status()["status"] == "paused", timeout=60, interval=0.3,
                   message=lambda: setl.logs()[-2000:])
        code, report = verify(setl, "--table", f"{source_db}.locked")
        assert code == 1 and report["tables"] == [] and not report["equal"], report
        (stopped,) = report["stopped"]
        assert stopped["source"] == f"{source_db}.locked"
        assert "schema_changes is refuse" in stopped["why"] and "ADD COLUMN n INT NULL" in stopped["why"]
