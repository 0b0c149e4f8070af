"""`verify:` in a pipeline file is checked when the file loads: a table in `verify.tables` that no
rule of the pipeline replicates is a configuration error naming the pipeline, the key and the table."""

from __future__ import annotations

import re
import textwrap

import pytest

from setl.config import ConfigError, load_pipeline, selecting_rule
from setl.connectors import registry
from setl.routing import RoutingPlan
from tests.test_connectors import setl_cli, write_conf

RULES = textwrap.dedent("""\
    tables:
      - {source: 'shop\\.secret', exclude: true}
      - {source: 'shop\\..*'}
      - {source: 'crm\\.people', target: 'c.{table}'}
    """)


def _conf(tmp_path, tables: str):
    return write_conf(tmp_path, "{type: sqlite, path: t.db}",
                      extra=RULES + f"verify: {{every: 6h, tables: {tables}}}\n")


def test_verify_tables_that_rules_select_load(tmp_path):
    """Tables the rules replicate load, with the lag bound's defaults."""
    config = load_pipeline(_conf(tmp_path, "[shop.orders, crm.people]"), "p", registry())
    assert config.verify is not None and config.verify.tables == ("shop.orders", "crm.people")
    assert config.verify.max_lag == 30.0 and config.verify.lag_timeout == "30m" and config.verify.engine == "local"


def test_verify_engine_is_local_or_spark(tmp_path):
    """`verify.engine` takes local or spark; anything else is a config error at its key."""
    conf = write_conf(tmp_path, "{type: sqlite, path: t.db}",
                      extra=RULES + "verify: {every: 6h, engine: spark, max_lag: 5}\n")
    config = load_pipeline(conf, "p", registry())
    assert config.verify is not None and (config.verify.engine, config.verify.max_lag) == ("spark", 5.0)
    (conf / "pipelines" / "p.yaml").write_text((conf / "pipelines" / "p.yaml").read_text().replace("spark", "gpu"))
    with pytest.raises(ConfigError, match="verify.engine"):
        load_pipeline(conf, "p", registry())


@pytest.mark.parametrize(("table", "why"), [
    ("crm.other", "no table rule matches it"),
    ("shop.secret", "rule tables[0] excludes it"),
])
def test_a_verify_table_no_rule_replicates_is_a_config_error(tmp_path, table, why):
    """An unmatched or an excluded table in verify.tables: one line naming the file, pipeline, key and table,
    when the file loads; `setl start` exits 2 with it before connecting to anything."""
    conf = _conf(tmp_path, f"[shop.orders, {table}]")
    with pytest.raises(ConfigError) as info:
        load_pipeline(conf, "p", registry())
    expected = (f"{conf / 'pipelines' / 'p.yaml'}: pipeline=p key=verify.tables[1] table={table}: not replicated "
                f"by this pipeline ({why}), so it cannot be checked")
    assert str(info.value) == expected
    result = setl_cli(conf, "start", "--pipeline", "p")
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("table", ["orders", "shop.", ".orders"])
def test_a_verify_table_not_schema_dot_table_is_a_config_error(tmp_path, table):
    """A verify.tables word lacking a schema or a table is a config error naming the key and the word."""
    with pytest.raises(ConfigError, match=re.escape(f"p.yaml: verify: tables: {table!r} is not SCHEMA.TABLE")):
        load_pipeline(_conf(tmp_path, f"[shop.orders, {table}]"), "p", registry())


def test_selecting_rule_agrees_with_the_routing_plan(tmp_path):
    """The load-time check decides as the routing plan does (first matching rule, exclude rules)."""
    config = load_pipeline(_conf(tmp_path, "[shop.orders]"), "p", registry())
    plan = RoutingPlan.compile(config.tables, pipeline="p")
    for name in ("shop.orders", "shop.secret", "crm.people", "crm.other", "shopx.a"):
        rule = selecting_rule(config.tables, name)
        selected = rule is not None and not config.tables[rule].exclude
        assert selected == plan.selects(*name.split(".", 1)), name
