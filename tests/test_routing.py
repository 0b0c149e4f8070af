"""The routing plan: one route per source table, target templates split before substitution."""

from __future__ import annotations

import pytest

from setl.config import ColumnsConfig, TableRule
from setl.errors import ConfigError, ExtractError
from setl.routing import RoutingPlan, TableName, TargetTemplate, flat_name


@pytest.mark.parametrize("template, schema, table", [
    ("{schema}.{table}", "{schema}", "{table}"),
    ("replica.{table}", "replica", "{table}"),
    ("{schema}_copy.{table}", "{schema}_copy", "{table}"),
    ("{table}_v2", "{schema}", "{table}_v2"),
    ("a.b.{table}", "a.b", "{table}"),
    ("{{x.y}}.{table}", "{{x.y}}", "{table}"),
])
def test_target_template_splits_at_the_last_dot_outside_fields(template, schema, table):
    """A target template splits into schema and table templates at its last literal dot."""
    assert TargetTemplate.parse(template) == TargetTemplate(schema, table)


@pytest.mark.parametrize("source", [
    TableName("s", "dot.table"), TableName("s.dot", "table"), TableName("we%ird", "sp ace`tick"),
])
def test_dotted_names_stay_pairs(source):
    """A source table's name, dots and all, lands whole in the target's table part."""
    plan = RoutingPlan.compile([TableRule(source=r".*", target="replica.{table}")])
    assert plan.route(source.schema, source.table).target == TableName("replica", source.table)
    same = RoutingPlan.compile([TableRule(source=r".*")])
    assert same.route(source.schema, source.table).target == source


def test_first_matching_rule_wins_and_routes_are_cached():
    """The first matching rule decides; an excluded table has no route; a lookup is computed once."""
    plan = RoutingPlan.compile([
        TableRule(source=r"s\.tmp_.*", exclude=True),
        TableRule(source=r"s\..*", target="dw.{table}", columns=ColumnsConfig(exclude=("secret",)),
                  rename={"a": "b"}),
        TableRule(source=r".*", target="{schema}_copy.{table}"),
    ])
    assert plan.route("s", "tmp_1") is None
    route = plan.route("s", "t")
    assert route is plan.route("s", "t")
    assert (route.rule_index, route.target) == (1, TableName("dw", "t"))
    assert route.target_columns(["id", "a", "secret"]) == ("id", "b")
    assert route.target_key(["a"]) == ("b",)
    with pytest.raises(ExtractError, match="primary-key column 'secret'"):
        route.target_key(["secret"])
    assert plan.route("x", "t").target == TableName("x_copy", "t")


def test_bad_rules_fail_at_compile_time():
    """A bad regex, filter or target is a ConfigError naming the rule's key, before any row."""
    with pytest.raises(ConfigError, match=r"tables\[0\].source"):
        RoutingPlan.compile([TableRule(source="(")])
    with pytest.raises(ConfigError, match=r"tables\[0\].filter"):
        RoutingPlan.compile([TableRule(source=".*", filter="id >")])
    with pytest.raises(ConfigError, match=r"tables\[0\].target"):
        RoutingPlan.compile([TableRule(source=".*", target="replica.")])


def test_an_excluded_rule_needs_no_target():
    """A rule with exclude: true may leave its target empty: it routes nothing."""
    plan = RoutingPlan.compile([TableRule(source=r"s\.x", target="", exclude=True), TableRule(source=r".*")])
    assert plan.route("s", "x") is None and plan.route("s", "y").target == TableName("s", "y")


@pytest.mark.parametrize("schema, table, flat", [
    ("s", "t", "s.t"), ("s", "dot.table", "s.dot%2Etable"), ("s.dot", "table", "s%2Edot.table"),
    ("s", "per%cent", "s.per%25cent"), ("s", "../up", "s.%2E%2E%2Fup"), ("s", "..", "s.%2E%2E"),
    ("s", "sp ace`", "s.sp ace`"),
])
def test_flat_names_keep_pairs_apart(schema, table, flat):
    """A (schema, table) pair flattened for a one-level namespace never collides and never climbs a path."""
    assert flat_name(schema, table) == flat
