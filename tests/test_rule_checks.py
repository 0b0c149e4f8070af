"""Start-up checks of the table rules (issue 23, items 4 and 5): a rule matching no source table
warns in `setl start`'s first lines and in `setl schema`; a rule filter reading a column the table
lacks stops `setl start` with exit 2 and one line, before the target table is created or emptied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from setl.config import TableRule
from setl.errors import ConfigError
from setl.model import ColumnSchema, TableName, TableSchema
from setl.pipeline.checks import check_rules, filter_names
from tests.e2e.setl_process import mysql_target
from tests.schema.test_schema import make, q, run_source

pytestmark = pytest.mark.timeout(240)


def test_filter_names_are_the_free_names_of_the_expression():
    assert filter_names("qty > 0 and name.startswith('a')") == {"qty", "name"}
    assert filter_names("any(x > limit for x in [a, b]) or (lambda y: y)(c)") == {"any", "limit", "a", "b", "c"}


def _make_config(rules: list[TableRule]) -> Any:
    class Config:  # the two fields check_rules reads, and the names it reports
        name, file, tables = "p", "", rules
    return Config()


TABLES = [TableSchema(TableName("shop", "orders"), (ColumnSchema("id", "int"), ColumnSchema("qty", "int")), ("id",)),
          TableSchema(TableName("shop", "items"), (ColumnSchema("id", "int"),), ("id",))]


def test_a_rule_matching_no_table_is_a_warning_and_a_filter_reading_a_missing_column_an_error():
    config = _make_config([TableRule(source=r"shop\.orders", target="dw.{table}", filter="qty > 0"),
                           TableRule(source=r"shop\.order_typo", target="dw.{table}"),
                           TableRule(source=r"shop\..*", target="dw.{table}")])
    assert check_rules(config, TABLES) == [
        "tables[1] (source 'shop\\\\.order_typo') matches no source table: it copies and replicates nothing"]
    bad = _make_config([TableRule(source=r"shop\..*", target="dw.{table}", filter="quantity > 0 and len(id) > 0")])
    with pytest.raises(ConfigError) as caught:
        check_rules(bad, TABLES)
    assert "'quantity'" in str(caught.value) and "shop.orders" in str(caught.value) and "tables[0].filter" in str(
        caught.value) and "Python expression" in str(caught.value)


def test_start_stops_on_a_filter_reading_a_missing_column_before_touching_the_target(
        tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any, mysql_db: str) -> None:
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, qty INT)",
                                           "INSERT INTO k VALUES (1, 5), (2, 0)"])
    mariadb_target.query(f"CREATE TABLE {q(mysql_db)}.k (id INT PRIMARY KEY, qty INT)")
    mariadb_target.query(f"INSERT INTO {q(mysql_db)}.k VALUES (9, 9)")
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}", "filter": "quantity > 0"}],
                start="snapshot")
    result = setl.start_until_caught_up(timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("setl: error")]
    assert len(error) == 1 and "'quantity'" in error[0] and f"{source_db}.k" in error[0], result.stderr[-2000:]
    assert mariadb_target.query(f"SELECT * FROM {q(mysql_db)}.k") == [(9, 9)]  # not emptied, not written


def test_a_rule_matching_nothing_is_said_by_start_and_schema(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                             mariadb_target: Any, mysql_db: str) -> None:
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY)"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"},
                 {"source": rf"{source_db}\.typo", "target": f"{mysql_db}.{{table}}"}])
    schema = setl.run("schema", "--pipeline", setl.name)
    assert schema.returncode == 0 and "warning: tables[1]" in schema.stdout and "matches no source table" in \
        schema.stdout, schema.stdout
    result = setl.start_until_caught_up(timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tables[1]" in result.stderr and "matches no source table" in result.stderr
    assert "tables[0]" not in result.stderr.split("matches no source table")[0].splitlines()[-1]
