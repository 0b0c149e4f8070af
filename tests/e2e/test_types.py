"""Type fidelity end to end: a table of every MySQL type with edge values, written on a real MariaDB,
read from its binlog and replicated by the scheduler into MariaDB and PostgreSQL, compared value by
value. The target tables are made by the replicated CREATE TABLE itself (``pipeline.ddl: apply``)."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import struct
from typing import Any

import attrs
import pytest

from setl.config import load_node, load_pipeline
from setl.connectors import registry
from setl.errors import ConfigError, LoadError
from setl.model import Batch, InvalidDate, Op, Position, RowChange
from setl.pipeline import build_load
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from setl.sinks.parquet import ParquetLoad, read_table
from setl.sinks.postgresql import PostgresqlLoad
from setl.sinks.sqlite import SqliteLoad
from setl.transforms.frames import rows_to_table, table_to_rows
from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target
from tests.helpers.wait import wait_until

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(120)

COLUMNS = """
    id INT NOT NULL PRIMARY KEY,
    ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
    mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
    dec65 DECIMAL(65,30), dec5 DECIMAL(5,2) UNSIGNED, f FLOAT, d DOUBLE,
    day DATE, t0 TIME, t6 TIME(6), dt DATETIME(6), ts TIMESTAMP(6) NULL DEFAULT NULL, y YEAR,
    c CHAR(10), vc VARCHAR(255), txt TEXT, ltxt LONGTEXT,
    bin BINARY(8), vbin VARBINARY(16), blb BLOB,
    e ENUM('a','b','ç'), s SET('x','y','z'), b1 BIT(1), b5 BIT(5), b64 BIT(64), j JSON
"""

EMOJI = "héllo 😀🚀 ünï ✓"
ALL_BYTES = bytes(range(256))
ROWS = [
    # minimums
    (1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
     "-99999999999999999999999999999999999.999999999999999999999999999999", "0.00", -3.40282e38,
     -1.7976931348623157e308, "1000-01-01", "-838:59:59", "-838:59:59.000000", "1000-01-01 00:00:00.000000",
     "1970-01-01 00:00:01.000000", 1901, "", "", "", "", b"\x00", b"", b"", "a", "", 0, 0, 0, "{}"),
    # maximums
    (2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807,
     18446744073709551615, "99999999999999999999999999999999999.999999999999999999999999999999", "999.99",
     3.40282e38, 1.7976931348623157e308, "9999-12-31", "838:59:59", "838:59:59.000000",
     "9999-12-31 23:59:59.999999", "2038-01-19 03:14:07.999999", 2155, "z" * 10, EMOJI * 10,
     EMOJI * 1000, "x" * 70000, b"\xff" * 8, b"\xff" * 16, ALL_BYTES * 40, "ç", "x,y,z", 1, 31,
     18446744073709551615, '{"a": [1, 2.5, "😀", null], "b": {"c": true, "d": "q\\"uote"}}'),
    # fractions, signs, zeros in bytes, small magnitudes
    (3, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, "0.000000000000000000000000000001", "0.01", 1.17549e-38,
     2.2250738585072014e-308, "2024-02-29", "-00:00:01", "-00:00:01.500000", "2024-02-29 12:34:56.000001",
     "2024-02-29 12:34:56.123456", 0, "a b", "tab\there 'q' \\ back", "line\nbreak", EMOJI,
     b"\x00\x01\x00", b"\x00\xff\x00\x00", b"\x00" * 10 + b"\x01\x00\x00", "b", "x,z", 0, 5, 1 << 63,
     "[1, 2, 3]"),
]


def mysql_rows(server: Any, schema: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of `schema`.types, TIMESTAMPs read in UTC."""
    with contextlib.closing(server.connect(database=schema, init_command="SET time_zone = '+00:00'")) as conn:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{schema}`.`types` ORDER BY id")
            return [d[0] for d in cur.description], list(cur.fetchall())


def write_source(server: Any, schema: str) -> None:
    """The CREATE TABLE, the rows above, an update of every column, a delete and an all-NULL row."""
    with contextlib.closing(server.connect(database=schema, init_command="SET time_zone = '+00:00'")) as conn:
        conn.autocommit(False)
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE types ({COLUMNS}) DEFAULT CHARSET=utf8mb4")
            marks = ", ".join(["%s"] * len(ROWS[0]))
            cur.executemany(f"INSERT INTO types VALUES ({marks})", ROWS)
            cur.execute(f"INSERT INTO types VALUES ({marks})", (4, *ROWS[2][1:]))
            conn.commit()
            cur.execute("INSERT INTO types (id) VALUES (5)")
            cur.execute("UPDATE types SET ti = -2, vc = CONCAT(vc, '🙂'), blb = CONCAT(blb, x'0000'),"
                        " t6 = '-00:00:00.000001', s = '', j = '{\"k\": []}', b64 = 2 WHERE id = 3")
            cur.execute("DELETE FROM types WHERE id = 4")
            conn.commit()


def float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def same_in_postgres(name: str, source: Any, target: Any) -> bool:
    """Whether a PostgreSQL value stands for the MariaDB one, by the documented type mapping."""
    if source is None or target is None:
        return source is None and target is None
    if name == "f":
        return float32(source) == pytest.approx(float32(target), rel=1e-6)
    if name == "ts":
        return target.astimezone(datetime.timezone.utc).replace(tzinfo=None) == source
    if name == "s":
        return set(filter(None, source.split(","))) == set(filter(None, target.split(",")))
    if name.startswith("b") and name[1:].isdigit():
        return int.from_bytes(source, "big") == target
    if name == "j":
        return json.loads(source) == target
    if isinstance(source, decimal.Decimal) or isinstance(target, decimal.Decimal):
        return decimal.Decimal(source) == decimal.Decimal(target)
    return source == target and type(source) is type(target)


def mismatches(names: list[str], expected: list[tuple], got: list[tuple], same) -> list[str]:
    assert [r[0] for r in got] == [r[0] for r in expected], "the target holds other rows"
    return [f"id={want[0]} {name}: source {want[k]!r} target {have[k]!r}"
            for want, have in zip(expected, got) for k, name in enumerate(names)
            if not same(name, want[k], have[k])]


def test_every_type_round_trips_to_mariadb(mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """Every MySQL type, with its edge values and NULLs, arrives in a MariaDB target equal to the
    source, through the binlog, the scheduler and a replicated CREATE TABLE."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="types", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.types", f"{mysql_db}.types")], load, tmp_path)
    names, expected = mysql_rows(mariadb_source, source_db)
    target_names, got = mysql_rows(mariadb_target, mysql_db)
    assert target_names == names and [r[0] for r in expected] == [1, 2, 3, 5]
    assert mismatches(names, expected, got, lambda name, a, b: a == b and type(a) is type(b)) == []
    checksum = "CHECKSUM TABLE `{}`.`types`"
    assert mariadb_target.query(checksum.format(mysql_db))[0][1] == \
        mariadb_source.query(checksum.format(source_db))[0][1]


def test_every_type_round_trips_to_postgresql(mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """Every MySQL type, with its edge values and NULLs, arrives in PostgreSQL as the type mapping
    says: the replicated CREATE TABLE is translated and each value compares equal."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="types")
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.types", "app.types")], load, tmp_path)
    names, expected = mysql_rows(mariadb_source, source_db)
    got = postgres_server.query("SELECT * FROM app.types ORDER BY id", dbname=postgres_db)
    assert [r[0] for r in expected] == [1, 2, 3, 5]
    assert mismatches(names, expected, got, same_in_postgres) == []


def test_table_without_primary_key_reaches_both_targets(mariadb_source, source_db, mariadb_target, mysql_db,
                                                        postgres_server, postgres_db, tmp_path):
    """A keyless table with duplicate rows and NULLs ends equal to the source in MariaDB and
    PostgreSQL: each update or delete hits one row equal in every column."""
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE loose (name VARCHAR(8), qty INT, note TEXT)")
        cur.execute("INSERT INTO loose VALUES ('a', 1, NULL), ('a', 1, NULL), ('a', 1, NULL), (NULL, 2, 'x'),"
                    " (NULL, NULL, NULL), (NULL, NULL, NULL)")
        cur.execute("DELETE FROM loose WHERE name = 'a' LIMIT 1")
        cur.execute("UPDATE loose SET qty = 5 WHERE name IS NULL AND qty IS NULL LIMIT 1")
        cur.execute("UPDATE loose SET note = 'y' WHERE name = 'a' LIMIT 1")
        cur.execute("DELETE FROM loose WHERE note = 'x'")
    rule = rf"{source_db}\.loose"
    replicate(mariadb_source, start, [table_rule(rule, f"{mysql_db}.loose")],
              MysqlLoad(mariadb_target.target_config(), pipeline="loose", position_schema=mysql_db), tmp_path,
              name="loose_mysql")
    replicate(mariadb_source, start, [table_rule(rule, "app.loose")],
              PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="loose"), tmp_path,
              name="loose_pg")
    expected = sorted(mariadb_source.query(f"SELECT * FROM `{source_db}`.loose"), key=repr)
    assert expected == sorted([("a", 1, None), ("a", 1, "y"), (None, None, None), (None, 5, None)], key=repr)
    assert sorted(mariadb_target.query(f"SELECT * FROM `{mysql_db}`.loose"), key=repr) == expected
    assert sorted(postgres_server.query("SELECT * FROM app.loose", dbname=postgres_db), key=repr) == expected


# -- zero and partial dates (InvalidDate), loaded directly as the binlog source hands them on

INVALID = {"d": InvalidDate("0000-00-00"), "dt": InvalidDate("2024-00-15 10:00:00"),
           "p": InvalidDate("2024-00-15"), "ts": InvalidDate("0000-00-00 00:00:00")}


def invalid_date_batch(schema: str, table: str = "dates") -> Batch:
    """A batch inserting a row of zero and partial dates (id 1) and a row of real ones (id 2)."""
    good = {"id": 2, "d": datetime.date(2024, 1, 31), "dt": datetime.datetime(2024, 1, 31, 10),
            "p": datetime.date(2024, 2, 29), "ts": datetime.datetime(2024, 1, 31, 10)}
    changes = tuple(RowChange(Op.INSERT, schema, table, ("id",), None, image, Position("bin.000001", 100 + n))
                    for n, image in enumerate([{"id": 1, **INVALID}, good]))
    return Batch("dates", 1, 1, Position("bin.000001", 4), Position("bin.000001", 200), changes)


def test_invalid_dates_are_stored_exactly_in_mariadb(mariadb_target, mysql_db):
    """Zero and partial DATE, DATETIME and TIMESTAMP values reach a MariaDB target as the source's text."""
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.dates (id INT PRIMARY KEY, d DATE, dt DATETIME, p DATE,"
                         " ts TIMESTAMP NULL, q DATE)")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="dates", position_schema=mysql_db)
    batch = invalid_date_batch(mysql_db)
    impossible = RowChange(Op.INSERT, mysql_db, "dates", ("id",), None, {"id": 3, "q": InvalidDate("2024-02-30")},
                           Position("bin.000001", 150))
    try:
        load.load(batch.replace((*batch.changes, impossible)))
    finally:
        load.close()
    got = mariadb_target.query(f"SELECT id, CAST(d AS CHAR), CAST(dt AS CHAR), CAST(p AS CHAR), CAST(ts AS CHAR),"
                               f" CAST(q AS CHAR) FROM `{mysql_db}`.dates ORDER BY id")
    assert got[0] == (1, "0000-00-00", "2024-00-15 10:00:00", "2024-00-15", "0000-00-00 00:00:00", None)
    assert got[2][5] == "2024-02-30"
    assert got[1][:4] == (2, "2024-01-31", "2024-01-31 10:00:00", "2024-02-29")


def test_invalid_dates_are_refused_by_postgresql_by_default(postgres_server, postgres_db):
    """PostgreSQL (invalid_dates: refuse) fails the batch permanently, naming table, column, position and
    value, and writes nothing."""
    postgres_server.query("CREATE SCHEMA app; CREATE TABLE app.dates (id int PRIMARY KEY, d date, dt timestamp,"
                          " p date, ts timestamptz)", dbname=postgres_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="dates")
    try:
        with pytest.raises(LoadError) as caught:
            load.load(invalid_date_batch("app"))
    finally:
        load.close()
    text = str(caught.value)
    assert not caught.value.retryable and "\n" not in text
    assert "table=app.dates" in text and "position=bin.000001:100" in text
    assert "column d holds '0000-00-00'" in text
    assert postgres_server.query("SELECT count(*) FROM app.dates", dbname=postgres_db) == [(0,)]


def test_invalid_dates_become_null_in_postgresql_when_configured(postgres_server, postgres_db, caplog):
    """PostgreSQL with invalid_dates: null writes NULL for each invalid date, keeps the real ones, and warns
    with the count."""
    postgres_server.query("CREATE SCHEMA app; CREATE TABLE app.dates (id int PRIMARY KEY, d date, dt timestamp,"
                          " p date, ts timestamptz)", dbname=postgres_db)
    config = attrs.evolve(postgres_server.target_config(postgres_db), invalid_dates="null")
    load = PostgresqlLoad(config, pipeline="dates")
    try:
        load.load(invalid_date_batch("app"))
    finally:
        load.close()
    got = postgres_server.query("SELECT id, d, dt, p FROM app.dates ORDER BY id", dbname=postgres_db)
    assert got == [(1, None, None, None),
                   (2, datetime.date(2024, 1, 31), datetime.datetime(2024, 1, 31, 10), datetime.date(2024, 2, 29))]
    assert any("4 invalid date value(s) written as NULL" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)


def test_invalid_dates_in_parquet_and_sqlite(tmp_path):
    """Parquet refuses invalid dates by default and writes NULL under invalid_dates: null; SQLite stores the
    text."""
    with pytest.raises(LoadError) as caught:
        ParquetLoad(tmp_path / "refuse", pipeline="dates").load(invalid_date_batch("app"))
    assert not caught.value.retryable and "column d holds '0000-00-00'" in str(caught.value)
    ParquetLoad(tmp_path / "null", pipeline="dates", invalid_dates="null").load(invalid_date_batch("app"))
    table = read_table(tmp_path / "null", "app.dates").sort_by("id")
    assert table.column("d").to_pylist() == [None, datetime.date(2024, 1, 31)]
    sqlite = SqliteLoad(tmp_path / "t.db", pipeline="dates")
    sqlite.open()
    try:
        sqlite.load(invalid_date_batch("app"))
        row = sqlite.db.execute('SELECT d, dt, p, ts FROM "app.dates" WHERE id = 1').fetchone()
    finally:
        sqlite.close()
    assert row == tuple(INVALID[c].text for c in ("d", "dt", "p", "ts"))


def test_invalid_dates_cross_the_arrow_conversion_of_transforms():
    """A date column holding InvalidDate goes to Arrow as ISO text (what a Spark transform sees) and comes
    back as the same dates, datetimes and InvalidDate values."""
    rows = [{"d": datetime.date(2024, 1, 31), "ts": datetime.datetime(2024, 1, 31, 10, tzinfo=datetime.timezone.utc)},
            {"d": INVALID["d"], "ts": INVALID["ts"]}, {"d": None, "ts": None}]
    table, codecs = rows_to_table(rows)
    assert table.column("d").to_pylist() == ["2024-01-31", "0000-00-00", None]
    assert table_to_rows(table, codecs) == rows


ODD_NAMES = ["a%b", "100%", 'q"uote', "back`tick", "with space", "ünï✓", "c" * 64]


def write_odd_names(server: Any, schema: str) -> None:
    """Keyed (on a column named i%d) and keyless tables whose columns have odd names, with inserts, an
    update and a delete."""
    columns = ", ".join(f"`{n.replace('`', '``')}` VARCHAR(20)" for n in ODD_NAMES)
    names = ", ".join(f"`{n.replace('`', '``')}`" for n in ODD_NAMES).replace("%", "%%")
    marks = ", ".join(["%s"] * len(ODD_NAMES))
    with contextlib.closing(server.connect(database=schema)) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE odd (`i%d` INT PRIMARY KEY, {columns}) DEFAULT CHARSET=utf8mb4")
        cur.execute(f"CREATE TABLE odd_loose ({columns}) DEFAULT CHARSET=utf8mb4")
        for table, extra in (("odd", "`i%%d`, "), ("odd_loose", "")):
            for n in range(3):
                values = [f"{k}-{n}%s" for k in range(len(ODD_NAMES))]
                cur.execute(f"INSERT INTO {table} ({extra}{names}) VALUES ({'%s, ' if extra else ''}{marks})",
                            ([n] if extra else []) + values)
            cur.execute(f"UPDATE {table} SET `a%b` = 'changed %', `with space` = NULL WHERE `100%` = '1-1%s'")
            cur.execute(f"DELETE FROM {table} WHERE `100%` = '2-2%s'")


def test_odd_column_names_reach_both_targets(mariadb_source, source_db, mariadb_target, mysql_db, postgres_server,
                                             postgres_db, tmp_path):
    """Columns named with %, double quotes, backticks, spaces, unicode and 64 characters are created, written,
    updated and deleted in MariaDB and PostgreSQL targets equal to the source."""
    start = binlog_head(mariadb_source)
    write_odd_names(mariadb_source, source_db)
    for table in ("odd", "odd_loose"):
        rule = [table_rule(rf"{source_db}\.{table}", f"{mysql_db}.{table}")]
        replicate(mariadb_source, start, rule,
                  MysqlLoad(mariadb_target.target_config(), pipeline=f"{table}_m", position_schema=mysql_db),
                  tmp_path, name=f"{table}_m")
        rule = [table_rule(rf"{source_db}\.{table}", f"app.{table}")]
        replicate(mariadb_source, start, rule, PostgresqlLoad(postgres_server.target_config(postgres_db),
                                                            pipeline=f"{table}_p"), tmp_path, name=f"{table}_p")
        expected = sorted(mariadb_source.query(f"SELECT * FROM `{source_db}`.{table}"), key=repr)
        assert len(expected) == 3 and ("changed %",) in [(r[-7],) for r in expected]
        assert sorted(mariadb_target.query(f"SELECT * FROM `{mysql_db}`.{table}"), key=repr) == expected
        assert sorted(postgres_server.query(f"SELECT * FROM app.{table}", dbname=postgres_db), key=repr) == expected


def test_binary_collations_and_charsets_reach_postgresql(mariadb_source, source_db, postgres_server, postgres_db,
                                                        tmp_path):
    """CHAR(n) BINARY, VARCHAR BINARY, CHARACTER SET / COLLATE clauses and CHARACTER SET binary translate for
    PostgreSQL and the values arrive equal; a binary collation keeps byte order (COLLATE "C")."""
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE coll (id INT PRIMARY KEY, a CHAR(10) BINARY NOT NULL,"
                    " b VARCHAR(20) BINARY CHARACTER SET utf8mb4, c VARCHAR(5) COLLATE utf8mb4_bin,"
                    " d TEXT CHARACTER SET latin1 COLLATE latin1_swedish_ci, e CHAR(4) CHARACTER SET binary,"
                    " f NATIONAL VARCHAR(4), UNIQUE KEY (a)) DEFAULT CHARSET=utf8mb4")
        cur.execute("INSERT INTO coll VALUES (1, 'a', 'Zé', 'x', 'çà', 'ab', 'n'),"
                    " (2, 'A', 'zé', 'X', 'e', x'00ff', 'm')")
        cur.execute("ALTER TABLE coll ADD COLUMN g CHAR(2) BINARY NOT NULL")
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.coll", "app.coll")],
              PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="coll"), tmp_path)
    expected = mariadb_source.query(f"SELECT * FROM `{source_db}`.coll ORDER BY id")
    assert postgres_server.query("SELECT * FROM app.coll ORDER BY id", dbname=postgres_db) == expected
    assert [r[0] for r in postgres_server.query("SELECT a FROM app.coll ORDER BY a", dbname=postgres_db)] == ["A", "a"]


GENERATED = [
    "CREATE TABLE gen (id INT PRIMARY KEY, a INT, v INT AS (a * 2) VIRTUAL, s VARCHAR(12) AS (CONCAT('s', a))"
    " STORED, p INT GENERATED ALWAYS AS (a + 1) PERSISTENT)",
    "CREATE TABLE gen_loose (a INT, v INT AS (a * 3) VIRTUAL, s INT AS (a - 1) STORED)",
    "INSERT INTO gen (id, a) VALUES (1, 1), (2, 2), (3, 3)",
    "INSERT INTO gen_loose (a) VALUES (1), (1), (2)",
    "UPDATE gen SET a = 10 WHERE id = 2",
    "UPDATE gen_loose SET a = 5 WHERE a = 1 LIMIT 1",
    "DELETE FROM gen WHERE id = 3",
    "ALTER TABLE gen ADD COLUMN w INT AS (a + 100) VIRTUAL",
    "INSERT INTO gen (id, a) VALUES (4, 4)",
]


def test_generated_columns_reach_both_targets(mariadb_source, source_db, mariadb_target, mysql_db, postgres_server,
                                             postgres_db, tmp_path):
    """Tables with VIRTUAL, STORED and PERSISTENT generated columns reach MariaDB (the target computes them;
    setl does not write them, even after an ALTER adds one) and PostgreSQL (plain columns holding the source's
    values) equal to the source; PostgreSQL refuses the ADD of a generated column to a table with rows."""
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        for statement in GENERATED:
            cur.execute(statement)
    rules = [table_rule(rf"{source_db}\.(gen.*)", f"{mysql_db}.{{table}}")]
    replicate(mariadb_source, start, rules, MysqlLoad(mariadb_target.target_config(), pipeline="gen_m",
                                                      position_schema=mysql_db), tmp_path, name="gen_m")
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\.(gen.*)", "app.{table}")],
                          PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="gen_p"), tmp_path,
                          name="gen_p", outcome=Outcome.PAUSED)
    assert "has rows and generated column w is a plain column on PostgreSQL" in str(scheduler.error)
    for table in ("gen", "gen_loose"):
        expected = sorted(mariadb_source.query(f"SELECT * FROM `{source_db}`.{table}"), key=repr)
        assert len(expected) == 3
        assert sorted(mariadb_target.query(f"SELECT * FROM `{mysql_db}`.{table}"), key=repr) == expected
    before_alter = [r[:5] for r in mariadb_source.query(f"SELECT * FROM `{source_db}`.gen WHERE id < 4 ORDER BY id")]
    assert postgres_server.query("SELECT * FROM app.gen ORDER BY id", dbname=postgres_db) == before_alter
    assert sorted(postgres_server.query("SELECT * FROM app.gen_loose", dbname=postgres_db), key=repr) == \
        sorted(mariadb_source.query(f"SELECT * FROM `{source_db}`.gen_loose"), key=repr)


def test_invalid_dates_policy_comes_from_the_target_config(tmp_path):
    """`invalid_dates` on a PostgreSQL or Parquet target config reaches the sink; refuse is the default and
    other values are a config error."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {tmp_path / 'meta.db'}}}\n")
    targets = {"pg": "{type: postgresql, database: x, invalid_dates: 'null'}", "pq": "{type: parquet, path: out}",
               "pqn": "{type: parquet, path: out, invalid_dates: 'null'}", "bad": "{type: parquet, path: o, "
               "invalid_dates: zero}"}
    for name, target in targets.items():
        (conf / "pipelines" / f"{name}.yaml").write_text(f"source: {{type: file, path: in.jsonl}}\ntarget: {target}\n")
    node = load_node(conf)
    loads = {name: build_load(node, load_pipeline(conf, name, registry())) for name in ("pg", "pq", "pqn")}
    policies = {"pg": loads["pg"].sql.invalid_dates.policy,
                **{name: loads[name]._invalid_dates.policy for name in ("pq", "pqn")}}
    assert policies == {"pg": "null", "pq": "refuse", "pqn": "null"}
    with pytest.raises(ConfigError, match="invalid_dates"):
        load_pipeline(conf, "bad", registry())


def test_invalid_dates_null_policy_finds_keyless_rows_again(postgres_server, postgres_db):
    """Under invalid_dates: null an update and a delete of a keyless row holding an invalid date find the row
    written with NULL; an invalid date in a primary-key column is refused even under null."""
    postgres_server.query("CREATE SCHEMA app; CREATE TABLE app.loose (n int, d date);"
                          " CREATE TABLE app.keyed (d date PRIMARY KEY)", dbname=postgres_db)
    bad, pos = InvalidDate("2024-00-15"), Position("bin.000001", 10)
    changes = (RowChange(Op.INSERT, "app", "loose", (), None, {"n": 1, "d": bad}, pos),
               RowChange(Op.INSERT, "app", "loose", (), None, {"n": 2, "d": bad}, pos),
               RowChange(Op.UPDATE, "app", "loose", (), {"n": 1, "d": bad}, {"n": 3, "d": bad}, pos),
               RowChange(Op.DELETE, "app", "loose", (), {"n": 2, "d": bad}, None, pos))
    load = PostgresqlLoad(attrs.evolve(postgres_server.target_config(postgres_db), invalid_dates="null"),
                        pipeline="loose")
    try:
        load.load(Batch("loose", 1, 1, Position("bin.000001", 4), Position("bin.000001", 20), changes))
        keyed = RowChange(Op.INSERT, "app", "keyed", ("d",), None, {"d": bad}, Position("bin.000001", 30))
        with pytest.raises(LoadError, match="column d holds '2024-00-15'.*a primary-key column"):
            load.load(Batch("loose", 2, 1, Position("bin.000001", 20), Position("bin.000001", 40), (keyed,)))
    finally:
        load.close()
    assert postgres_server.query("SELECT n, d FROM app.loose", dbname=postgres_db) == [(3, None)]


def write_old_temporals(server: Any, schema: str, fraction: int = 0) -> None:
    """A table of MariaDB's pre-10.1 temporal formats (``mysql56_temporal_format=OFF``, as 5.3-10.0 made
    them: TIME, DATETIME and TIMESTAMP of `fraction` digits), then, a second later, rows at the edges
    (zero and partial dates, negative and 838-hour TIMEs, fractions the column may cut), an update and a
    delete."""
    server.query("SET GLOBAL mysql56_temporal_format = OFF")
    try:
        digits = f"({fraction})" if fraction else ""
        with contextlib.closing(server.connect(database=schema)) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE old_times (id INT PRIMARY KEY, tm TIME{digits}, dt DATETIME{digits}, "
                        f"ts TIMESTAMP{digits} NULL DEFAULT NULL)")
    finally:
        server.query("SET GLOBAL mysql56_temporal_format = ON")
    made = server.query("SELECT UNIX_TIMESTAMP(CREATE_TIME) FROM information_schema.TABLES "
                        f"WHERE TABLE_SCHEMA = '{schema}' AND TABLE_NAME = 'old_times'")[0][0]
    wait_until(lambda: server.query("SELECT UNIX_TIMESTAMP()")[0][0] > made, timeout=5, interval=0.05,
               message="the server's clock past the table's definition")
    init = "SET time_zone = '+00:00', sql_mode = ''"
    with contextlib.closing(server.connect(database=schema, init_command=init)) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO old_times VALUES (%s, %s, %s, %s)",
                        [(1, "-838:59:59", "0000-00-00 00:00:00", "1970-01-01 00:00:01.5"),
                         (2, "838:59:59", "9999-12-31 23:59:59.999999", "2038-01-19 03:14:07.999999"),
                         (3, "-00:00:01.5", "2024-00-15 01:02:03.25", 0),
                         (4, None, "1000-01-01 00:00:00", None)])
        cur.execute("UPDATE old_times SET tm = '-12:34:56.123456', dt = '2024-02-29 12:34:56.654321', "
                    "ts = '2024-02-29 12:34:56.654321' WHERE id = 4")
        cur.execute("DELETE FROM old_times WHERE id = 2")
        conn.commit()


def old_times_rows(server: Any, schema: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(server.connect(database=schema, init_command="SET time_zone = '+00:00'")) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT * FROM old_times ORDER BY id")
            return list(cur.fetchall())


@pytest.mark.parametrize("fraction", [0, 4])
def test_mariadb_pre_10_1_temporals_replicate_through_setl_start(mariadb_source, source_db, mariadb_target, mysql_db,
                                                                 tmp_path, fraction):
    """`setl start` copies a table of MariaDB's pre-10.1 TIME, DATETIME and TIMESTAMP (a table of MariaDB
    5.3-10.0 never rebuilt), whole-second and fractional, into MariaDB equal to the source, edge values
    included."""
    start = binlog_head(mariadb_source)
    write_old_temporals(mariadb_source, source_db, fraction)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\.old_times", "target": f"{mysql_db}.{{table}}"}])
    result = setl.start_until_caught_up()
    assert result.returncode == 0, result.stderr[-3000:]
    expected = old_times_rows(mariadb_source, source_db)
    assert [r[0] for r in expected] == [1, 3, 4]
    assert (expected[2][1] % datetime.timedelta(seconds=1) != datetime.timedelta(0)) is bool(fraction)  # a fraction
    assert old_times_rows(mariadb_target, mysql_db) == expected
