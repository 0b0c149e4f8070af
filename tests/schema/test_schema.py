"""Target schema creation (issue 11.6): `pipeline.create_tables` and `setl schema` against real
MariaDB and PostgreSQL targets, through renames, excluded columns, several key types, odd names and
a Spark transform that adds a column; an existing table that does not fit is refused before any write."""

from __future__ import annotations

import contextlib
import decimal
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, postgres_target

pytestmark = pytest.mark.timeout(400)

_server_ids = itertools.count(4100 + os.getpid() % 500 * 3)

SOURCE_DDL = [
    # renamed table, renamed and excluded columns, many types, a stored generated column, a secondary index
    "CREATE TABLE items (id INT UNSIGNED NOT NULL PRIMARY KEY,"
    " name VARCHAR(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT 'none',"
    " price DECIMAL(12,2) NULL, secret VARCHAR(10), doc JSON, kind ENUM('A','b') NOT NULL DEFAULT 'A',"
    " made DATETIME(3) NULL, big BIGINT UNSIGNED, raw VARBINARY(8), twice INT AS (id * 2) PERSISTENT,"
    " KEY by_name (name))",
    "CREATE TABLE k_str (code VARCHAR(20) NOT NULL PRIMARY KEY, v INT)",
    "CREATE TABLE k_comp (a INT NOT NULL, b VARCHAR(10) NOT NULL, v TEXT, PRIMARY KEY (a, b))",
    "CREATE TABLE `odd.t%` (`select` INT NOT NULL PRIMARY KEY, `a.b%` VARCHAR(10), `order` DATE)",
]

ROWS = [
    "INSERT INTO items (id, name, price, secret, doc, kind, made, big, raw) VALUES"
    " (1, 'Apple', 1.25, 's1', '{\"a\": 1}', 'b', '2024-01-02 03:04:05.678', 18446744073709551615, x'00ff'),"
    " (2, 'pear', NULL, 's2', NULL, 'A', NULL, 7, NULL), (3, 'fig', 3.50, 's3', '[1, 2]', 'A', NULL, 0, x'01')",
    "UPDATE items SET price = 2.00 WHERE id = 2",
    "DELETE FROM items WHERE id = 3",
    "INSERT INTO k_str VALUES ('x', 1), ('y', 2), ('é', 3)",
    "INSERT INTO k_comp VALUES (1, 'a', 'one'), (1, 'b', 'two'), (2, 'a', NULL)",
    "UPDATE k_comp SET v = 'uno' WHERE a = 1 AND b = 'a'",
    "INSERT INTO `odd.t%` VALUES (1, 'x.y%', '2020-02-29'), (2, NULL, NULL)",
]


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def run_source(server: Any, db: str, statements: list[str]) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        conn.commit()


def rules(source_db: str, target_schema: str, **extra_rule: Any) -> list[dict]:
    return [
        {"source": rf"{source_db}\.items", "target": f"{target_schema}.goods",
         "columns": {"exclude": ["secret"]}, "rename": {"name": "title"}, **extra_rule},
        {"source": rf"{source_db}\..*", "target": f"{target_schema}.{{table}}"},
    ]


def make(tmp_path: Path, mariadb_source: Any, target: dict, tables: list[dict], *, start: Any = None,
         pipeline: dict | None = None) -> SetlProcess:
    source = mysql_source(mariadb_source, server_id=next(_server_ids),
                          start=start if start is not None else "latest")
    settings = {"parallelism": 2, "batch": {"max_rows": 500, "max_wait_ms": 50},
                "retry": {"max_attempts": 2, "initial_backoff_ms": 50, "max_backoff_ms": 200}, **(pipeline or {})}
    return SetlProcess(tmp_path, source=source, target=target, tables=tables, pipeline=settings)


def position(server: Any) -> dict:
    head = binlog_head(server)
    return {"file": head.log, "pos": head.offset}


# --- expected target shapes -------------------------------------------------------------------

def mysql_columns(server: Any, schema: str, table: str) -> dict[str, tuple[str, str, Any]]:
    rows = server.query("SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT FROM information_schema.COLUMNS "
                        f"WHERE TABLE_SCHEMA = '{schema}' AND TABLE_NAME = '{table}' ORDER BY ORDINAL_POSITION")
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def mysql_key(server: Any, schema: str, table: str) -> list[str]:
    rows = server.query("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE CONSTRAINT_NAME = 'PRIMARY'"
                        f" AND TABLE_SCHEMA = '{schema}' AND TABLE_NAME = '{table}' ORDER BY ORDINAL_POSITION")
    return [r[0] for r in rows]


def pg_rows(server: Any, database: str, query: str, args: tuple = ()) -> list[tuple]:
    with contextlib.closing(server.connect(dbname=database)) as conn:
        return [tuple(r) for r in conn.execute(query, args or None).fetchall()]


def pg_columns(server: Any, database: str, schema: str, table: str) -> dict[str, tuple[str, str]]:
    rows = pg_rows(server, database, "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                   "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position", (schema, table))
    return {r[0]: (r[1], r[2]) for r in rows}


def pg_key(server: Any, database: str, schema: str, table: str) -> list[str]:
    rows = pg_rows(server, database,
                   "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
                   "a.attnum = ANY(i.indkey) WHERE i.indisprimary AND i.indrelid = %s::regclass "
                   "ORDER BY array_position(i.indkey, a.attnum)", (f'"{schema}"."{table}"',))
    return [r[0] for r in rows]


# --- tests ------------------------------------------------------------------------------------

def test_start_creates_mariadb_tables_through_rules(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                     mariadb_target: Any, mysql_db: str) -> None:
    """`setl start` into an empty MariaDB target creates every table from the source's definitions
    (renamed table and column, excluded column, keys of several types, odd names), before its first
    row, with types, charset, collation, NOT NULL and defaults kept; the rows then equal the source's."""
    run_source(mariadb_source, source_db, SOURCE_DDL)
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target), rules(source_db, mysql_db),
                start=position(mariadb_source))
    run_source(mariadb_source, source_db, ROWS)
    result = setl.start_until_caught_up(timeout=240)
    assert result.returncode == 0, result.stderr + setl.logs()

    goods = mysql_columns(mariadb_target, mysql_db, "goods")
    assert list(goods) == ["id", "title", "price", "doc", "kind", "made", "big", "raw", "twice"]  # no `secret`
    assert goods["id"][:2] == ("int(10) unsigned", "NO")
    assert goods["title"] == ("varchar(40)", "NO", "'none'")
    assert goods["price"][:2] == ("decimal(12,2)", "YES")
    assert goods["kind"] == ("enum('A','b')", "NO", "'A'")
    assert goods["made"][0] == "datetime(3)" and goods["big"][0] == "bigint(20) unsigned"
    assert goods["twice"][0] == "int(11)"  # a plain column: the rows carry the generated values
    collation = mariadb_target.query("SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                                     f"'{mysql_db}' AND TABLE_NAME = 'goods' AND COLUMN_NAME = 'title'")
    assert collation[0][0] == "utf8mb4_bin"
    assert mysql_key(mariadb_target, mysql_db, "goods") == ["id"]
    assert mysql_key(mariadb_target, mysql_db, "k_str") == ["code"]
    assert mysql_key(mariadb_target, mysql_db, "k_comp") == ["a", "b"]
    assert mysql_key(mariadb_target, mysql_db, "odd.t%") == ["select"]

    source_items = mariadb_source.query(f"SELECT id, name, price, doc, kind, made, big, raw, twice FROM "
                                        f"{q(source_db)}.items ORDER BY id")
    assert mariadb_target.query(f"SELECT * FROM {q(mysql_db)}.goods ORDER BY id") == source_items
    for table, order in (("k_str", "code"), ("k_comp", "a, b"), ("odd.t%", "`select`")):
        assert (mariadb_target.query(f"SELECT * FROM {q(mysql_db)}.{q(table)} ORDER BY {order}")
                == mariadb_source.query(f"SELECT * FROM {q(source_db)}.{q(table)} ORDER BY {order}")), table
    assert "created the target table before its first row" in result.stderr


def test_start_into_empty_postgres_with_transform_ends_equal(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                             postgres_server: Any, postgres_db: str) -> None:
    """End to end into an empty PostgreSQL target: every table is created with the documented type
    mapping, including a column a Spark `add_column` step adds (typed from the chain's output
    schema) on a renamed table with an excluded column; the target ends equal to the source."""
    run_source(mariadb_source, source_db, SOURCE_DDL)
    tables = rules(source_db, "dw", transforms=[{"use": "add_column", "name": "price_x2", "expr": "price * 2"},
                                                {"use": "add_column", "name": "label", "expr": "upper(title)"}])
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db), tables,
                start=position(mariadb_source))
    run_source(mariadb_source, source_db, ROWS)
    result = setl.start_until_caught_up(timeout=360)
    assert result.returncode == 0, result.stderr + setl.logs()

    goods = pg_columns(postgres_server, postgres_db, "dw", "goods")
    assert goods == {
        "id": ("bigint", "NO"), "title": ("character varying", "NO"), "price": ("numeric", "YES"),
        "doc": ("jsonb", "YES"), "kind": ("text", "NO"), "made": ("timestamp without time zone", "YES"),
        "big": ("numeric", "YES"), "raw": ("bytea", "YES"), "twice": ("integer", "YES"),
        "price_x2": ("numeric", "YES"), "label": ("text", "YES"),
    }
    assert pg_key(postgres_server, postgres_db, "dw", "goods") == ["id"]
    assert pg_key(postgres_server, postgres_db, "dw", "k_comp") == ["a", "b"]
    assert pg_key(postgres_server, postgres_db, "dw", "odd.t%") == ["select"]
    assert pg_columns(postgres_server, postgres_db, "dw", "odd.t%") == {
        "select": ("integer", "NO"), "a.b%": ("character varying", "YES"), "order": ("date", "YES")}

    got = pg_rows(postgres_server, postgres_db, 'SELECT id, title, price, doc, kind, made, big, raw, twice, '
                  'price_x2, label FROM dw.goods ORDER BY id')
    source = mariadb_source.query(f"SELECT id, name, price, doc, kind, made, big, raw, twice FROM "
                                  f"{q(source_db)}.items ORDER BY id")
    assert len(got) == len(source) == 2
    for row, want in zip(got, source):
        assert row[:3] == want[:3]
        assert row[3] == (json.loads(want[3]) if want[3] is not None else None)
        assert row[4:6] == want[4:6]
        assert (int(row[6]), row[7] and bytes(row[7]), row[8]) == (want[6], want[7], want[8])
        assert row[9] == want[2] * 2 and row[10] == want[1].upper()
    assert got[0][6] == decimal.Decimal(18446744073709551615)
    for table, order in (("k_str", "code"), ("k_comp", "a, b"), ("odd.t%", '"select"')):
        pg = pg_rows(postgres_server, postgres_db, f'SELECT * FROM dw."{table}" ORDER BY {order}')
        my = mariadb_source.query(f"SELECT * FROM {q(source_db)}.{q(table)} ORDER BY {order.replace(chr(34), '`')}")
        assert sorted(pg, key=repr) == sorted((tuple(r) for r in my), key=repr), table  # collations order apart


def test_misfitting_table_refused_before_any_write(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                   postgres_server: Any, postgres_db: str) -> None:
    """An existing target table that lacks a column, or whose column holds another kind of value,
    stops `setl start` with exit 2 and one line naming pipeline, table and column, before anything
    is written (no table created, no row, no position)."""
    run_source(mariadb_source, source_db, ["CREATE TABLE m (id INT PRIMARY KEY, v INT, w VARCHAR(5))"])
    target = postgres_target(postgres_server, postgres_db)
    postgres_server.query("CREATE SCHEMA dw", dbname=postgres_db)
    postgres_server.query("CREATE TABLE dw.m (id integer PRIMARY KEY, v integer)", dbname=postgres_db)
    setl = make(tmp_path, mariadb_source, target, [{"source": rf"{source_db}\.m", "target": "dw.m"}],
                start=position(mariadb_source))
    run_source(mariadb_source, source_db, ["INSERT INTO m VALUES (1, 1, 'a')"])
    result = setl.start_until_caught_up()
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("setl:")]
    assert len(lines) == 1, result.stderr
    assert f"pipeline={setl.name}" in lines[0] and "table=dw.m" in lines[0] and "column 'w' is missing" in lines[0]
    assert pg_rows(postgres_server, postgres_db, "SELECT count(*) FROM dw.m") == [(0,)]
    assert pg_rows(postgres_server, postgres_db, "SELECT count(*) FROM information_schema.tables WHERE "
                   "table_schema NOT IN ('pg_catalog', 'information_schema')") == [(1,)]  # not even setl's own

    postgres_server.query("ALTER TABLE dw.m ADD COLUMN w date", dbname=postgres_db)
    result = setl.start_until_caught_up()
    assert result.returncode == 2, result.stderr
    assert "column 'w' is date, which cannot hold text values" in result.stderr
    assert pg_rows(postgres_server, postgres_db, "SELECT count(*) FROM dw.m") == [(0,)]

    postgres_server.query("ALTER TABLE dw.m DROP COLUMN w, ADD COLUMN w text", dbname=postgres_db)
    result = setl.start_until_caught_up()
    assert result.returncode == 0, result.stderr + setl.logs()
    assert pg_rows(postgres_server, postgres_db, "SELECT id, v, w FROM dw.m") == [(1, 1, "a")]


def test_schema_command_prints_and_applies(tmp_path: Path, mariadb_source: Any, source_db: str,
                                           mariadb_target: Any, mysql_db: str) -> None:
    """`setl schema` prints the DDL of the missing target tables only; `--apply` runs it; a second
    run finds every table; a misfitting table is one line and exit 2."""
    run_source(mariadb_source, source_db, SOURCE_DDL)
    mariadb_target.query(f"CREATE TABLE {q(mysql_db)}.k_str (code VARCHAR(20) PRIMARY KEY, v BIGINT)")
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target), rules(source_db, mysql_db))
    printed = setl.run("schema", "--pipeline", setl.name)
    assert printed.returncode == 0, printed.stderr
    out = printed.stdout
    assert f"CREATE TABLE IF NOT EXISTS `{mysql_db}`.`goods` (" in out
    assert "`title` varchar(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT 'none'" in out
    assert "PRIMARY KEY (`a`, `b`)" in out and f"`{mysql_db}`.`odd.t%`" in out and "`a.b%` varchar(10)" in out
    assert "secret" not in out and "k_str" not in out  # excluded column; existing table
    assert mariadb_target.query(f"SHOW TABLES FROM {q(mysql_db)}") == [("k_str",)]  # printing creates nothing

    applied = setl.run("schema", "--pipeline", setl.name, "--apply")
    assert applied.returncode == 0, applied.stderr
    assert "created 3 table(s)" in applied.stdout
    assert sorted(r[0] for r in mariadb_target.query(f"SHOW TABLES FROM {q(mysql_db)}")) == [
        "goods", "k_comp", "k_str", "odd.t%"]
    again = setl.run("schema", "--pipeline", setl.name)
    assert again.returncode == 0 and "every target table exists (4 checked)" in again.stdout, again.stdout

    mariadb_target.query(f"ALTER TABLE {q(mysql_db)}.k_comp DROP COLUMN v")
    refused = setl.run("schema", "--pipeline", setl.name)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "k_comp" in refused.stderr and "column 'v' is missing" in refused.stderr


def test_schema_command_on_postgres_and_parquet(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                postgres_server: Any, postgres_db: str) -> None:
    """`setl schema` on PostgreSQL prints the mapped DDL (quoted odd names, composite key) and
    `--apply` creates it; on Parquet it says no DDL is needed."""
    run_source(mariadb_source, source_db, SOURCE_DDL)
    setl = make(tmp_path / "pg", mariadb_source, postgres_target(postgres_server, postgres_db),
                rules(source_db, "dw"))
    printed = setl.run("schema", "--pipeline", setl.name, "--apply")
    assert printed.returncode == 0, printed.stderr
    assert 'CREATE TABLE IF NOT EXISTS "dw"."odd.t%" (' in printed.stdout
    assert '"title" varchar(40) COLLATE "C" NOT NULL DEFAULT \'none\'' in printed.stdout
    assert '"big" numeric(20,0)' in printed.stdout and '"doc" jsonb' in printed.stdout
    assert 'PRIMARY KEY ("a", "b")' in printed.stdout
    assert pg_key(postgres_server, postgres_db, "dw", "k_comp") == ["a", "b"]

    parquet = make(tmp_path / "pq", mariadb_source, {"type": "parquet", "path": str(tmp_path / "out")},
                   rules(source_db, "dw"))
    result = parquet.run("schema", "--pipeline", parquet.name)
    assert result.returncode == 0 and "needs no DDL" in result.stdout, result.stdout + result.stderr


def test_replicated_create_table_is_not_created_twice(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                      mariadb_target: Any, mysql_db: str) -> None:
    """A table whose CREATE TABLE the pipeline replays from the binlog is created by that DDL (with its
    secondary index), not by create_tables first: no conflict, and rows arrive."""
    start = position(mariadb_source)
    run_source(mariadb_source, source_db, ["CREATE TABLE r (id INT PRIMARY KEY, v INT, KEY by_v (v))",
                                           "INSERT INTO r VALUES (1, 10), (2, 20)"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.r", "target": f"{mysql_db}.r"}], start=start)
    result = setl.start_until_caught_up()
    assert result.returncode == 0, result.stderr + setl.logs()
    assert mariadb_target.query(f"SELECT * FROM {q(mysql_db)}.r ORDER BY id") == [(1, 10), (2, 20)]
    indexes = {r[2] for r in mariadb_target.query(f"SHOW INDEX FROM {q(mysql_db)}.r")}
    assert indexes == {"PRIMARY", "by_v"}
    assert "created the target table" not in result.stderr


def test_create_tables_false_creates_nothing(tmp_path: Path, mariadb_source: Any, source_db: str,
                                             postgres_server: Any, postgres_db: str) -> None:
    """With `pipeline.create_tables: false` a missing target table is the load's missing-table error, as before."""
    run_source(mariadb_source, source_db, ["CREATE TABLE n (id INT PRIMARY KEY)"])
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.n", "target": "dw.n"}], pipeline={"create_tables": False},
                start=position(mariadb_source))
    run_source(mariadb_source, source_db, ["INSERT INTO n VALUES (1)"])
    result = setl.start_until_caught_up()
    assert result.returncode == 1
    assert "does not exist" in result.stderr
    assert pg_rows(postgres_server, postgres_db, "SELECT to_regclass('dw.n') IS NULL") == [(True,)]


def test_sqlite_target_gets_typed_tables(tmp_path: Path, mariadb_source: Any, source_db: str) -> None:
    """On the SQLite target the created table has SQLite's affinities and the composite key, and takes the rows."""
    import sqlite3

    run_source(mariadb_source, source_db, SOURCE_DDL)
    path = tmp_path / "target.db"
    tables = [{"source": rf"{source_db}\.items", "exclude": True},  # the SQLite sink binds no Decimal
              {"source": rf"{source_db}\..*", "target": "dw.{table}"}]
    setl = make(tmp_path, mariadb_source, {"type": "sqlite", "path": str(path)}, tables,
                start=position(mariadb_source))
    run_source(mariadb_source, source_db, ROWS)
    result = setl.start_until_caught_up()
    assert result.returncode == 0, result.stderr
    with contextlib.closing(sqlite3.connect(path)) as db:
        info = {r[1]: (r[2], r[5]) for r in db.execute('PRAGMA table_info("dw.k_comp")')}
        assert info == {"a": ("INTEGER", 1), "b": ("TEXT", 2), "v": ("TEXT", 0)}
        assert {r[1]: r[2] for r in db.execute('PRAGMA table_info("dw.k_str")')} == {"code": "TEXT", "v": "INTEGER"}
        assert db.execute('SELECT a, b, v FROM "dw.k_comp" ORDER BY a, b').fetchall() == [
            (1, "a", "uno"), (1, "b", "two"), (2, "a", None)]
        assert db.execute('SELECT "select", "a.b%" FROM "dw.odd%2Et%25" ORDER BY 1').fetchall() == [
            (1, "x.y%"), (2, None)]


def test_per_table_load_creates_tables(tmp_path: Path, mariadb_source: Any, source_db: str,
                                       postgres_server: Any, postgres_db: str) -> None:
    """Under `load.mode: per_table` each table is created before its first part, and the rows arrive."""
    run_source(mariadb_source, source_db, SOURCE_DDL[1:])
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\..*", "target": "dw.{table}"}], start=position(mariadb_source),
                pipeline={"load": {"mode": "per_table"}})
    run_source(mariadb_source, source_db, ROWS[3:])
    result = setl.start_until_caught_up()
    assert result.returncode == 0, result.stderr
    assert pg_rows(postgres_server, postgres_db, "SELECT a, b, v FROM dw.k_comp ORDER BY a, b") == [
        (1, "a", "uno"), (1, "b", "two"), (2, "a", None)]
    assert pg_rows(postgres_server, postgres_db, 'SELECT count(*) FROM dw."odd.t%"') == [(2,)]
    assert pg_rows(postgres_server, postgres_db, "SELECT count(*) FROM dw.k_str") == [(3,)]


def test_schema_command_types_transform_columns(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                postgres_server: Any, postgres_db: str) -> None:
    """`setl schema` types the columns a Spark chain adds from the chain's output schema, and drops
    the ones it drops."""
    run_source(mariadb_source, source_db, ["CREATE TABLE c (id BIGINT PRIMARY KEY, v INT, gone TEXT)"])
    tables = [{"source": rf"{source_db}\.c", "target": "dw.c",
               "transforms": [{"use": "add_column", "name": "v_half", "expr": "v / 2"},
                              {"use": "add_column", "name": "seen", "expr": "current_date()"},
                              {"use": "drop_columns", "columns": ["gone"]}]}]
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db), tables)
    printed = setl.run("schema", "--pipeline", setl.name, timeout=240)
    assert printed.returncode == 0, printed.stderr
    assert ('"id" bigint NOT NULL,\n  "v" integer,\n  "v_half" double precision,\n  "seen" date,\n'
            '  PRIMARY KEY ("id")') in printed.stdout
    assert "gone" not in printed.stdout
