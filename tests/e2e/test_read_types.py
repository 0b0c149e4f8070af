"""Type fidelity of snapshot reads (`Op.READ`): the rows of a table of every MySQL type, as the
binlog source decodes them, loaded as reads into MariaDB and PostgreSQL targets that hold stale
versions of them, arrive as the source holds them (the same values as the binlog path, through
the targets' bulk paths), and zero and partial dates follow each target's policy."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from setl.errors import LoadError
from setl.model import Batch, Op, Position, RowChange
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.stages.load import Load, LoadWrapper
from setl.testing.harness import reference_state

from .replicate import binlog_head, replicate, table_rule
from .test_types import INVALID, invalid_date_batch, mismatches, mysql_rows, same_in_postgres, write_source

pytestmark = pytest.mark.timeout(180)


class Capture(LoadWrapper):
    """Records the row changes of every batch its inner Load applied."""

    def __init__(self, inner: Load) -> None:
        super().__init__(inner)
        self.changes: list[RowChange] = []

    def load(self, batch: Batch) -> None:
        self.inner.load(batch)
        self.changes.extend(c for c in batch.changes if isinstance(c, RowChange))


def as_reads(changes: list[RowChange], table: str) -> Batch:
    """The final row of every key as a snapshot would copy it: one READ per row, in one batch."""
    schema, name = table.split(".")
    final = reference_state([changes])[table]
    reads = tuple(RowChange(Op.READ, schema, name, ("id",), None, row, Position("snapshot", 1))
                  for _key, row in sorted(final.items()))
    return Batch("reads", 1, 1, Position("snapshot", 0), Position("snapshot", 1), reads)


def test_every_type_read_into_mariadb_replaces_stale_rows(mariadb_source, source_db, mariadb_target, mysql_db,
                                                          tmp_path):
    """Reads of every MySQL type (edge values, NULLs, JSON, blobs, decimals) over stale and missing
    rows leave a MariaDB target equal to the source by value and CHECKSUM TABLE, loaded twice."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    capture = Capture(MysqlLoad(mariadb_target.target_config(), pipeline="types", position_schema=mysql_db))
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.types", f"{mysql_db}.types")], capture, tmp_path)
    mariadb_target.query(f"UPDATE `{mysql_db}`.types SET ti = 0, vc = 'stale', j = NULL, blb = x'00' WHERE id = 1")
    mariadb_target.query(f"DELETE FROM `{mysql_db}`.types WHERE id > 2")
    batch = as_reads(capture.changes, f"{mysql_db}.types")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="reads", position_schema=mysql_db, chunk_rows=2)
    try:
        load.load(batch)
        load.load(attrs.evolve(batch, id=2))
    finally:
        load.close()
    names, expected = mysql_rows(mariadb_source, source_db)
    _, got = mysql_rows(mariadb_target, mysql_db)
    assert [r[0] for r in expected] == [1, 2, 3, 5]
    assert mismatches(names, expected, got, lambda name, a, b: a == b and type(a) is type(b)) == []
    checksum = "CHECKSUM TABLE `{}`.`types`"
    assert mariadb_target.query(checksum.format(mysql_db))[0][1] == \
        mariadb_source.query(checksum.format(source_db))[0][1]


@pytest.mark.parametrize("copy_rows", [1, 1000], ids=["copy", "insert"])
def test_every_type_read_into_postgresql_replaces_stale_rows(mariadb_source, source_db, postgres_server, postgres_db,
                                                             tmp_path, copy_rows):
    """Reads of every MySQL type over stale and missing rows leave PostgreSQL as the type mapping says,
    through COPY into a staging table and through multi-row upserts alike, loaded twice."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    capture = Capture(PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="types"))
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.types", "app.types")], capture, tmp_path)
    postgres_server.query("UPDATE app.types SET ti = 0, vc = 'stale', j = NULL, blb = '\\x00' WHERE id = 1;"
                          " DELETE FROM app.types WHERE id > 2", dbname=postgres_db)
    batch = as_reads(capture.changes, "app.types")
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="reads", copy_rows=copy_rows)
    try:
        load.load(batch)
        load.load(attrs.evolve(batch, id=2))
    finally:
        load.close()
    names, expected = mysql_rows(mariadb_source, source_db)
    got = postgres_server.query("SELECT * FROM app.types ORDER BY id", dbname=postgres_db)
    assert [r[0] for r in got] == [1, 2, 3, 5]
    assert mismatches(names, expected, got, same_in_postgres) == []


def read_batch(schema: str) -> Batch:
    """`invalid_date_batch` with its inserts as snapshot reads."""
    batch = invalid_date_batch(schema)
    return batch.replace(tuple(attrs.evolve(c, op=Op.READ) for c in batch.changes))


def test_invalid_dates_read_into_mariadb_are_stored_exactly(mariadb_target, mysql_db):
    """Zero and partial dates in reads reach MariaDB as the source's text."""
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.dates (id INT PRIMARY KEY, d DATE, dt DATETIME, p DATE,"
                         " ts TIMESTAMP NULL)")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="dates", position_schema=mysql_db)
    try:
        load.load(read_batch(mysql_db))
    finally:
        load.close()
    got = mariadb_target.query(f"SELECT id, CAST(d AS CHAR), CAST(dt AS CHAR), CAST(p AS CHAR), CAST(ts AS CHAR)"
                               f" FROM `{mysql_db}`.dates ORDER BY id")
    assert got[0] == (1, *(INVALID[c].text for c in ("d", "dt", "p", "ts")))
    assert got[1][:2] == (2, "2024-01-31")


@pytest.mark.parametrize("policy", ["refuse", "null"])
def test_invalid_dates_read_into_postgresql_follow_the_policy(postgres_server, postgres_db, policy):
    """PostgreSQL refuses zero and partial dates in reads by default (writing nothing) and writes NULL
    under invalid_dates: null, through COPY as through INSERT."""
    postgres_server.query("CREATE SCHEMA app; CREATE TABLE app.dates (id int PRIMARY KEY, d date, dt timestamp,"
                          " p date, ts timestamptz)", dbname=postgres_db)
    config = attrs.evolve(postgres_server.target_config(postgres_db), invalid_dates=policy)
    load = PostgresqlLoad(config, pipeline="dates", copy_rows=1)
    try:
        if policy == "refuse":
            with pytest.raises(LoadError, match="column d holds '0000-00-00'") as caught:
                load.load(read_batch("app"))
            assert not caught.value.retryable
        else:
            load.load(read_batch("app"))
    finally:
        load.close()
    got: list[Any] = postgres_server.query("SELECT id, d, dt, p, ts FROM app.dates ORDER BY id", dbname=postgres_db)
    if policy == "refuse":
        assert got == []
    else:
        assert got[0] == (1, None, None, None, None) and got[1][0] == 2 and got[1][1] is not None
