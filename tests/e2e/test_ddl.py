"""DDL end to end: CREATE (also CREATE ... SELECT), ALTER (add, modify, rename, drop column), RENAME,
TRUNCATE and DROP TABLE interleaved with row changes on a real MariaDB, replicated under
``pipeline.ddl: apply`` with the table rules' schema, table and column renames and a left-out column
into MariaDB and PostgreSQL."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest

from setl.config import ColumnsConfig
from setl.errors import LoadError
from setl.model import Batch, DdlChange, Op, Position, RowChange
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(120)

SEQUENCE = [
    "CREATE TABLE orders (id INT NOT NULL PRIMARY KEY, note VARCHAR(20), qty INT) DEFAULT CHARSET=utf8mb4",
    "INSERT INTO orders VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)",
    "ALTER TABLE orders ADD COLUMN code VARCHAR(8) NOT NULL AFTER id, ADD INDEX by_code (code, qty)",
    "ALTER TABLE orders ADD COLUMN price DECIMAL(10,2) NULL AFTER note",
    "UPDATE orders SET price = qty * 1.25",
    "INSERT INTO orders VALUES (4, 'c4', 'four', 4.5, 4)",
    "ALTER TABLE orders MODIFY note VARCHAR(40) NOT NULL",
    "ALTER TABLE orders RENAME COLUMN qty TO quantity",
    "INSERT INTO orders (id, code, note, price, quantity) VALUES (5, 'c5', 'a note longer than twenty', 9.99, 50)",
    "CREATE TABLE secret (id INT PRIMARY KEY, pin INT)",
    "INSERT INTO secret VALUES (1, 1234)",
    "CREATE TABLE items (id INT PRIMARY KEY, v INT)",
    "INSERT INTO items VALUES (1, 10), (2, 20)",
    "RENAME TABLE items TO items_old",
    "INSERT INTO items_old VALUES (3, 30)",
    "TRUNCATE TABLE items_old",
    "INSERT INTO items_old VALUES (4, 40)",
    "CREATE TABLE items_copy SELECT id, v * 2 AS v FROM items_old",
    "CREATE TABLE leftovers (id INT PRIMARY KEY)",
    "DROP TABLE leftovers",
    "DROP TABLE secret",
    "ALTER TABLE orders DROP COLUMN price",
    "DELETE FROM orders WHERE id = 2",
    "UPDATE orders SET note = CONCAT(note, '!') WHERE id = 3",
]
EXPECTED_ORDERS = [(1, "one", 1), (3, "three!", 3), (4, "four", 4), (5, "a note longer than twenty", 50)]


def run_sequence(server: Any, schema: str) -> None:
    with contextlib.closing(server.connect(database=schema)) as conn, conn.cursor() as cur:
        for statement in SEQUENCE:
            cur.execute(statement)


def rules(source_db: str, target_schema: str) -> list:
    """orders -> purchases with note -> remark and without code; secret not replicated; every other
    table kept."""
    return [
        table_rule(rf"{source_db}\.orders", f"{target_schema}.purchases", rename={"note": "remark"},
                   columns=ColumnsConfig(exclude=("code",))),
        table_rule(rf"{source_db}\.secret", "", exclude=True),
        table_rule(rf"{source_db}\..*", f"{target_schema}.{{table}}"),
    ]


def test_ddl_sequence_reaches_mariadb_with_names_mapped(mariadb_source, source_db, mariadb_target, mysql_db,
                                                        tmp_path, caplog):
    """The DDL sequence with rows between reaches MariaDB renamed by the table rules, in order; each
    applied and each skipped DDL is logged with its table and position."""
    caplog.set_level(logging.INFO)
    start = binlog_head(mariadb_source)
    run_sequence(mariadb_source, source_db)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="ddl", position_schema=mysql_db)
    replicate(mariadb_source, start, rules(source_db, mysql_db), load, tmp_path)
    tables = {r[0] for r in mariadb_target.query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (mysql_db,))}
    assert tables == {"purchases", "items_old", "items_copy", "setl_position", "setl_position_ddl",
                      "setl_position_table", "setl_position_fence", "setl_position_session",
                      "setl_position_identity", "setl_position_copy", "setl_position_quarantine",
                      "setl_position_kept"}
    columns = mariadb_target.query(
        "SELECT column_name, column_type, is_nullable FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = 'purchases' ORDER BY ordinal_position", (mysql_db,))
    assert columns == [("id", "int(11)", "NO"), ("remark", "varchar(40)", "NO"), ("quantity", "int(11)", "YES")]
    assert mariadb_target.query(f"SELECT * FROM `{mysql_db}`.purchases ORDER BY id") == EXPECTED_ORDERS
    assert mariadb_target.query(f"SELECT * FROM `{mysql_db}`.items_old") == [(4, 40)]
    assert mariadb_target.query(f"SELECT * FROM `{mysql_db}`.items_copy") == [(4, 80)]
    messages = [r.getMessage() for r in caplog.records]
    applied = [m for m in messages if "DDL applied" in m]
    assert len(applied) == len([s for s in SEQUENCE if not s.startswith(("INSERT", "UPDATE", "DELETE"))
                                and "secret" not in s]), applied
    assert any(f"table={mysql_db}.purchases position=mysql-bin." in m and "RENAME COLUMN" in m for m in applied)
    skipped = [m for m in messages if "DDL skipped" in m]
    assert [m for m in skipped if f"table={source_db}.secret" in m and "CREATE TABLE secret" in m], skipped


def test_ddl_sequence_reaches_postgresql_translated(mariadb_source, source_db, postgres_server, postgres_db,
                                                    tmp_path):
    """The same sequence reaches PostgreSQL translated, renamed by the table rules, in order."""
    start = binlog_head(mariadb_source)
    run_sequence(mariadb_source, source_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="ddl")
    replicate(mariadb_source, start, rules(source_db, "shop"), load, tmp_path)

    def query(sql: str) -> list[tuple[Any, ...]]:
        return postgres_server.query(sql, dbname=postgres_db)

    assert {r[0] for r in query("SELECT tablename FROM pg_tables WHERE schemaname = 'shop'")} == {
        "purchases", "items_old", "items_copy"}
    columns = query("SELECT column_name, data_type, is_nullable FROM information_schema.columns"
                    " WHERE table_schema = 'shop' AND table_name = 'purchases' ORDER BY ordinal_position")
    assert columns == [("id", "integer", "NO"), ("remark", "character varying", "NO"),
                       ("quantity", "integer", "YES")]
    assert query("SELECT * FROM shop.purchases ORDER BY id") == EXPECTED_ORDERS
    assert query("SELECT * FROM shop.items_old") == [(4, 40)]
    assert query("SELECT * FROM shop.items_copy") == [(4, 80)]


def test_ddl_fail_pauses_the_pipeline_naming_the_statement(mariadb_source, source_db, mariadb_target, mysql_db,
                                                           tmp_path):
    """Under ``ddl: fail`` the first DDL pauses the pipeline with an error naming pipeline, stage,
    table, position and the statement as it would have been applied; nothing from it on is applied."""
    start = binlog_head(mariadb_source)
    run_sequence(mariadb_source, source_db)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="strict", position_schema=mysql_db, ddl="fail")
    scheduler = replicate(mariadb_source, start, rules(source_db, mysql_db), load, tmp_path, name="strict",
                          outcome=Outcome.PAUSED)
    error = scheduler.error
    assert isinstance(error, LoadError)
    assert f"CREATE TABLE `{mysql_db}`.`purchases` (id INT NOT NULL PRIMARY KEY, `remark` VARCHAR(20)" in str(error)
    assert error.context["pipeline"] == "strict" and error.context["stage"] == "load"
    assert error.context["table"] == f"{mysql_db}.purchases" and error.context["position"] > start
    assert mariadb_target.query("SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
                                " AND table_name NOT LIKE 'setl%%'", (mysql_db,)) == []


def run(server: Any, schema: str, statements: list[str]) -> None:
    with contextlib.closing(server.connect(database=schema)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def test_add_column_defaults_fill_existing_rows_on_postgresql(mariadb_source, source_db, postgres_server,
                                                              postgres_db, tmp_path):
    """ADD COLUMN with a BIT, hex or charset-introduced default gives existing PostgreSQL rows the
    source's values; an expression default on a table with rows pauses the pipeline with one line
    naming the column, and nothing of that DDL is applied."""
    start = binlog_head(mariadb_source)
    run(mariadb_source, source_db, [
        "CREATE TABLE flags (id INT PRIMARY KEY)",
        "INSERT INTO flags VALUES (1), (2)",
        "ALTER TABLE flags ADD COLUMN b BIT(1) NOT NULL DEFAULT b'1', ADD x VARBINARY(2) DEFAULT x'0aff',"
        " ADD s VARCHAR(3) DEFAULT _utf8mb4'abc', ADD n INT DEFAULT 0x10",
        "INSERT INTO flags (id) VALUES (3)",
        "CREATE TABLE empty_one (id INT PRIMARY KEY)",
        "ALTER TABLE empty_one ADD COLUMN e INT DEFAULT (1+1), ADD t DATETIME DEFAULT CURRENT_TIMESTAMP",
        "ALTER TABLE flags ADD COLUMN e INT DEFAULT (1+1)",
    ])
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="defaults")
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\..*", "app.{table}")], load, tmp_path,
                          name="defaults", outcome=Outcome.PAUSED)
    assert "has rows and column e DEFAULT (1+1) has no PostgreSQL translation" in str(scheduler.error)
    assert "\n" not in str(scheduler.error) and scheduler.error.context["table"] == "app.flags"
    got = postgres_server.query("SELECT id, b, x, s, n FROM app.flags ORDER BY id", dbname=postgres_db)
    assert got == [(i, 1, b"\n\xff", "abc", 16) for i in (1, 2, 3)]
    assert postgres_server.query("SELECT column_name FROM information_schema.columns WHERE table_schema = 'app'"
                                 " AND table_name = 'empty_one' ORDER BY ordinal_position",
                                 dbname=postgres_db) == [("id",), ("e",), ("t",)]


def ddl_batch(batch_id: int, changes: list[Any]) -> Batch:
    """A batch of the changes as Extract hands them on, at made-up positions."""
    return Batch("versioned", batch_id, 1, Position("bin.000001", batch_id * 100),
                 Position("bin.000001", batch_id * 100 + 99), tuple(changes))


def row(schema: str, op: Op, before: dict | None, after: dict | None) -> RowChange:
    return RowChange(op, schema, "hist", ("id",), before, after)


def versioned_batches(schema: str, quoted: str) -> list[Batch]:
    """A system-versioned table with explicit period columns, rows (without the period columns, as the source
    hands them on), an ALTER adding a column and sequence DDL in between."""
    name = f"{quoted}.`hist`"
    return [
        ddl_batch(1, [DdlChange(schema, "hist", f"CREATE TABLE {name} (id INT PRIMARY KEY, v INT WITHOUT SYSTEM "
                                               "VERSIONING, w VARCHAR(5), rs TIMESTAMP(6) GENERATED ALWAYS AS ROW "
                                               "START INVISIBLE, re TIMESTAMP(6) GENERATED ALWAYS AS ROW END "
                                               "INVISIBLE, PERIOD FOR SYSTEM_TIME(rs, re)) WITH SYSTEM VERSIONING")]),
        ddl_batch(2, [row(schema, Op.INSERT, None, {"id": 1, "v": 1, "w": "a"}),
                      row(schema, Op.INSERT, None, {"id": 2, "v": 2, "w": "b"}),
                      DdlChange(schema, "seq", f"CREATE SEQUENCE {quoted}.`seq` START WITH 10"),
                      row(schema, Op.UPDATE, {"id": 1, "v": 1, "w": "a"}, {"id": 1, "v": 5, "w": "a"}),
                      row(schema, Op.DELETE, {"id": 2, "v": 2, "w": "b"}, None)]),
        ddl_batch(3, [DdlChange(schema, "hist", f"ALTER TABLE {name} ADD COLUMN x INT DEFAULT 7"),
                      DdlChange(schema, "seq", f"ALTER SEQUENCE {quoted}.`seq` RESTART 20"),
                      DdlChange(schema, "seq2", f"CREATE TABLE {quoted}.`seq2` (next_not_cached_value bigint NOT "
                                                "NULL, minimum_value bigint NOT NULL, maximum_value bigint NOT NULL, "
                                                "start_value bigint NOT NULL, increment bigint NOT NULL, cache_size "
                                                "bigint unsigned NOT NULL, cycle_option tinyint unsigned NOT NULL, "
                                                "cycle_count bigint NOT NULL) SEQUENCE=1"),
                      row(schema, Op.INSERT, None, {"id": 3, "v": 3, "w": "c", "x": 8}),
                      DdlChange(schema, "seq", f"DROP SEQUENCE {quoted}.`seq`")]),
    ]


def test_system_versioned_tables_and_sequences_on_mariadb(mariadb_target, mysql_db, caplog):
    """A MariaDB target keeps system versioning (setl never writes the period columns) and applies sequence
    DDL (sequences replicate there: tests/e2e/test_sequences.py); the current rows equal the source's."""
    caplog.set_level(logging.INFO)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="versioned", position_schema=mysql_db)
    try:
        for batch in versioned_batches(mysql_db, f"`{mysql_db}`"):
            load.load(batch)
    finally:
        load.close()
    assert mariadb_target.query(f"SELECT id, v, w, x FROM `{mysql_db}`.hist ORDER BY id") == [(1, 5, "a", 7),
                                                                                             (3, 3, "c", 8)]
    assert mariadb_target.query("SELECT table_type FROM information_schema.tables WHERE table_schema = %s"
                                " AND table_name = 'hist'", (mysql_db,)) == [("SYSTEM VERSIONED",)]
    assert mariadb_target.query("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema"
                                " = %s AND table_name LIKE 'seq%%'", (mysql_db,)) == [("seq2", "SEQUENCE")]
    assert not any("sequence DDL is not replicated" in r.getMessage() for r in caplog.records)


def test_system_versioned_tables_and_sequences_on_postgresql(postgres_server, postgres_db, caplog):
    """PostgreSQL gets a system-versioned table without versioning or period columns, holding the current
    rows; sequence DDL is skipped with an INFO line."""
    caplog.set_level(logging.INFO)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="versioned")
    try:
        for batch in versioned_batches("app", "`app`"):
            load.load(batch)
    finally:
        load.close()
    assert postgres_server.query("SELECT * FROM app.hist ORDER BY id", dbname=postgres_db) == [(1, 5, "a", 7),
                                                                                              (3, 3, "c", 8)]
    assert postgres_server.query("SELECT relname FROM pg_class WHERE relname IN ('seq', 'seq2')",
                                 dbname=postgres_db) == []
    assert sum("sequence DDL is not replicated" in r.getMessage() and r.levelname == "INFO"
               for r in caplog.records) == 4
