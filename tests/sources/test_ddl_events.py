"""The binlog source's DDL unit (setl.sources.mysql_binlog.ddl_events): each statement parsed once,
and that one model carried through routing, load planning and the PostgreSQL rendering."""

from __future__ import annotations

import attrs
import pytest

import setl.ddl.parser
from setl.config import TableRule
from setl.ddl import parse
from setl.model import Batch, DdlChange, Position
from setl.sinks.postgresql_ddl import Translator, without_sequence_ddl
from setl.sinks.sql_segments import DdlStep, SegmentPlanner
from setl.sources.mysql_binlog.ddl_events import DdlEvents, KnownTables
from setl.stages.extract import TableExtract

END = Position("mysql-bin.000001", 500)


@pytest.fixture
def tokenized(monkeypatch):
    """The statements the DDL parser tokenizes, in order."""
    seen: list[str] = []
    original = setl.ddl.parser.tokenize

    def counting(statement: str):
        seen.append(statement)
        return original(statement)

    monkeypatch.setattr(setl.ddl.parser, "tokenize", counting)
    return seen


def test_a_ddl_is_parsed_once_from_the_source_to_the_postgresql_rendering(tokenized):
    """A source DDL is tokenized once; routing, default removal, planning and PostgreSQL rendering read its model."""
    events = DdlEvents()
    statement = "ALTER TABLE orders ADD COLUMN note TEXT DEFAULT NEXT VALUE FOR s, MODIFY qty INT NOT NULL"
    read = events.read(statement, "shop")
    (change,) = events.changes(read, "shop", END, None)
    assert change.ddl is read.model and (change.schema, change.table) == ("shop", "orders")
    extract = TableExtract([TableRule(source=r"shop\.orders", target="copy.purchases", rename={"note": "remark"})])
    batch = without_sequence_ddl(extract.extract(Batch("p", 1, 1, END, END, (change,))), "p")
    (step,) = SegmentPlanner("p", "apply", lambda batch, table=None: {}).segments(batch)
    assert isinstance(step, DdlStep) and step.statement is step.change.ddl
    assert step.change.statement == "ALTER TABLE `copy`.`purchases` ADD COLUMN `remark` TEXT, MODIFY qty INT NOT NULL"
    assert Translator("copy").translate(step.statement) == [
        'ALTER TABLE "copy"."purchases" ADD COLUMN "remark" text, ALTER COLUMN "qty" TYPE integer USING '
        '"qty"::integer, ALTER COLUMN "qty" SET NOT NULL, ALTER COLUMN "qty" DROP DEFAULT']
    assert tokenized == [statement]


def test_a_change_cannot_carry_the_model_of_another_statement():
    """A DdlChange whose statement is replaced without its model is refused; with_ddl replaces both."""
    change = DdlChange("s", "t", "CREATE TABLE t (a INT)", END)
    with pytest.raises(ValueError, match="model is of another statement"):
        attrs.evolve(change, statement="DROP TABLE t")
    dropped = change.with_ddl(parse("DROP TABLE t"))
    assert (dropped.statement, dropped.ddl.kind) == ("DROP TABLE t", "drop_table")


def test_drop_database_becomes_one_drop_per_known_table_each_with_its_model():
    """DROP DATABASE hands on one DROP TABLE per table the schema held (as tracked from the binlog), each modelled."""
    events = DdlEvents(KnownTables([("shop", "a")]))
    for statement in ("CREATE TABLE b (id INT)", "RENAME TABLE a TO c", "CREATE SEQUENCE s"):
        events.changes(events.read(statement, "shop"), "shop", END, None)
    changes = events.changes(events.read("DROP DATABASE shop", "shop"), "shop", END, None)
    assert [(c.table, c.ddl.kind, [r.table for r in c.ddl.tables]) for c in changes] == [
        ("b", "drop_table", ["b"]), ("c", "drop_table", ["c"]), ("s", "drop_table", ["s"])]


def test_the_source_session_sql_mode_rides_on_the_change():
    """A standalone DDL carries the names of its session's sql_mode bits, as the source names them."""
    events = DdlEvents()
    events.mode_names = lambda bits: "STRICT_TRANS_TABLES" if bits == 4194304 else None
    (change,) = events.changes(events.read("TRUNCATE t", "shop"), "shop", END, 4194304)
    assert (change.sql_mode, change.ddl.kind) == ("STRICT_TRANS_TABLES", "truncate_table")
