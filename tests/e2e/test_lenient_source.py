"""A MariaDB target applies what a non-strict source session stored (issue 26.3), and nothing
looser: the ENUM error value '' lands as '' (index 0), strings the source cut and numbers it
clamped land as stored, and an ALTER the source ran non-strict (narrowing a column, cutting its
values) runs under the source's sql_mode. A row the target cannot hold as the source stored it
still stops the pipeline."""

from __future__ import annotations

import contextlib

import pytest

from setl.model import Batch, DdlChange, Op, Position, RowChange
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from tests.e2e.setl_process import mysql_target
from tests.schema.test_schema import make

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(180)

TABLE = "(id INT PRIMARY KEY, s VARCHAR(3), e ENUM('a','b') NOT NULL, n TINYINT, d DECIMAL(4,1), c CHAR(2))"
KEYLESS = "(s VARCHAR(3), e ENUM('a','b'))"


def _source_session(server, db: str, statements: list[str]) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # as many older applications run
        for sql in statements:
            cur.execute(sql)
        conn.commit()


def test_values_a_non_strict_source_stored_land_as_stored(mariadb_source, source_db, mariadb_target, mysql_db,
                                                          tmp_path):
    for server, db in ((mariadb_source, source_db), (mariadb_target, mysql_db)):
        server.query(f"CREATE TABLE `{db}`.t {TABLE}")
        server.query(f"CREATE TABLE `{db}`.loose {KEYLESS}")
    start = binlog_head(mariadb_source)
    _source_session(mariadb_source, source_db, [
        "INSERT INTO t VALUES (1, 'abcdef', 'zzz', 1000, 12345.67, 'abc'), (2, 'ok', 'a', -1000, -0.06, 'x'),"
        " (3, 'xy', 'b', 5, 1.5, 'yy')",
        "UPDATE t SET e = 'nope', s = 'longer' WHERE id = 3",
        "INSERT INTO loose VALUES ('abcd', 'q'), ('abcd', 'q'), ('z', 'a')",
        "DELETE FROM loose WHERE s = 'z'",
        "ALTER TABLE t MODIFY s VARCHAR(1)",  # cuts the stored values
        "INSERT INTO t VALUES (4, 'long', 'c', 1, 1, '')",
    ])
    load = MysqlLoad(mariadb_target.target_config(), pipeline="lenient", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.(t|loose)", f"{mysql_db}.{{table}}")], load,
              tmp_path)
    for table in ("t", "loose"):
        query = f"SELECT * FROM `{{}}`.`{table}` ORDER BY 1, 2"
        expected = mariadb_source.query(query.format(source_db))
        assert mariadb_target.query(query.format(mysql_db)) == expected
        checksum = f"CHECKSUM TABLE `{{}}`.`{table}`"
        assert mariadb_target.query(checksum.format(mysql_db))[0][1] == \
            mariadb_source.query(checksum.format(source_db))[0][1]
    assert ("", 1) in [(e, 1) for (e,) in mariadb_target.query(f"SELECT e FROM `{mysql_db}`.t WHERE id = 1")]
    # the session is strict again after the lenient row and the ALTER
    target = mariadb_target.query(f"SELECT s, e + 0 FROM `{mysql_db}`.t ORDER BY id")
    assert target == [("a", 0), ("o", 1), ("l", 0), ("l", 0)]


def test_a_value_the_target_cannot_hold_still_stops_the_pipeline(mariadb_source, source_db, mariadb_target,
                                                                 mysql_db, tmp_path):
    """A row holding the ENUM error value goes non-strict, but a value cut by a narrower target
    column in that row is refused as strict mode refuses it."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t {TABLE}")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.t {TABLE.replace('VARCHAR(3)', 'VARCHAR(2)')}")
    start = binlog_head(mariadb_source)
    _source_session(mariadb_source, source_db, ["INSERT INTO t VALUES (1, 'abc', 'zzz', 1, 1, 'a')"])
    load = MysqlLoad(mariadb_target.target_config(), pipeline="lenient", position_schema=mysql_db)
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\.t", f"{mysql_db}.t")], load, tmp_path,
                          outcome=Outcome.PAUSED)
    assert "Data too long for column 's'" in str(scheduler.error) or "Data truncated for column 's'" in str(
        scheduler.error), scheduler.error
    assert mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.t") == [(0,)]


def test_snapshot_reads_holding_the_enum_error_value_load(mariadb_target, mysql_db):
    """Reads (snapshot rows) holding '' in an ENUM column, in the keyed and the keyless path, loaded
    twice (the second time over the same keys)."""
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.t {TABLE}")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.loose {KEYLESS}")
    rows = [{"id": 1, "s": "abc", "e": "", "n": 127, "d": 999.9, "c": "ab"},
            {"id": 2, "s": "x", "e": "b", "n": 1, "d": 1, "c": ""}]
    changes = [RowChange(Op.READ, mysql_db, "t", ("id",), None, row) for row in rows]
    changes += [RowChange(Op.READ, mysql_db, "loose", (), None, {"s": "q", "e": ""})]
    load = MysqlLoad(mariadb_target.target_config(), pipeline="reads", position_schema=mysql_db)
    try:
        for n in (1, 2):
            load.load(Batch("reads", n, 1, Position("snapshot", n - 1), Position("snapshot", n), tuple(changes)))
    finally:
        load.close()
    assert mariadb_target.query(f"SELECT id, e + 0 FROM `{mysql_db}`.t ORDER BY id") == [(1, 0), (2, 2)]
    assert mariadb_target.query(f"SELECT s, e + 0 FROM `{mysql_db}`.loose") == [("q", 0), ("q", 0)]


def test_a_source_mode_the_target_does_not_know_runs_without_the_unknown_names(mariadb_target, mysql_db):
    """A MariaDB source's sql_mode names a mode a MySQL 8 target refuses (error 1231, as
    NO_AUTO_CREATE_USER there): the DDL runs under the names the target knows (non-strict, as the
    source ran it), and the session is strict again after it."""
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.n (id INT PRIMARY KEY, s VARCHAR(5))")
    mariadb_target.query(f"INSERT INTO `{mysql_db}`.n VALUES (1, 'abcde')")
    alter = DdlChange(mysql_db, "n", f"ALTER TABLE `{mysql_db}`.n MODIFY s VARCHAR(2)", Position("b", 2),
                      sql_mode="NO_SUCH_MODE,NO_ENGINE_SUBSTITUTION")
    insert = RowChange(Op.INSERT, mysql_db, "n", ("id",), None, {"id": 2, "s": "xyz"}, Position("b", 3))
    load = MysqlLoad(mariadb_target.target_config(), pipeline="modes", position_schema=mysql_db)
    try:
        load.load(Batch("modes", 1, 1, Position("b", 1), Position("b", 2), (alter,)))
        assert mariadb_target.query(f"SELECT s FROM `{mysql_db}`.n") == [("ab",)]
        with pytest.raises(Exception, match="Data too long|Data truncated"):  # strict again
            load.load(Batch("modes", 2, 1, Position("b", 2), Position("b", 3), (insert,)))
    finally:
        load.close()


def test_a_snapshot_start_copies_what_a_non_strict_source_stored(mariadb_source, source_db, mariadb_target, mysql_db,
                                                                 tmp_path):
    """`start: snapshot`: the rows a non-strict session stored (the ENUM error value, cut strings,
    clamped numbers) are copied as stored into the keyed and the keyless table, and the binlog
    changes after the copy land as stored too."""
    for table, shape in (("t", TABLE), ("loose", KEYLESS)):
        mariadb_source.query(f"CREATE TABLE `{source_db}`.{table} {shape}")
    _source_session(mariadb_source, source_db, [
        "INSERT INTO t VALUES (1, 'abcdef', 'zzz', 1000, 12345.67, 'abc'), (2, 'ok', 'a', -1000, -0.06, 'x')",
        "INSERT INTO loose VALUES ('abcd', 'q'), ('abcd', 'q'), ('z', 'a')",
    ])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.(t|loose)", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    _source_session(mariadb_source, source_db, [
        "UPDATE t SET e = 'nope', s = 'longer' WHERE id = 2",
        "INSERT INTO t VALUES (3, 'xyzw', 'c', 300, 1, 'abc')",
        "DELETE FROM loose WHERE s = 'z'",
        "INSERT INTO loose VALUES ('wxyz', 'r')",
    ])
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    for table in ("t", "loose"):
        query = f"SELECT * FROM `{{}}`.`{table}` ORDER BY 1, 2"
        assert mariadb_target.query(query.format(mysql_db)) == mariadb_source.query(query.format(source_db))
        checksum = f"CHECKSUM TABLE `{{}}`.`{table}`"
        assert mariadb_target.query(checksum.format(mysql_db))[0][1] == \
            mariadb_source.query(checksum.format(source_db))[0][1]
    assert mariadb_target.query(f"SELECT s, e + 0 FROM `{mysql_db}`.t ORDER BY id") == [("abc", 0), ("lon", 0),
                                                                                         ("xyz", 0)]
