"""Sequences replicate into a MariaDB target: CREATE, ALTER and DROP SEQUENCE run there with names
mapped by the table rules, and the state rows NEXTVAL and SETVAL write on the source are applied,
so the target's sequence gives the source's next value. A PostgreSQL target keeps not replicating
them (state rows dropped, sequence DDL skipped)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from setl.model import Batch, DdlChange, Position
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from tests.e2e.setl_process import mysql_target, postgres_target
from tests.schema.test_schema import make

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(240)

STATE = ("SELECT next_not_cached_value, minimum_value, maximum_value, start_value, increment, cache_size, "
         "cycle_option, cycle_count FROM `{}`.`{}`")


def _run(server: Any, db: str, statements: list[str]) -> None:
    with contextlib.closing(server.connect(database=db, autocommit=False)) as conn, conn.cursor() as cur:
        for sql in statements:
            if sql in ("BEGIN", "COMMIT"):
                getattr(conn, "begin" if sql == "BEGIN" else "commit")()
                continue
            cur.execute(sql)
            cur.fetchall()
        conn.commit()


WORKLOAD = [
    "CREATE SEQUENCE s1 START WITH 100 CACHE 3",
    "CREATE SEQUENCE s2",
    "CREATE SEQUENCE s3 START WITH 10 INCREMENT BY 10 NOCACHE",
    "CREATE TABLE t (id BIGINT PRIMARY KEY, v INT)",
    "BEGIN",
    "INSERT INTO t VALUES (NEXTVAL(s1), 1), (NEXTVAL(s1), 2), (NEXTVAL(s1), 3), (NEXTVAL(s1), 4)",
    "INSERT INTO t VALUES (NEXTVAL(s3), 5)",
    "COMMIT",
    "BEGIN",
    "INSERT INTO t VALUES (NEXTVAL(s3), 6), (NEXTVAL(s2), 7)",
    "COMMIT",
    "SELECT SETVAL(s1, 500)",
    "ALTER SEQUENCE s1 INCREMENT BY 5",
    "BEGIN",
    "INSERT INTO t VALUES (NEXTVAL(s1), 8), (NEXTVAL(s1), 9)",
    "COMMIT",
    "SELECT SETVAL(s1, 1000)",
    "DROP SEQUENCE s2",
]


def _assert_same(source: Any, source_db: str, target: Any, target_db: str, sequences: tuple[str, ...]) -> None:
    """Same rows in t, same state per sequence, and the same next NEXTVAL on both sides."""
    rows = "SELECT id, v FROM `{}`.t ORDER BY id"
    assert target.query(rows.format(target_db)) == source.query(rows.format(source_db))
    for name in sequences:
        assert target.query(STATE.format(target_db, name)) == source.query(STATE.format(source_db, name)), name
        assert (target.query(f"SELECT NEXTVAL(`{target_db}`.`{name}`)")
                == source.query(f"SELECT NEXTVAL(`{source_db}`.`{name}`)")), name


def test_sequences_into_mariadb(mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """CREATE SEQUENCE, NEXTVAL in transactions, SETVAL, ALTER and DROP SEQUENCE replicate into a
    schema the rules rename; the target sequences then give the source's next values."""
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, WORKLOAD)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="seqs", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\..*", f"{mysql_db}.{{table}}")], load, tmp_path)
    assert mariadb_target.query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
                                "TABLE_TYPE = 'SEQUENCE' ORDER BY 1", (mysql_db,)) == [("s1",), ("s3",)]
    _assert_same(mariadb_source, source_db, mariadb_target, mysql_db, ("s1", "s3"))
    shown = mariadb_target.query(f"SHOW CREATE SEQUENCE `{mysql_db}`.s1")[0][1]
    assert "increment by 5" in shown and "cache 3" in shown


def test_missing_sequence_created_from_source(mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """A pipeline started after a sequence's CREATE: its first state row creates it on the target
    (renamed schema and table) from the source's SHOW CREATE SEQUENCE, then applies the state."""
    _run(mariadb_source, source_db, ["CREATE SEQUENCE src_seq START WITH 7 INCREMENT BY 3 CACHE 2 MAXVALUE 100000"])
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, ["SELECT NEXTVAL(src_seq)", "SELECT NEXTVAL(src_seq)", "SELECT NEXTVAL(src_seq)",
                                     "SELECT SETVAL(src_seq, 40)"])
    load = MysqlLoad(mariadb_target.target_config(), pipeline="seqnew", position_schema=mysql_db)
    renamed = f"{mysql_db}_r"
    try:
        replicate(mariadb_source, start, [table_rule(rf"{source_db}\.src_seq", f"{renamed}.dst_seq")], load,
                  tmp_path)
        shown = mariadb_target.query(f"SHOW CREATE SEQUENCE `{renamed}`.dst_seq")[0][1]
        assert "maxvalue 100000" in shown and "increment by 3" in shown
        assert (mariadb_target.query(STATE.format(renamed, "dst_seq"))
                == mariadb_source.query(STATE.format(source_db, "src_seq")))
        assert mariadb_target.query(f"SELECT NEXTVAL(`{renamed}`.dst_seq)") == [(43,)]
    finally:
        mariadb_target.query(f"DROP DATABASE IF EXISTS `{renamed}`")


class _Twice(MysqlLoad):
    """Loads every batch twice in a row: a replay of a batch whose ack was lost."""

    def load(self, batch: Batch) -> None:
        super().load(batch)
        super().load(batch)


def test_replay_is_idempotent(mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """Every batch applied twice (sequence DDL recognised as replayed, state rows written again)
    leaves the target as applying each once."""
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, WORKLOAD)
    load = _Twice(mariadb_target.target_config(), pipeline="seqtwice", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\..*", f"{mysql_db}.{{table}}")], load, tmp_path)
    _assert_same(mariadb_source, source_db, mariadb_target, mysql_db, ("s1", "s3"))


def test_postgresql_keeps_sequences_out(mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """Into PostgreSQL, sequence state rows are dropped by the source and sequence DDL is skipped;
    the rows drawn from sequences arrive as plain values."""
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, WORKLOAD)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="seqpg")
    assert not load.capabilities.sequences
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\..*", f"{source_db}.{{table}}")], load, tmp_path)
    got = postgres_server.query(f'SELECT id, v FROM "{source_db}".t ORDER BY id', dbname=postgres_db)
    assert [tuple(r) for r in got] == mariadb_source.query(f"SELECT id, v FROM `{source_db}`.t ORDER BY id")
    assert postgres_server.query("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                                 (source_db,), dbname=postgres_db) == [(1,)]
    assert postgres_server.query("SELECT count(*) FROM information_schema.sequences WHERE sequence_schema = %s",
                                 (source_db,), dbname=postgres_db) == [(0,)]


def test_a_create_sequence_of_an_existing_sequence_counts_only_when_its_options_match(mariadb_target, mysql_db):
    """Outside a replay, CREATE SEQUENCE of a sequence the target has (one created from a state row,
    say) counts as applied when the options are the same, and fails when they differ; a table of
    that name is never taken for the sequence."""
    mariadb_target.query(f"CREATE SEQUENCE `{mysql_db}`.s START WITH 10 INCREMENT BY 2")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY)")

    def ddl(n: int, statement: str) -> Batch:
        change = DdlChange(mysql_db, statement.split("`.")[1].split()[0].strip("`"), statement, Position("b", n + 1))
        return Batch("seqopts", n, 1, Position("b", n), Position("b", n + 1), (change,))

    load = MysqlLoad(mariadb_target.target_config(), pipeline="seqopts", position_schema=mysql_db)
    try:
        load.load(ddl(1, f"CREATE SEQUENCE `{mysql_db}`.s START WITH 10 INCREMENT BY 2"))
        with pytest.raises(Exception, match="already exists"):
            load.load(ddl(2, f"CREATE SEQUENCE `{mysql_db}`.s START WITH 5"))
        with pytest.raises(Exception, match="already exists"):
            load.load(ddl(3, f"CREATE SEQUENCE `{mysql_db}`.t"))
    finally:
        load.close()


@pytest.mark.parametrize("target_kind", ["mariadb", "postgresql"])
def test_sequences_after_a_snapshot_start(target_kind, mariadb_source, source_db, mariadb_target, mysql_db,
                                          postgres_server, postgres_db, tmp_path):
    """`start: snapshot` copies the tables (a sequence is not a table to copy): into MariaDB, the
    NEXTVAL and SETVAL written after the copy create each sequence they touch from the source's
    definition and give it the source's state; into PostgreSQL, the rows arrive as plain values
    and no sequence."""
    _run(mariadb_source, source_db, WORKLOAD[:8])  # sequences, t, and rows drawn from them
    if target_kind == "mariadb":
        target, schema = mysql_target(mariadb_target), mysql_db
    else:
        target, schema = postgres_target(postgres_server, postgres_db), source_db
    setl = make(tmp_path, mariadb_source, target, [{"source": rf"{source_db}\..*", "target": f"{schema}.{{table}}"}],
                start="snapshot")
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    _run(mariadb_source, source_db, WORKLOAD[8:])
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    if target_kind == "mariadb":
        _assert_same(mariadb_source, source_db, mariadb_target, mysql_db, ("s1", "s3"))
        return
    got = postgres_server.query(f'SELECT id, v FROM "{source_db}".t ORDER BY id', dbname=postgres_db)
    assert [tuple(r) for r in got] == mariadb_source.query(f"SELECT id, v FROM `{source_db}`.t ORDER BY id")
    assert postgres_server.query("SELECT count(*) FROM information_schema.sequences WHERE sequence_schema = %s",
                                 (source_db,), dbname=postgres_db) == [(0,)]
