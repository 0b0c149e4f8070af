"""Table names with dots, ``%``, spaces and backticks, end to end from a real MariaDB into MariaDB and
PostgreSQL (issue 13.4): a name is a (schema, table) pair all the way, never a string split on a dot."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from setl.config import LoadSettings
from setl.model import Batch, Position
from setl.sinks.mysql import MysqlLoad
from setl.sinks.parquet import ParquetLoad, read_table, table_directory
from setl.sinks.postgresql import PostgresqlLoad
from setl.sinks.sqlite import SqliteLoad
from setl.testing.harness import insert

from .replicate import SETTINGS, binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(180)

TABLES = ["dot.table", "per%cent", "sp ace", "back`tick", "all. %`four"]


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@pytest.fixture
def dotted_schema(source_db: str, mariadb_source: Any) -> Iterator[str]:
    """A second source schema whose name holds a dot: `<source_db>.d`."""
    name = f"{source_db}.d"
    mariadb_source.query(f"CREATE DATABASE {quote(name)}")
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            mariadb_source.query(f"DROP DATABASE IF EXISTS {quote(name)}")


def write_source(server: Any, schema: str, dotted: str) -> None:
    """Create every odd table (and `t` in the dotted schema) and change rows in them."""
    with contextlib.closing(server.connect(database=schema)) as conn, conn.cursor() as cur:
        for i, table in enumerate(TABLES + [None]):
            name = f"{quote(dotted)}.`t`" if table is None else f"{quote(schema)}.{quote(table)}"
            cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20))")
            cur.execute(f"INSERT INTO {name} VALUES (1, 'one'), (2, 'two'), (3, 'three-{i}')")
            cur.execute(f"UPDATE {name} SET v = CONCAT(v, '!') WHERE id = 1")
            cur.execute(f"DELETE FROM {name} WHERE id = 2")
        conn.commit()


def expected(i: int) -> list[tuple[Any, ...]]:
    return [(1, "one!"), (3, f"three-{i}")]


def rules(source_db: str, dotted: str, target: str) -> list:
    """The dotted schema's tables go to `<target>.<schema>__<table>`; every other table keeps its name."""
    return [
        table_rule(rf"{source_db}\.d\.t", f"{target}.{{schema}}__{{table}}"),
        table_rule(rf"{source_db}\..*", f"{target}.{{table}}"),
    ]


@pytest.mark.parametrize("mode", ["ordered", "per_table"])
def test_odd_names_reach_mariadb_whole(mariadb_source, source_db, dotted_schema, mariadb_target, mysql_db,
                                       tmp_path, mode):
    """Tables named with dots, %, spaces and backticks (and one in a dotted schema) reach MariaDB whole."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db, dotted_schema)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="names", position_schema=mysql_db)
    settings = attrs.evolve(SETTINGS, load=LoadSettings(mode=mode))
    replicate(mariadb_source, start, rules(source_db, dotted_schema, mysql_db), load, tmp_path, name="names",
              settings=settings)
    tables = {r[0] for r in mariadb_target.query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_name NOT LIKE "
        "'setl%%'", (mysql_db,))}
    assert tables == {*TABLES, f"{dotted_schema}__t"}
    assert mariadb_target.query("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
                                (f"{mysql_db}%",)) == [(mysql_db,)]
    for i, table in enumerate(TABLES + [f"{dotted_schema}__t"]):
        assert mariadb_target.query(f"SELECT * FROM {quote(mysql_db)}.{quote(table)} ORDER BY id") == expected(i)


def test_odd_names_reach_postgresql_whole(mariadb_source, source_db, dotted_schema, postgres_server, postgres_db,
                                          tmp_path):
    """The same odd names reach PostgreSQL whole, in the target schema the rules name."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db, dotted_schema)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="names")
    replicate(mariadb_source, start, rules(source_db, dotted_schema, "dw"), load, tmp_path, name="names")

    def query(sql: str, params: tuple | None = None) -> list[tuple[Any, ...]]:
        return postgres_server.query(sql, params, dbname=postgres_db)

    assert {r[0] for r in query("SELECT tablename FROM pg_tables WHERE schemaname = 'dw'")} == {
        *TABLES, f"{dotted_schema}__t"}
    assert [r[0] for r in query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'dw%'")] == ["dw"]
    for i, table in enumerate(TABLES + [f"{dotted_schema}__t"]):
        ident = '"' + table.replace('"', '""') + '"'
        assert query(f"SELECT * FROM dw.{ident} ORDER BY id") == expected(i)


def test_odd_names_get_parquet_directories_of_their_own(mariadb_source, source_db, dotted_schema, tmp_path):
    """`s`.`a.b` and `s.a`.`b` write different Parquet directories; every odd name reads back whole."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db, dotted_schema)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE `d.t` (id INT PRIMARY KEY, v VARCHAR(20))")  # `s`.`d.t` next to `s.d`.`t`
        cur.execute("INSERT INTO `d.t` VALUES (7, 'seven')")
        conn.commit()
    root = tmp_path / "out"
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\..*", "{schema}.{table}")],
              ParquetLoad(root, pipeline="names"), tmp_path, name="names")
    names = [(source_db, t) for t in TABLES] + [(dotted_schema, "t"), (source_db, "d.t")]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(table_directory(*n) for n in names)
    for i, (schema, table) in enumerate(names[:-1]):
        rows = read_table(root, table_directory(schema, table)).to_pylist()
        final = {r["id"]: r["v"] for r in sorted(rows, key=lambda r: (r["_setl_offset"], r["_setl_seq"]))
                 if r["_setl_op"] != "delete"}
        deleted = {r["id"] for r in rows if r["_setl_op"] == "delete"}
        assert sorted((k, v) for k, v in final.items() if k not in deleted) == expected(i)
    assert [r["v"] for r in read_table(root, table_directory(source_db, "d.t")).to_pylist()] == ["seven"]


def test_sqlite_target_keeps_dotted_pairs_apart(tmp_path):
    """`s`.`a.b` and `s.a`.`b` become two SQLite tables, not one."""
    load = SqliteLoad(tmp_path / "t.db", pipeline="names")
    changes = (insert("a.b", {"id": 1, "v": "table a.b"}, key=("id",), schema="s"),
               insert("b", {"id": 1, "v": "schema s.a"}, key=("id",), schema="s.a"))
    load.load(Batch("names", 1, 1, Position("log", 0), Position("log", 10), changes))
    load.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "t.db")) as db:
        tables = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                                  " AND name NOT LIKE 'setl%'"))
        assert tables == ["s%2Ea.b", "s.a%2Eb"]
        assert db.execute('SELECT v FROM "s.a%2Eb"').fetchall() == [("table a.b",)]
        assert db.execute('SELECT v FROM "s%2Ea.b"').fetchall() == [("schema s.a",)]
