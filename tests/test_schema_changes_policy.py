"""The ``schema_changes`` policy on the DDL model (`setl.ddl.policy`), its configuration (pipeline
default, per-table override, the errors), the routing's decision on every routed DDL, and every
target stopping at a statement its table's policy refuses."""

from __future__ import annotations

import textwrap

import pytest

from setl.config import TableRule, load_pipeline
from setl.connectors import registry
from setl.ddl import parse
from setl.ddl.policy import POLICIES, decide, dropped_columns, not_additive
from setl.errors import ConfigError, TableRefused
from setl.model import Batch, DdlChange, Position
from setl.routing import RoutingPlan
from setl.sinks.parquet import ParquetLoad
from setl.sinks.sqlite import SqliteLoad
from setl.stages import TableExtract

ADDITIVE = [
    "CREATE TABLE s.t (id INT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS s.t (id INT PRIMARY KEY)",
    "CREATE INDEX i ON s.t (a)",
    "ALTER TABLE s.t ADD COLUMN c INT",
    "ALTER TABLE s.t ADD COLUMN IF NOT EXISTS c INT NOT NULL DEFAULT 0 AFTER a, ALGORITHM=INPLACE, LOCK=NONE",
    "ALTER TABLE s.t ADD (a INT NULL, b VARCHAR(3) DEFAULT 'x')",
    "ALTER TABLE s.t ADD INDEX i (a), ADD KEY j (b), ADD FULLTEXT f (c)",
    "ALTER TABLE s.t ADD COLUMN g INT AS (a + 1)",
]
NOT_ADDITIVE = [
    ("CREATE OR REPLACE TABLE s.t (id INT PRIMARY KEY)", "CREATE OR REPLACE drops the table"),
    ("CREATE UNIQUE INDEX i ON s.t (a)", "a UNIQUE index constrains the rows"),
    ("ALTER TABLE s.t ADD COLUMN c INT NOT NULL", "ADD COLUMN c is NOT NULL without a DEFAULT"),
    ("ALTER TABLE s.t ADD COLUMN c INT AUTO_INCREMENT", "ADD COLUMN c makes a key"),
    ("ALTER TABLE s.t ADD COLUMN c INT PRIMARY KEY", "ADD COLUMN c makes a key"),
    ("ALTER TABLE s.t ADD UNIQUE KEY u (a)", "ADD UNIQUE is not a plain column or index"),
    ("ALTER TABLE s.t ADD CONSTRAINT c CHECK (a > 0)", "ADD CONSTRAINT is not"),
    ("ALTER TABLE s.t ADD COLUMN c INT, DROP COLUMN d", "DROP is not an addition"),
    ("ALTER TABLE s.t MODIFY a BIGINT", "MODIFY is not an addition"),
    ("ALTER TABLE s.t CHANGE a b INT", "CHANGE is not an addition"),
    ("ALTER TABLE s.t ALTER COLUMN a SET DEFAULT 3", "ALTER is not an addition"),
    ("ALTER TABLE s.t RENAME COLUMN a TO b", "RENAME is not an addition"),
    ("ALTER TABLE s.t ENGINE=InnoDB", "ENGINE is not an addition"),
    ("DROP TABLE s.t", "DROP TABLE is not an addition"),
    ("RENAME TABLE s.t TO s.u", "RENAME TABLE is not an addition"),
    ("DROP INDEX i ON s.t", "additive_only: DROP INDEX is not an addition"),
]


@pytest.mark.parametrize("statement", ADDITIVE)
def test_additions_apply_under_additive_only(statement):
    """Each addition applies unchanged under additive_only, and is refused under refuse."""
    parsed = parse(statement)
    assert not_additive(parsed) is None
    assert decide("additive_only", parsed).statement == parsed and decide("additive_only", parsed).refused is None
    assert decide("refuse", parsed).refused == "schema_changes is refuse: it refuses every schema change"


@pytest.mark.parametrize(("statement", "why"), NOT_ADDITIVE)
def test_other_changes_are_refused_under_additive_only_naming_why(statement, why):
    """Each non-addition is refused under additive_only with the reason, and applies unchanged under apply."""
    decision = decide("additive_only", parse(statement))
    assert decision.refused is not None and decision.refused.startswith("schema_changes is additive_only: ")
    assert why in decision.refused
    assert decide("apply", parse(statement)).statement == parse(statement)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("statement", ["TRUNCATE TABLE s.t", "TRUNCATE s.t", "GRANT SELECT ON s.* TO u"])
def test_truncate_and_non_table_statements_pass_every_policy(policy, statement):
    """A TRUNCATE (data, not schema) and a statement that is no table DDL pass under every policy."""
    decision = decide(policy, parse(statement))
    assert decision.refused is None and decision.statement == parse(statement) and decision.kept == ()


@pytest.mark.parametrize(("statement", "left", "kept"), [
    ("ALTER TABLE `s`.`t` DROP COLUMN c", None, ("c",)),
    ("ALTER TABLE `s`.`t` DROP c, DROP COLUMN IF EXISTS `d`", None, ("c", "d")),
    ("ALTER TABLE `s`.`t` DROP COLUMN c, ADD COLUMN e INT NULL AFTER a",
     "ALTER TABLE `s`.`t` ADD COLUMN e INT NULL AFTER a", ("c",)),
    ("ALTER TABLE `s`.`t` ADD COLUMN e INT, DROP c, DROP INDEX i", "ALTER TABLE `s`.`t` ADD COLUMN e INT, DROP INDEX i",
     ("c",)),
    ("ALTER TABLE `s`.`t` DROP INDEX i, DROP PRIMARY KEY, DROP FOREIGN KEY f, DROP CONSTRAINT k",
     "ALTER TABLE `s`.`t` DROP INDEX i, DROP PRIMARY KEY, DROP FOREIGN KEY f, DROP CONSTRAINT k", ()),
    ("DROP TABLE `s`.`t`", "DROP TABLE `s`.`t`", ()),
    ("ALTER TABLE `s`.`t` MODIFY a BIGINT", "ALTER TABLE `s`.`t` MODIFY a BIGINT", ()),
])
def test_ignore_drops_cuts_column_drops_only(statement, left, kept):
    """ignore_drops cuts an ALTER's DROP [COLUMN] clauses (nothing left: None) and applies the rest and every
    other statement as they are; an index, key or constraint drop is not a column drop."""
    decision = decide("ignore_drops", parse(statement))
    assert decision.refused is None
    assert (decision.statement.text if decision.statement is not None else None) == left
    assert decision.kept == kept == dropped_columns(parse(statement))


def test_ignore_drops_refuses_a_drop_and_re_add_of_one_column():
    """A statement dropping a column and naming it again (re-adding it) is refused under ignore_drops."""
    decision = decide("ignore_drops", parse("ALTER TABLE s.t DROP COLUMN c, ADD COLUMN c INT"))
    assert decision.refused == ("schema_changes is ignore_drops: the statement drops and names again column(s) c "
                                "(a re-added column cannot be kept)")


def test_an_unknown_policy_is_a_value_error():
    """decide refuses a policy name it does not know."""
    with pytest.raises(ValueError, match="unknown schema_changes policy 'drop'"):
        decide("drop", parse("ALTER TABLE s.t DROP c"))


def ddl_batch(*changes) -> Batch:
    return Batch("p", 3, 1, Position("log", 0), Position("log", 10), tuple(changes))


def test_routing_decides_once_with_the_rule_or_the_pipeline_default():
    """A rule's schema_changes wins, a rule without one takes the pipeline's; Extract marks a refused
    DDL (the target's name, the rule named) and cuts an ignored drop, logging it."""
    rules = [TableRule(source=r"shop\.locked", target="copy.{table}", schema_changes="refuse"),
             TableRule(source=r"shop\..*", target="copy.{table}")]
    plan = RoutingPlan.compile(rules, pipeline="p", schema_changes="ignore_drops")
    assert plan.route("shop", "locked").schema_changes == "refuse"
    assert plan.route("shop", "open").schema_changes == "ignore_drops"
    assert RoutingPlan.compile(rules, pipeline="p").route("shop", "open").schema_changes == "apply"
    out = TableExtract(plan=plan, pipeline="p").extract(ddl_batch(
        DdlChange("shop", "locked", "ALTER TABLE locked ADD COLUMN c INT"),
        DdlChange("shop", "open", "ALTER TABLE open DROP COLUMN c"),
        DdlChange("shop", "open", "ALTER TABLE open DROP COLUMN c, ADD d INT"),
        DdlChange("shop", "open", "RENAME TABLE open TO locked2, locked TO open2"),
    ))
    refused, kept, renamed = out.changes
    assert (refused.schema, refused.table, refused.refused) == (
        "copy", "locked", "schema_changes is refuse: it refuses every schema change (rule tables[0])")
    assert refused.statement == "ALTER TABLE `copy`.`locked` ADD COLUMN c INT"
    assert kept.statement == "ALTER TABLE `copy`.`open` ADD d INT" and kept.refused is None
    assert renamed.refused is not None and "rule tables[0]" in renamed.refused  # the strictest of both tables


@pytest.mark.parametrize("make", ["parquet", "sqlite"])
def test_every_target_stops_at_a_refused_ddl(tmp_path, make):
    """The Parquet and SQLite targets raise TableRefused at a refused DDL, naming pipeline, table,
    position and the policy, as the SQL targets do."""
    load = (ParquetLoad(tmp_path / "out", pipeline="p") if make == "parquet"
            else SqliteLoad(tmp_path / "t.db", pipeline="p"))
    load.open()
    try:
        change = DdlChange("copy", "t", "ALTER TABLE t MODIFY a BIGINT", Position("log", 5),
                           refused="schema_changes is additive_only: MODIFY is not an addition (rule tables[2])")
        with pytest.raises(TableRefused) as info:
            load.load(ddl_batch(change))
    finally:
        load.close()
    text = str(info.value)
    assert info.value.context["table"] == "copy.t" and info.value.context["position"] == Position("log", 5)
    assert info.value.context["pipeline"] == "p" and info.value.context["stage"] == "load"
    assert "MODIFY is not an addition (rule tables[2]); not applied: ALTER TABLE t MODIFY a BIGINT" in text
    assert "\n" not in text


def write_conf(root, body: str):
    conf = root / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {root / 'meta.db'}}}\n")
    (conf / "pipelines" / "p.yaml").write_text(textwrap.dedent(f"""\
        source: {{type: file, path: {root / 's.jsonl'}, follow: false}}
        target: {{type: sqlite, path: {root / 't.db'}}}
        """) + textwrap.dedent(body))
    return conf


def test_policies_load_from_the_pipeline_and_the_table_rules(tmp_path):
    """pipeline.schema_changes is every rule's default; a rule's schema_changes overrides it."""
    conf = write_conf(tmp_path, """\
        tables:
          - {source: 'a\\..*', schema_changes: refuse}
          - {source: '.*'}
        pipeline: {schema_changes: additive_only}
        """)
    config = load_pipeline(conf, "p", registry())
    assert config.pipeline.schema_changes == "additive_only"
    assert [r.schema_changes for r in config.tables] == ["refuse", None]


@pytest.mark.parametrize(("body", "expected"), [
    ("pipeline: {schema_changes: drop}\n",
     "pipeline.schema_changes: expected one of apply, ignore_drops, additive_only, refuse, got 'drop'"),
    ("tables: [{source: '.*', schema_changes: 3}]\n", "tables[0].schema_changes: expected one of"),
    ("tables: [{source: 'x\\..*', exclude: true, schema_changes: refuse}]\n",
     "tables[0].schema_changes: an excluded table has no schema changes to decide"),
    ("pipeline: {ddl: skip, schema_changes: refuse}\n",
     "pipeline.schema_changes: refuse decides which DDL is applied, but pipeline.ddl is skip"),
    ("tables: [{source: '.*', schema_changes: ignore_drops}]\npipeline: {ddl: fail}\n",
     "tables[0].schema_changes: ignore_drops decides which DDL is applied, but pipeline.ddl is fail"),
])
def test_config_errors_name_the_file_and_key(tmp_path, body, expected):
    """A wrong policy name, a policy on an excluded rule, or a policy with pipeline.ddl other than apply
    is a ConfigError naming the file and the key path."""
    conf = write_conf(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_pipeline(conf, "p", registry())
    assert str(info.value).startswith(f"{conf / 'pipelines' / 'p.yaml'}: ")
    assert expected in str(info.value)
