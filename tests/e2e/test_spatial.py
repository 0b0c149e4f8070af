"""Spatial columns end to end: every MariaDB spatial type, written on a real server, read from its
binlog (and by a snapshot) and replicated into MariaDB byte for byte, and into PostgreSQL as PostGIS
geometry when the extension is there, else by the target's ``spatial`` fallback (WKB bytea, WKT
text). The target tables are made by the replicated CREATE TABLE (or by setl's table creation for
the snapshot), so the DDL translation is checked too."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import attrs
import pytest

from setl.errors import LoadError
from setl.model import Batch, Op, Position, RowChange, TableName
from setl.sinks.mysql import MysqlLoad
from setl.sinks.parquet import ParquetLoad, read_table
from setl.sinks.postgresql import PostgresqlLoad
from setl.sinks.sqlite import SqliteLoad
from setl.snapshot.reader import ChunkReader
from setl.testing.harness import MemorySink
from setl.values import Geometry

from ..helpers.wait import wait_until
from .replicate import binlog_head, replicate, table_rule
from .setl_process import SetlProcess, mysql_source, postgres_target, spawned
from .test_read_types import Capture

pytestmark = pytest.mark.timeout(180)

#: column -> (MariaDB type, the PostgreSQL type of its column under PostGIS)
COLUMNS = {
    "g": ("GEOMETRY", "geometry"),
    "p": ("POINT", "geometry(Point)"),
    "l": ("LINESTRING", "geometry(LineString)"),
    "pg": ("POLYGON", "geometry(Polygon)"),
    "mp": ("MULTIPOINT", "geometry(MultiPoint)"),
    "ml": ("MULTILINESTRING", "geometry(MultiLineString)"),
    "mpg": ("MULTIPOLYGON", "geometry(MultiPolygon)"),
    "gc": ("GEOMETRYCOLLECTION", "geometry(GeometryCollection)"),
    "ps": ("POINT REF_SYSTEM_ID=4326", "geometry(Point)"),
}
CREATE = ("CREATE TABLE shapes (id INT NOT NULL PRIMARY KEY, "
          + ", ".join(f"{name} {kind}" for name, (kind, _) in COLUMNS.items()) + ")")
#: one row's WKT per column (and SRID); coordinates both servers print alike
ROW = {
    "g": ("POINT(1 2)", 3857),
    "p": ("POINT(1.5 -2.25)", 0),
    "l": ("LINESTRING(0 0,1 1,2 0.1)", 0),
    "pg": ("POLYGON((0 0,4 0,4 4,0 4,0 0),(1 1,2 1,2 2,1 1))", 0),
    "mp": ("MULTIPOINT(1 1,2 2)", 0),
    "ml": ("MULTILINESTRING((0 0,1 1),(2 2,3 3))", 0),
    "mpg": ("MULTIPOLYGON(((0 0,1 0,1 1,0 0)),((5 5,6 5,6 6,5 5)))", 3857),
    "gc": ("GEOMETRYCOLLECTION(POINT(1 1),LINESTRING(0 0,123456.789 -0.001))", 0),
    "ps": ("POINT(10.25 20.5)", 4326),
}
NAMES = list(COLUMNS)


def _values(row: dict[str, tuple[str, int]]) -> str:
    return ", ".join(f"ST_GeomFromText('{wkt}', {srid})" for wkt, srid in row.values())


def _run(server: Any, db: str, statements: list[str]) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
        conn.commit()


def write_rows(server: Any, db: str, first: int = 1) -> None:
    """Three rows of every spatial type, one updated in every column, one deleted, one all NULL."""
    moved = {name: (wkt, 4326 if srid == 0 else 0) for name, (wkt, srid) in ROW.items()}
    _run(server, db, [
        f"INSERT INTO shapes VALUES ({first}, {_values(ROW)}), ({first + 1}, {_values(ROW)}), "
        f"({first + 2}, {_values(moved)})",
        f"INSERT INTO shapes (id) VALUES ({first + 3})",
        "UPDATE shapes SET " + ", ".join(f"{name} = ST_GeomFromText('{ROW['gc'][0]}', 27700)" if name in ("g", "gc")
                                          else f"{name} = {name}" for name in NAMES) + f" WHERE id = {first + 1}",
        f"UPDATE shapes SET p = ST_GeomFromText('POINT(-7 8.125)') WHERE id = {first + 1}",
        f"DELETE FROM shapes WHERE id = {first + 2}",
    ])


def source_forms(server: Any, db: str, form: str) -> list[tuple[Any, ...]]:
    """The rows of `db`.shapes, each spatial column as `form`: text (WKT and SRID) or wkb."""
    if form == "text":
        columns = ", ".join(f"ST_AsText({c}), ST_SRID({c})" for c in NAMES)
    else:
        columns = ", ".join(f"ST_AsBinary({c})" for c in NAMES)
    return [tuple(r) for r in server.query(f"SELECT id, {columns} FROM `{db}`.shapes ORDER BY id")]


def _mariadb_spelling(value: Any) -> Any:
    """PostGIS's ST_AsText spelled as MariaDB's: ``MULTIPOINT((1 1),(2 2))`` is ``MULTIPOINT(1 1,2 2)``."""
    if isinstance(value, str) and value.startswith("MULTIPOINT("):
        return "MULTIPOINT(" + value[len("MULTIPOINT("):].replace("(", "").replace(")", "") + ")"
    return value


def postgres_forms(server: Any, db: str, schema: str, form: str) -> list[tuple[Any, ...]]:
    """The rows of `schema`.shapes: `text` (ST_AsText spelled as MariaDB's and ST_SRID), `postgis-wkb`
    (ST_AsBinary) or `raw` (the columns as they are)."""
    if form == "text":
        columns = ", ".join(f"ST_AsText({c}), ST_SRID({c})" for c in NAMES)
    elif form == "postgis-wkb":
        columns = ", ".join(f"ST_AsBinary({c})" for c in NAMES)
    else:
        columns = ", ".join(NAMES)
    return [tuple(bytes(v) if isinstance(v, memoryview) else _mariadb_spelling(v) for v in r)
            for r in server.query(f'SELECT id, {columns} FROM "{schema}".shapes ORDER BY id', dbname=db)]


def postgres_types(server: Any, db: str, schema: str) -> dict[str, str]:
    rows = server.query("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                        "WHERE a.attrelid = %s::regclass AND a.attnum > 1 AND NOT a.attisdropped",
                        (f'"{schema}".shapes',), dbname=db)
    return {str(name): str(kind) for name, kind in rows}


def test_a_snapshot_read_and_the_binlog_give_one_value(mariadb_source, source_db, tmp_path):
    """A snapshot chunk (text protocol) and the binlog's row images hand on the same `Geometry` for
    every spatial column: the server's bytes, SRID first."""
    _run(mariadb_source, source_db, [CREATE])
    start = binlog_head(mariadb_source)
    write_rows(mariadb_source, source_db)
    capture = Capture(MemorySink())
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.shapes", f"{source_db}.shapes")], capture, tmp_path)
    from_binlog = {change.after["id"]: change.after for change in capture.changes if change.op is Op.INSERT
                   and change.after["id"] in (1, 4)}
    reader = ChunkReader(lambda: mariadb_source.connect(), "spatial")
    with contextlib.closing(mariadb_source.connect()) as conn:
        ChunkReader.prepare(conn)
        plan = reader.plan(conn, TableName(source_db, "shapes"))
        assert plan is not None
        rows, _ = reader.read(conn, plan, None, (1,), lambda _p: None)
    [copied] = rows
    assert copied == from_binlog[1]
    assert all(isinstance(copied[name], Geometry) for name in NAMES)
    assert copied["ps"] == Geometry(mariadb_source.query(f"SELECT ps FROM `{source_db}`.shapes WHERE id = 1")[0][0])
    assert copied["ps"].srid == 4326 and copied["g"].srid == 3857
    assert all(from_binlog[4][name] is None for name in NAMES)


def test_spatial_values_reach_mariadb_byte_exact(mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """Every spatial type, SRIDs and NULLs included, arrives in MariaDB byte for byte (the replicated
    CREATE TABLE made the table): equal by HEX of every column and by CHECKSUM TABLE."""
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, [CREATE])
    write_rows(mariadb_source, source_db)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="spatial", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.shapes", f"{mysql_db}.shapes")], load, tmp_path)
    query = "SELECT id, " + ", ".join(f"HEX({c})" for c in NAMES) + " FROM `{}`.shapes ORDER BY id"
    expected = mariadb_source.query(query.format(source_db))
    assert [r[0] for r in expected] == [1, 2, 4]
    assert mariadb_target.query(query.format(mysql_db)) == expected
    checksum = "CHECKSUM TABLE `{}`.`shapes`"
    assert mariadb_target.query(checksum.format(mysql_db))[0][1] == \
        mariadb_source.query(checksum.format(source_db))[0][1]


def test_spatial_values_become_postgis_geometry(mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """With PostGIS in the target database (``spatial: auto``), the replicated CREATE TABLE makes
    geometry columns of each type, and every value equals the source's by ST_AsText, ST_SRID and
    ST_AsBinary."""
    postgres_server.query("CREATE EXTENSION postgis", dbname=postgres_db)
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, [CREATE])
    write_rows(mariadb_source, source_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="spatial")
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.shapes", "app.shapes")], load, tmp_path)
    assert postgres_types(postgres_server, postgres_db, "app") == {name: pg for name, (_, pg) in COLUMNS.items()}
    assert postgres_forms(postgres_server, postgres_db, "app", "text") == source_forms(mariadb_source, source_db,
                                                                                        "text")
    assert postgres_forms(postgres_server, postgres_db, "app", "postgis-wkb") == source_forms(
        mariadb_source, source_db, "wkb")


@pytest.mark.parametrize("spatial", ["auto", "wkb"])
def test_without_postgis_spatial_values_are_wkb_bytea(spatial, mariadb_source, source_db, postgres_server,
                                                      postgres_db, tmp_path):
    """Without PostGIS (``spatial: auto``, or ``wkb`` set), spatial columns are bytea holding each
    value's WKB exactly as the source's ST_AsBinary (the SRID is not kept)."""
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, [CREATE])
    write_rows(mariadb_source, source_db)
    config = attrs.evolve(postgres_server.target_config(postgres_db), spatial=spatial)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.shapes", "app.shapes")],
              PostgresqlLoad(config, pipeline="spatial"), tmp_path)
    assert set(postgres_types(postgres_server, postgres_db, "app").values()) == {"bytea"}
    assert postgres_forms(postgres_server, postgres_db, "app", "raw") == source_forms(mariadb_source, source_db,
                                                                                       "wkb")


def test_spatial_values_as_wkt_text(mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """``spatial: wkt`` makes text columns holding each value's WKT, which the source reads back to
    the very same geometry (ST_AsBinary equal) and prints alike (ST_AsText)."""
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, [CREATE])
    write_rows(mariadb_source, source_db)
    config = attrs.evolve(postgres_server.target_config(postgres_db), spatial="wkt")
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.shapes", "app.shapes")],
              PostgresqlLoad(config, pipeline="spatial"), tmp_path)
    assert set(postgres_types(postgres_server, postgres_db, "app").values()) == {"text"}
    got = postgres_forms(postgres_server, postgres_db, "app", "raw")
    expected = source_forms(mariadb_source, source_db, "text")
    assert [tuple(r[:1]) + tuple(r[1:]) for r in got] == [tuple([r[0], *r[1::2]]) for r in expected]
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        for row in got:
            for name, wkt in zip(NAMES, row[1:]):
                cur.execute(f"SELECT ST_AsBinary(ST_GeomFromText(%s)) <=> ST_AsBinary({name}) FROM shapes "
                            "WHERE id = %s", (wkt, row[0]))
                assert cur.fetchone() == (1,), (row[0], name, wkt)


def test_postgis_option_without_the_extension_is_one_clear_error(mariadb_source, source_db, postgres_server,
                                                                  postgres_db):
    """``spatial: postgis`` on a database without PostGIS fails the load with a line saying what to do."""
    config = attrs.evolve(postgres_server.target_config(postgres_db), spatial="postgis")
    load = PostgresqlLoad(config, pipeline="spatial")
    batch = Batch("spatial", 1, 1, Position("b.000001", 4), Position("b.000001", 5),
                  (RowChange(Op.INSERT, "app", "t", ("id",), None, {"id": 1}, Position("b.000001", 5)),))
    try:
        with pytest.raises(LoadError, match="no PostGIS extension.*CREATE EXTENSION postgis"):
            load.load(batch)
    finally:
        load.close()


@pytest.mark.parametrize("postgis", [True, False], ids=["postgis", "bytea"])
def test_a_snapshot_copies_spatial_columns_and_its_binlog_changes_follow(postgis, tmp_path, mariadb_source,
                                                                         source_db, postgres_server, postgres_db):
    """``start: snapshot``: setl creates geometry (or bytea) columns, copies the rows, then applies the
    binlog's changes to them; the target ends equal to the source value by value."""
    if postgis:
        postgres_server.query("CREATE EXTENSION postgis", dbname=postgres_db)
    _run(mariadb_source, source_db, [CREATE])
    write_rows(mariadb_source, source_db)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=2601 + postgis, start="snapshot"),
                       target=postgres_target(postgres_server, postgres_db),
                       tables=[{"source": rf"{re.escape(source_db)}\.shapes", "target": "app.{table}"}])
    with spawned(setl) as proc:
        def copied() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            row = setl.status()
            return bool(row["snapshot"]) and all(s["status"] == "done" for s in row["snapshot"])

        wait_until(copied, timeout=120, interval=0.5, message=lambda: f"snapshot done: {setl.status()}")
        write_rows(mariadb_source, source_db, first=10)  # binlog changes after the copy
        _run(mariadb_source, source_db, ["UPDATE shapes SET l = ST_GeomFromText('LINESTRING(9 9,8 8)') WHERE id = 1",
                                         "DELETE FROM shapes WHERE id = 2"])
        assert setl.stop(proc) == 0
    result = setl.start_until_caught_up(timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    types = set(postgres_types(postgres_server, postgres_db, "app").values())
    if postgis:
        assert types == {pg for _, pg in COLUMNS.values()}
        assert postgres_forms(postgres_server, postgres_db, "app", "text") == source_forms(mariadb_source, source_db,
                                                                                            "text")
    else:
        assert types == {"bytea"}
    wkb = postgres_forms(postgres_server, postgres_db, "app", "postgis-wkb" if postgis else "raw")
    assert wkb == source_forms(mariadb_source, source_db, "wkb")
    assert [r[0] for r in wkb] == [1, 4, 10, 11, 13]


def test_parquet_holds_wkb_and_sqlite_the_servers_bytes(tmp_path):
    """Parquet writes each spatial value's WKB (the before-key of an update too); SQLite a BLOB of
    the server's bytes."""
    one = Geometry(bytes.fromhex("e6100000" "0101000000000000000000f83f00000000000002c0"))  # POINT(1.5 -2.25), 4326
    two = Geometry(bytes.fromhex("00000000" "0101000000000000000000f03f0000000000000040"))  # POINT(1 2)
    changes = (RowChange(Op.INSERT, "app", "s", ("k",), None, {"k": one, "g": two}, Position("b.000001", 10)),
               RowChange(Op.UPDATE, "app", "s", ("k",), {"k": one, "g": two}, {"k": two, "g": None},
                         Position("b.000001", 20)))
    batch = Batch("spatial", 1, 1, Position("b.000001", 4), Position("b.000001", 30), changes)
    ParquetLoad(tmp_path / "pq", pipeline="spatial").load(batch)
    table = read_table(tmp_path / "pq", "app.s").sort_by("_setl_seq")
    assert table.column("k").to_pylist() == [one.wkb, two.wkb]
    assert table.column("g").to_pylist() == [two.wkb, None]
    assert table.column("_setl_before_k").to_pylist() == [None, one.wkb]
    sqlite = SqliteLoad(tmp_path / "t.db", pipeline="spatial")
    sqlite.open()
    try:
        sqlite.load(batch)
        rows = sqlite.db.execute('SELECT k, g FROM "app.s"').fetchall()
    finally:
        sqlite.close()
    assert rows == [(two.data, None)]


@pytest.mark.parametrize("spatial", ["postgis", "wkb", "wkt"])
def test_copy_sends_spatial_values_in_the_targets_form(spatial, postgres_server, postgres_db):
    """Upserts and keyless inserts that go by COPY carry spatial values in the same form as bound
    parameters do (a geometry, WKB or WKT column each gets its own)."""
    if spatial == "postgis":
        postgres_server.query("CREATE EXTENSION postgis", dbname=postgres_db)
    kind = {"postgis": "geometry", "wkb": "bytea", "wkt": "text"}[spatial]
    postgres_server.query(f"CREATE SCHEMA app; CREATE TABLE app.keyed (id int PRIMARY KEY, g {kind}); "
                          f"CREATE TABLE app.loose (g {kind})", dbname=postgres_db)
    value = Geometry(bytes.fromhex("110f0000" "0101000000000000000000f83f00000000000002c0"))  # POINT(1.5 -2.25), 3857
    changes = tuple(RowChange(Op.INSERT, "app", table, key, None, {"id": n, "g": value} if key else {"g": value},
                              Position("b.000001", 10 + n))
                    for table, key in (("keyed", ("id",)), ("loose", ())) for n in range(3))
    config = attrs.evolve(postgres_server.target_config(postgres_db), spatial=spatial)
    load = PostgresqlLoad(config, pipeline="spatial", copy_rows=2)
    try:
        load.load(Batch("spatial", 1, 1, Position("b.000001", 4), Position("b.000001", 30), changes))
    finally:
        load.close()
    shown = {"postgis": "ST_AsText(g) || ' ' || ST_SRID(g)", "wkb": "encode(g, 'hex')", "wkt": "g"}[spatial]
    expected = {"postgis": "POINT(1.5 -2.25) 3857", "wkb": value.wkb.hex(), "wkt": "POINT(1.5 -2.25)"}[spatial]
    for table in ("keyed", "loose"):
        rows = postgres_server.query(f"SELECT {shown} FROM app.{table}", dbname=postgres_db)
        assert [r[0] for r in rows] == [expected] * 3
