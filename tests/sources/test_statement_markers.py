"""Which row changes logged as statements the binlog source may hand on as a marker of one table
(`setl.sources.mysql_binlog.statements.StatementJudge`, docs/quarantine.md), and how the marker reads
downstream (`setl.model.DdlChange.logged_rows`)."""

from __future__ import annotations

import pytest

from setl.errors import TableRefused
from setl.model import STATEMENT_LOGGED, DdlChange, Position, TableName
from setl.sources.mysql_binlog.statements import StatementJudge, StatementMarker, one_table_dml, undone

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("statement", "target", "called"), [
    ("UPDATE d.bad SET v = CONCAT(v, 'x') WHERE id > 3", ("d", "bad"), {"concat"}),
    ("INSERT INTO bad (id, v) VALUES (1, 'select * from a')", ("db", "bad"), set()),
    ("REPLACE INTO `x`.`t` VALUES (1, 2)", ("x", "t"), set()),
    ("DELETE FROM t WHERE id IN (1, 2) LIMIT 3", ("db", "t"), set()),
    ("INSERT INTO t VALUES (1, 'a') ON DUPLICATE KEY UPDATE v = VALUES(v)", ("db", "t"), set()),
    ("UPDATE t SET v = f(v)", ("db", "t"), {"f"}),
])
def test_a_statement_writing_one_table_names_it_and_the_functions_it_calls(statement, target, called):
    """A single-table INSERT, REPLACE, UPDATE or DELETE names its table and the functions it calls (for
    the source to ask about stored functions); text inside literals is not read as SQL."""
    assert one_table_dml(statement, "db") == (target, frozenset(called))


@pytest.mark.parametrize("statement", [
    "INSERT INTO t SELECT * FROM u",
    "UPDATE a JOIN b USING (id) SET a.v = b.v",
    "UPDATE a, b SET a.v = b.v WHERE a.id = b.id",
    "DELETE a FROM a JOIN b USING (id)",
    "DELETE FROM a USING a, b WHERE a.id = b.id",
    "UPDATE t SET v = (SELECT MAX(v) FROM u)",
    "DELETE FROM t WHERE id IN (SELECT id FROM u)",
    "INSERT INTO t VALUES (NEXT VALUE FOR s, 1)",
    "INSERT INTO t VALUES (NEXTVAL(s), 1)",
    "LOAD DATA INFILE '/tmp/x' INTO TABLE t",
    "CALL p()",
    "WITH c AS (SELECT 1) UPDATE t SET v = 1",
    "UPDATE t SET v = 1 /* a comment may hide SQL */",
])
def test_a_statement_that_may_name_other_tables_is_not_one_tables(statement):
    """A statement that reads or writes another table (or may: a join, a subquery, a sequence, a
    LOAD, a call, a CTE, a comment) has no single table."""
    assert one_table_dml(statement, "db") is None


def test_the_judge_marks_one_read_table_inside_a_transaction_only():
    """Under markers: one read table inside a transaction with nothing writing elsewhere is a marker;
    outside a transaction, with a trigger, without the source to ask, or without markers it is refused
    (naming why), and a table the rules skip is passed over."""
    asked: list[tuple[str, str, frozenset[str]]] = []

    def writes_elsewhere(schema: str, table: str, called: frozenset[str]) -> str | None:
        asked.append((schema, table, called))
        return "the table has trigger(s) tg" if table == "trig" else None

    judge = StatementJudge(markers=True, writes_elsewhere=writes_elsewhere)
    selects = lambda schema, table: table != "skipped"  # noqa: E731
    text = "UPDATE d.t SET v = 1"
    assert judge.judge(text, "d", selects, True) == StatementMarker("d", "t", text)
    assert asked == [("d", "t", frozenset())]
    assert judge.judge("UPDATE d.skipped SET v = 1", "d", selects, True) is None
    table, shown = judge.judge(text, "d", selects, False)  # type: ignore[misc]
    assert table == "d.t" and "not inside a transaction" in shown, shown
    table, shown = judge.judge("UPDATE trig SET v = 1", "d", selects, True)  # type: ignore[misc]
    assert table == "d.trig" and "trigger(s) tg, which may write other tables" in shown, shown
    table, shown = judge.judge("UPDATE a JOIN b USING (id) SET a.v = 1", "d", selects, True)  # type: ignore[misc]
    assert table is None and "names more than one table" in shown, shown
    table, shown = StatementJudge(markers=True).judge(text, "d", selects, True)  # type: ignore[misc]
    assert "cannot ask the source" in shown, shown
    assert StatementJudge().judge(text, "d", selects, True) == ("d.t", text)


def test_a_rollback_undoes_a_marker_of_a_transactional_table_only():
    """A ROLLBACK undoes what a marker of an InnoDB table stands for, not a MyISAM table's, nor a DDL."""
    transactional = lambda schema, table: table == "innodb"  # noqa: E731
    assert undone(StatementMarker("d", "innodb", "UPDATE innodb SET v = 1"), transactional)
    assert not undone(StatementMarker("d", "myisam", "UPDATE myisam SET v = 1"), transactional)
    assert not undone(object(), transactional)


def test_the_marker_is_refused_by_every_target_with_one_line_naming_a_snapshot():
    """The marker's refusal (raised by every target at it) is one `TableRefused` line that begins as
    the quarantine's cause is recognised, names the statement, the source table and `setl snapshot`."""
    marker = StatementMarker("src", "bad", "UPDATE bad\n SET v = 1").change(Position("mysql-bin.000001", 400, row=3))
    assert marker.logged_rows and marker.refused is not None and marker.ddl.kind == "other"
    routed = DdlChange(**{**{f: getattr(marker, f) for f in ("schema", "table", "statement", "position")},
                          "schema": "dw"}, logged_rows=True, refused=marker.refused, source=TableName("src", "bad"))
    error = routed.refusal("p", 7, marker.position)
    assert isinstance(error, TableRefused) and error.message.startswith(STATEMENT_LOGGED), error.message
    assert "\n" not in str(error) and "UPDATE bad SET v = 1" in error.message, str(error)
    assert "setl snapshot --table src.bad" in error.message and "mysql-bin.000001:400+3" in str(error), str(error)
    assert error.context["table"] == "dw.bad"
