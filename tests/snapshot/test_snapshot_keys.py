"""A snapshot row and its later binlog changes merge by the same key, whatever the key's type.

A chunk is read in a consistent snapshot at position P; the source then deletes, updates and
re-keys some of its rows; the binlog from P is read by the real source. The reads and the binlog
changes go to the target in one batch, merged per key as every load merges them (a read is an
upsert, a later delete removes it): if the two readers gave one row two different key values (the
UUID's text against its 16 bytes), the deleted row would come back. Each key type ends with the
target equal to the source by CHECKSUM TABLE and row by row, on MariaDB and PostgreSQL.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import uuid
from typing import Any

import pytest

from setl.model import Batch, Op, Position, RowChange, TableName
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.snapshot.reader import ChunkReader
from setl.testing.harness import MemorySink

from ..e2e.replicate import replicate, table_rule
from ..e2e.setl_process import binlog_head, mysql_target, postgres_target, spawned
from ..e2e.test_read_types import Capture
from ..helpers.wait import wait_until
from .test_snapshot_e2e import make_setl, run_until_caught_up

pytestmark = pytest.mark.timeout(120)

#: key type -> (five key literals, a sixth: a key the test moves a row to and inserts).
#: Each row: [0] deleted, [1] its value updated, [2] re-keyed to [5], [3] and [4] kept.
KEYS: dict[str, tuple[list[str], str]] = {
    "UUID": (["'6ccd780c-baba-1026-9564-5b8c656024db'", "'f81d4fae-7dec-41d0-a765-00a0c91e6bf6'",
              "'01890a5d-ac96-774b-bcce-b302099a8057'", "'00000000-0000-0000-0000-000000000000'",
              "'ffffffff-ffff-ffff-ffff-ffffffffffff'"], "'0b3d6e8a-1111-4222-8333-944455556666'"),
    "INET6": (["'::ffff:1.2.3.4'", "'2001:db8::1'", "'::1.2.3.4'", "'::'", "'fe80::1:2:3:4'"], "'::1'"),
    "INET4": (["'10.0.0.1'", "'0.0.0.0'", "'255.255.255.255'", "'1.2.3.4'", "'127.0.0.1'"], "'8.8.8.8'"),
    "BINARY(4)": (["x'01000000'", "x'00000000'", "x'ff000000'", "x'00010000'", "x'00ff00ff'"], "x'000000ff'"),
    "VARBINARY(8)": (["x'00ff00'", "x''", "x'0000'", "x'01'", "x'ff00'"], "x'0100'"),
    "BIT(5)": (["b'101'", "b'0'", "b'11111'", "b'1'", "b'10000'"], "b'10'"),
    "DECIMAL(10,3)": (["1.5", "-0.001", "0", "9999999.999", "-9999999.999"], "2.25"),
    "DATETIME(6)": (["'2024-01-02 03:04:05.000100'", "'1000-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'",
                     "'2024-01-01 00:00:00'", "'2024-01-01 00:00:00.5'"], "'2024-05-05 05:05:05.5'"),
    "TIMESTAMP(3)": (["'2024-01-02 03:04:05.100'", "'1970-01-01 00:00:01'", "'2038-01-19 03:14:07.999'",
                      "'2000-02-29 12:00:00'", "'2000-02-29 12:00:00.001'"], "'2001-01-01 00:00:00.5'"),
    "TIME(3)": (["'01:02:03.450'", "'-838:59:59'", "'00:00:00'", "'-00:00:00.001'", "'838:59:59'"],
                "'12:00:00.001'"),
    "DATE": (["'2024-02-29'", "'1000-01-01'", "'9999-12-31'", "'2024-01-01'", "'1970-01-01'"], "'2000-01-01'"),
    "SET('a','b','c')": (["'a,b'", "''", "'c'", "'a,b,c'", "'b'"], "'a,c'"),
    "YEAR": (["2024", "0", "1901", "2155", "1970"], "1999"),
    "ENUM('a','b','c','d','e','f')": (["'a'", "'b'", "'c'", "'d'", "'e'"], "'f'"),
    # case-insensitive and PAD SPACE: 'c' re-keyed to 'C ', one key to the server, two to Python
    "VARCHAR(8) COLLATE utf8mb4_general_ci": (["'a'", "'B '", "'c'", "'dd'", "'É'"], "'C '"),
    "CHAR(4) CHARACTER SET latin1": (["'ab'", "''", "'x y'", "'zz'", "'q'"], "'AB'"),
    # FLOAT: a single-precision value, matched below by range (1.1 as a double is not it)
    "FLOAT": (["1.1", "0.3", "-2.5", "3.3", "1e30"], "0.1"),
    # spatial: the server's bytes (SRID, then WKB) from both readers, as `setl.values.Geometry`
    "POINT": (["ST_GeomFromText('POINT(1 2)')", "ST_GeomFromText('POINT(1 2)', 4326)",
               "ST_GeomFromText('POINT(-0.1 1e20)')", "ST_GeomFromText('POINT(0 0)')",
               "ST_GeomFromText('POINT(3.5 -7.25)', 3857)"], "ST_GeomFromText('POINT(9 9)')"),
}


#: the PostgreSQL column each key type maps to (docs/sql-targets.md)
PG_TYPES = {
    "UUID": "uuid", "INET6": "inet", "INET4": "inet", "BINARY(4)": "bytea", "VARBINARY(8)": "bytea",
    "BIT(5)": "bigint", "DECIMAL(10,3)": "numeric(10,3)", "DATETIME(6)": "timestamp(6)",
    "TIMESTAMP(3)": "timestamptz(3)", "TIME(3)": "interval", "DATE": "date", "SET('a','b','c')": "text",
    "YEAR": "smallint", "ENUM('a','b','c','d','e','f')": "text", "VARCHAR(8) COLLATE utf8mb4_general_ci": "varchar(8)",
    "CHAR(4) CHARACTER SET latin1": "varchar(4)", "FLOAT": "real", "POINT": "bytea",
}


def _ids(kind: str) -> str:
    return kind.split("(")[0].split(" ")[0].lower() + ("_ci" if "general_ci" in kind else "")


def _is(kind: str, literal: str) -> str:
    """A condition matching the row keyed `literal`."""
    if kind == "FLOAT":
        return f"ABS(k - {literal}) <= ABS({literal}) * 1e-6"
    return f"k = {literal}"


def _run(server, db: str, statements: list[str], *, log_bin: bool = True) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        if not log_bin:
            cur.execute("SET SESSION sql_log_bin = 0")
        for sql in statements:
            cur.execute(sql)
        conn.commit()


def _copy_then_change(mariadb_source, source_db: str, kind: str, tmp_path,
                      target_schema: str) -> tuple[list[RowChange], list[RowChange]]:
    """The table's rows read at P (as target reads) and the binlog changes after P (routed)."""
    literals, moved = KEYS[kind]
    _run(mariadb_source, source_db, [
        f"CREATE TABLE k (k {kind} NOT NULL PRIMARY KEY, v INT NOT NULL)",
        "INSERT INTO k VALUES " + ", ".join(f"({lit}, {n})" for n, lit in enumerate(literals)),
    ], log_bin=False)
    reader = ChunkReader(lambda: mariadb_source.connect(), "keys")
    with contextlib.closing(mariadb_source.connect()) as conn:
        ChunkReader.prepare(conn)
        plan = reader.plan(conn, TableName(source_db, "k"))
        assert plan is not None and plan.key == ("k",)
        rows, position = reader.read(conn, plan, None, None, lambda _p: None)
    assert len(rows) == 5
    _run(mariadb_source, source_db, [
        f"DELETE FROM k WHERE {_is(kind, literals[0])}",
        f"UPDATE k SET v = v + 100 WHERE {_is(kind, literals[1])}",
        f"UPDATE k SET k = {moved} WHERE {_is(kind, literals[2])}",
        f"UPDATE k SET k = {literals[2]}, v = 7 WHERE {_is(kind, moved)}",
        f"UPDATE k SET k = {moved}, v = 8 WHERE {_is(kind, literals[2])}",
        f"DELETE FROM k WHERE {_is(kind, literals[4])}",
        f"INSERT INTO k VALUES ({literals[4]}, 44)",
        f"DELETE FROM k WHERE {_is(kind, literals[4])}",
    ])
    capture = Capture(MemorySink())
    replicate(mariadb_source, position, [table_rule(rf"{source_db}\.k", f"{target_schema}.k")], capture, tmp_path)
    assert len(capture.changes) == 8
    reads = [RowChange(Op.READ, target_schema, "k", ("k",), None, row, position) for row in rows]
    return reads, capture.changes


def _one_batch(changes: list[RowChange]) -> Batch:
    return Batch("keys", 1, 1, Position("snapshot", 0), changes[-1].position or Position("snapshot", 1),
                 tuple(changes))


@pytest.mark.parametrize("kind", list(KEYS), ids=_ids)
def test_a_copied_row_and_its_binlog_changes_merge_by_one_key_into_mariadb(
        kind, mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """Rows deleted, updated and re-keyed after their copy end as the source holds them: the read
    and the binlog change of a row carry one key value (no deleted row comes back)."""
    reads, changes = _copy_then_change(mariadb_source, source_db, kind, tmp_path, mysql_db)
    _run(mariadb_target, mysql_db, [f"CREATE TABLE k (k {kind} NOT NULL PRIMARY KEY, v INT NOT NULL)"])
    load = MysqlLoad(mariadb_target.target_config(), pipeline="keys", position_schema=mysql_db)
    try:
        load.load(_one_batch(reads + changes))
    finally:
        load.close()
    query = "SELECT HEX(k), v FROM `{}`.k ORDER BY 1"
    assert mariadb_target.query(query.format(mysql_db)) == mariadb_source.query(query.format(source_db))
    checksum = "CHECKSUM TABLE `{}`.k"
    assert mariadb_target.query(checksum.format(mysql_db))[0][1] == \
        mariadb_source.query(checksum.format(source_db))[0][1]


@pytest.mark.parametrize("kind", list(KEYS), ids=_ids)
def test_a_copied_row_and_its_binlog_changes_merge_by_one_key_into_postgresql(
        kind, mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """The same into PostgreSQL (each row's `v` is unique: a deleted row that came back would show)."""
    reads, changes = _copy_then_change(mariadb_source, source_db, kind, tmp_path, source_db)
    postgres_server.query(f'CREATE SCHEMA "{source_db}"', dbname=postgres_db)
    postgres_server.query(f'CREATE TABLE "{source_db}".k (k {PG_TYPES[kind]} NOT NULL PRIMARY KEY, v int NOT NULL)',
                          dbname=postgres_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="keys")
    try:
        load.load(_one_batch(reads + changes))
    finally:
        load.close()
    got = postgres_server.query(f'SELECT v FROM "{source_db}".k ORDER BY v', dbname=postgres_db)
    assert [tuple(row) for row in got] == mariadb_source.query(f"SELECT v FROM `{source_db}`.k ORDER BY v")
    if kind in ("UUID", "INET6", "INET4"):  # the key itself, as PostgreSQL's type reads it
        keys = postgres_server.query(f'SELECT k::text FROM "{source_db}".k ORDER BY v', dbname=postgres_db)
        expected = mariadb_source.query(f"SELECT k FROM `{source_db}`.k ORDER BY v")
        normal = (lambda text: text.split("/")[0]) if kind != "UUID" else str
        assert [normal(row[0]) for row in keys] == [row[0] for row in expected]
    if kind == "POINT":  # bytea (no PostGIS here) holding each key's WKB
        keys = postgres_server.query(f'SELECT k FROM "{source_db}".k ORDER BY v', dbname=postgres_db)
        expected = mariadb_source.query(f"SELECT ST_AsBinary(k) FROM `{source_db}`.k ORDER BY v")
        assert [bytes(row[0]) for row in keys] == [row[0] for row in expected]


def _merged_keys(reads: list[RowChange], changes: list[RowChange]) -> dict[Any, Any]:
    sink = MemorySink()
    sink.load(_one_batch(reads + changes))
    [table] = sink.tables.values()
    return {key[0]: row["v"] for key, row in table.items()}


@pytest.mark.parametrize("kind", list(KEYS), ids=_ids)
def test_the_merge_of_a_copy_and_its_binlog_changes_holds_the_source_rows(kind, mariadb_source, source_db,
                                                                          tmp_path):
    """The per-key merge alone: the keys it keeps are exactly the source's rows, read again."""
    reads, changes = _copy_then_change(mariadb_source, source_db, kind, tmp_path, source_db)
    reader = ChunkReader(lambda: mariadb_source.connect(), "keys")
    with contextlib.closing(mariadb_source.connect()) as conn:
        ChunkReader.prepare(conn)
        plan = reader.plan(conn, TableName(source_db, "k"))
        assert plan is not None
        now, _ = reader.read(conn, plan, None, None, lambda _p: None)
    expected = {row["k"]: row["v"] for row in now}
    assert _merged_keys(reads, changes) == expected


#: a key of every type whose two shapes once differed (UUID text against its bytes, INET, SET, FLOAT)
COMPOSITE = ("(u UUID NOT NULL, a INET6 NOT NULL, b INET4 NOT NULL, s SET('x','y') NOT NULL, f FLOAT NOT NULL, "
             "v INT NOT NULL, PRIMARY KEY (u, a, b, s, f))")


def _composite_rows(n: int) -> list[str]:
    return [f"('{uuid.UUID(int=i * 7919 + 1, version=4 if i % 2 else 1)}', '::ffff:10.0.{i // 256}.{i % 256}', "
            f"'10.1.{i // 256}.{i % 256}', '{'x,y' if i % 3 else 'y'}', {i}.1, {i})" for i in range(n)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target_kind", ["mariadb", "postgresql"])
def test_rows_deleted_and_updated_during_their_copy_stay_deleted(target_kind, tmp_path, mariadb_source, source_db,
                                                                  request):
    """`setl start` with `start: snapshot`: the chunk read holds at its snapshot position while rows
    are deleted, updated and re-keyed; the target (tables created by setl) ends equal to the source."""
    _run(mariadb_source, source_db, [f"CREATE TABLE ck {COMPOSITE}",
                                     "INSERT INTO ck VALUES " + ", ".join(_composite_rows(300))], log_bin=False)
    if target_kind == "mariadb":
        server, db = request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db")
        target, name = mysql_target(server), f"{db}.{{table}}"
    else:
        server, db = request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db")
        target, name = postgres_target(server, db), f"{source_db}.{{table}}"
    setl = make_setl(tmp_path, mariadb_source, source_db, target, name, server_id=2190, chunk_rows=100_000)
    setl.faults = json.dumps([{"stage": "snapshot_read", "action": "slow", "seconds": 4, "times": 1}])
    with spawned(setl) as proc:
        def reading() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            return "failpoint snapshot_read: sleeping" in setl.logs()

        wait_until(reading, timeout=60, interval=0.05, message=lambda: setl.logs()[-3000:])
        _run(mariadb_source, source_db, [
            "DELETE FROM ck WHERE v % 5 = 0",
            "UPDATE ck SET v = v + 1000 WHERE v % 5 = 1",
            "UPDATE ck SET f = f + 0.5, s = 'x' WHERE v % 5 = 2",
            "UPDATE ck SET u = UUID() WHERE v % 5 = 3",
        ])

        def copied() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            row = setl.status()
            return bool(row["snapshot"]) and all(s["status"] == "done" for s in row["snapshot"])

        wait_until(copied, timeout=120, interval=0.2, message=lambda: f"{setl.status()} {setl.logs()[-3000:]}")
        assert setl.stop(proc) == 0
    run_until_caught_up(setl)
    expected = mariadb_source.query(f"SELECT u, a, b, s, f, v FROM `{source_db}`.ck ORDER BY v")
    assert len(expected) == 240
    if target_kind == "mariadb":
        got = server.query(f"SELECT u, a, b, s, f, v FROM `{db}`.ck ORDER BY v")
        assert got == expected
        checksum = "CHECKSUM TABLE `{}`.ck"
        assert server.query(checksum.format(db))[0][1] == mariadb_source.query(checksum.format(source_db))[0][1]
    else:
        got = server.query(f'SELECT u::text, host(a), host(b), s, f, v FROM "{source_db}".ck ORDER BY v', dbname=db)
        assert [(u, str(ipaddress.ip_address(a)), b, s, v) for u, a, b, s, _f, v in got] == \
            [(u, str(ipaddress.ip_address(a)), b, s, v) for u, a, b, s, _f, v in expected]
        assert [round(row[4], 3) for row in got] == [round(row[4], 3) for row in expected]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target_kind", ["mariadb", "postgresql"])
def test_every_key_type_from_the_binlog_alone(target_kind, tmp_path, mariadb_source, source_db, mariadb_target,
                                              mysql_db, postgres_server, postgres_db):
    """The binlog-only start of the cases above: a table per key type created by replicated DDL,
    its rows inserted, deleted, updated and re-keyed as above, one pipeline run from before the
    CREATEs; each target table ends as the source holds it."""
    start = binlog_head(mariadb_source)
    for n, (kind, (literals, moved)) in enumerate(KEYS.items()):
        _run(mariadb_source, source_db, [
            f"CREATE TABLE k{n} (k {kind} NOT NULL PRIMARY KEY, v INT NOT NULL)",
            f"INSERT INTO k{n} VALUES " + ", ".join(f"({lit}, {i})" for i, lit in enumerate(literals)),
            f"DELETE FROM k{n} WHERE {_is(kind, literals[0])}",
            f"UPDATE k{n} SET v = v + 100 WHERE {_is(kind, literals[1])}",
            f"UPDATE k{n} SET k = {moved} WHERE {_is(kind, literals[2])}",
            f"UPDATE k{n} SET k = {literals[2]}, v = 7 WHERE {_is(kind, moved)}",
            f"UPDATE k{n} SET k = {moved}, v = 8 WHERE {_is(kind, literals[2])}",
            f"DELETE FROM k{n} WHERE {_is(kind, literals[4])}",
            f"INSERT INTO k{n} VALUES ({literals[4]}, 44)",
            f"DELETE FROM k{n} WHERE {_is(kind, literals[4])}",
        ])
    if target_kind == "mariadb":
        load: Any = MysqlLoad(mariadb_target.target_config(), pipeline="binkeys", position_schema=mysql_db)
        schema = mysql_db
    else:
        load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="binkeys")
        schema = source_db
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.k\d+", f"{schema}.{{table}}")], load, tmp_path)
    for n, kind in enumerate(KEYS):
        if target_kind == "mariadb":
            query = f"SELECT HEX(k), v FROM `{{}}`.k{n} ORDER BY 1"
            assert mariadb_target.query(query.format(mysql_db)) == mariadb_source.query(query.format(source_db)), kind
            checksum = f"CHECKSUM TABLE `{{}}`.k{n}"
            assert mariadb_target.query(checksum.format(mysql_db))[0][1] == \
                mariadb_source.query(checksum.format(source_db))[0][1], kind
            continue
        got = postgres_server.query(f'SELECT v FROM "{source_db}".k{n} ORDER BY v', dbname=postgres_db)
        assert [tuple(r) for r in got] == mariadb_source.query(f"SELECT v FROM `{source_db}`.k{n} ORDER BY v"), kind
        if kind in ("UUID", "INET6", "INET4"):
            keys = postgres_server.query(f'SELECT k::text FROM "{source_db}".k{n} ORDER BY v', dbname=postgres_db)
            normal = (lambda text: text.split("/")[0]) if kind != "UUID" else str
            assert [normal(r[0]) for r in keys] == [r[0] for r in mariadb_source.query(
                f"SELECT k FROM `{source_db}`.k{n} ORDER BY v")], kind
