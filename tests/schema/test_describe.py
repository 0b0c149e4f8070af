"""The MySQL binlog source describes what target DDL needs (issue 11.6): nullability, defaults,
charset and collation, generated and JSON columns, unsigned and precision."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from setl.model import TableName
from setl.sources.mysql_binlog import MysqlBinlogSource

pytestmark = pytest.mark.timeout(120)


def test_describe_gives_what_ddl_needs(mariadb_source: Any, source_db: str) -> None:
    """Each column's type (members' case kept), NOT NULL, DEFAULT as SQL text, charset, collation,
    generation expression and JSON flag; the key in key order; only the tables the rules select."""
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE d (b VARCHAR(10) NOT NULL, a INT UNSIGNED NOT NULL DEFAULT 7,"
                    " name VARCHAR(20) CHARACTER SET latin1 COLLATE latin1_bin DEFAULT 'it''s',"
                    " price DECIMAL(12,2), kind ENUM('Big','small') NOT NULL DEFAULT 'Big', doc JSON,"
                    " at DATETIME(3) DEFAULT CURRENT_TIMESTAMP(3), twice INT AS (a * 2) VIRTUAL,"
                    " PRIMARY KEY (b, a))")
        cur.execute("CREATE TABLE skipped (id INT PRIMARY KEY)")
    source = MysqlBinlogSource(host=mariadb_source.host, port=mariadb_source.port, user=mariadb_source.user,
                               password=mariadb_source.password, server_id=4099, pipeline="describe",
                               selects=lambda schema, table: schema == source_db and table == "d")
    (table,) = source.describe()
    assert table.table == TableName(source_db, "d")
    assert table.primary_key == ("b", "a")
    cols = {c.name: c for c in table.columns}
    assert list(cols) == ["b", "a", "name", "price", "kind", "doc", "at", "twice"]
    assert (cols["b"].type, cols["b"].nullable, cols["b"].default) == ("varchar(10)", False, None)
    assert (cols["a"].unsigned, cols["a"].default, cols["a"].base) == (True, "7", "int")
    assert (cols["name"].charset, cols["name"].collation, cols["name"].default) == ("latin1", "latin1_bin", "'it''s'")
    assert cols["price"].precision == (12, 2) and cols["price"].nullable and cols["price"].default is None
    assert cols["kind"].type == "enum('Big','small')" and cols["kind"].default == "'Big'"
    assert cols["doc"].json and not cols["name"].json
    assert cols["at"].default == "current_timestamp(3)"
    assert cols["twice"].generated == "`a` * 2" and cols["twice"].default is None
