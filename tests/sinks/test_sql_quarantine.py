"""The SQL sink's quarantine on its own (docs/quarantine.md): the work `prepare` did without the
tables quarantined then is used only when the same tables are diverted at load; a quarantine that
ended between the two cuts the batch again, so no row is left out."""

from __future__ import annotations

import pytest

from setl.model import Position, Quarantined
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.sinks.sql_common import SqlLoad
from setl.sinks.sql_quarantine import QuarantineEnded, QuarantineFull

from .contract import Changes, at, make_batch


def test_a_batch_prepared_while_a_table_was_quarantined_applies_it_when_the_replay_ended_before_its_load(
        mariadb_target, mysql_db) -> None:
    """Batch 2 is prepared while `bad` is quarantined (its rows left out of the prepared work), then
    the replay ends the quarantine, then batch 2 loads: its `bad` rows are applied, not lost; batch 3,
    prepared and loaded with `bad` quarantined again by a new refusal, keeps them."""
    for table, width in (("good", 20), ("bad", 3)):
        mariadb_target.query(f"CREATE TABLE `{mysql_db}`.`{table}` (id INT PRIMARY KEY, v VARCHAR({width}))")
    good, bad = Changes(mysql_db, "good"), Changes(mysql_db, "bad")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="pq", position_schema=mysql_db,
                     on_table_error="quarantine", initial_backoff=0.01)
    try:
        load.load(make_batch([good.insert(id=0, v="warm")], id=1, pipeline="pq"))  # the row writer is ready
        first = make_batch([good.insert(id=1, v="one"), bad.insert(id=1, v="far too long")], id=2, pipeline="pq")
        load.prepare(first)
        load.load(first)
        [found] = load.quarantined()
        assert found.table == f"{mysql_db}.bad" and found.changes == 1
        second = make_batch([good.insert(id=2, v="two"), bad.insert(id=2, v="ok")], id=3, pipeline="pq")
        load.prepare(second)  # planned without `bad`
        mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad MODIFY v VARCHAR(20)")
        assert load.replay(found.table) == 1
        load.load(second)
        assert load.quarantined() == []
        assert mariadb_target.query(f"SELECT id, v FROM `{mysql_db}`.bad ORDER BY id") == [
            (1, "far too long"), (2, "ok")]
        mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad ADD CONSTRAINT small_id CHECK (id < 3)")
        third = make_batch([good.insert(id=3, v="six"), bad.insert(id=3, v="three")], id=4, pipeline="pq")
        load.prepare(third)  # prepared with nothing quarantined; refused and diverted at load
        load.load(third)
        [found] = load.quarantined()
        assert found.changes == 1 and "small_id" in found.cause, found
        assert mariadb_target.query(f"SELECT id FROM `{mysql_db}`.good ORDER BY id") == [(0,), (1,), (2,), (3,)]
        assert mariadb_target.query(f"SELECT id FROM `{mysql_db}`.bad ORDER BY id") == [(1,), (2,)]
    finally:
        load.close()


def test_a_kept_change_comes_back_the_same_in_every_field() -> None:
    """`encode`/`decode` give back a row change with its images (a partial one, NULLs, bytes, a
    decimal, a date), position, commit time, source table and sequence, and a DDL, unchanged."""
    import datetime
    import decimal

    from setl.model import DdlChange, Op, PartialImage, Position, RowChange, TableName
    from setl.sinks.sql_quarantine import decode, encode

    row = RowChange(Op.UPDATE, "db", "t", ("id",), PartialImage({"id": 1, "b": b"\x00\xff"}),
                    {"id": 1, "b": None, "d": decimal.Decimal("1.50"), "at": datetime.date(2026, 11, 28)},
                    Position("bin.000002", 77, "0-1-9", row=4), 1764300000.25, TableName("src", "t"), sequence="")
    ddl = DdlChange("db", "t", "ALTER TABLE `t` ADD COLUMN w INT", Position("bin.000002", 99))
    for change in (row, ddl, RowChange(Op.DELETE, "db", "t", (), {"x": 1}, None)):
        back = decode(encode(change))
        assert back == change and type(back) is type(change)
        assert getattr(back, "source", None) == getattr(change, "source", None)
        assert getattr(back, "sequence", None) == getattr(change, "sequence", None)
        if isinstance(change, RowChange):
            assert type(back.before) is type(change.before) and back.position == change.position
            assert back.position is None or back.position.gtid == change.position.gtid


def test_runs_of_kept_changes_come_back_in_order_with_each_ddl_alone() -> None:
    """`encode_runs` keeps consecutive row changes together (at most `_RUN_ROWS` a row, a pickle over
    `_RUN_BYTES` cut in two) and a DDL alone; `decode_run` gives every change back in order, and reads
    a row kept one change a row (by an earlier build) as a run of one."""
    from setl.model import DdlChange, Op, Position, RowChange
    from setl.sinks import sql_quarantine
    from setl.sinks.sql_quarantine import _RUN_BYTES, _RUN_ROWS, decode_run, encode, encode_runs

    def row(i: int, size: int = 8) -> RowChange:
        return RowChange(Op.INSERT, "db", "t", ("id",), None, {"id": i, "v": "x" * size},
                         Position("bin.000003", 100 + i, row=i % 3))

    ddl = DdlChange("db", "t", "ALTER TABLE `t` ADD COLUMN w INT", Position("bin.000003", 99))
    changes = [*(row(i) for i in range(_RUN_ROWS + 5)), ddl, ddl, row(-1),
               *(row(i, _RUN_BYTES // 3) for i in range(4))]
    runs = encode_runs(changes)
    assert [count for count, _ in runs] == [_RUN_ROWS, 5, 1, 1, 2, 1, 2]
    assert all(len(blob) <= _RUN_BYTES for count, blob in runs if count > 1)
    assert [change for _, blob in runs for change in decode_run(blob)] == changes
    assert decode_run(encode(changes[0])) == [changes[0]] and decode_run(encode(ddl)) == [ddl]
    assert sql_quarantine.decode(encode(ddl)) == ddl


def test_a_replay_that_ends_inside_a_run_keeps_the_rest_of_it_numbered_and_counted(mariadb_target, mysql_db,
                                                                                 monkeypatch) -> None:
    """Kept in runs of 10, a replay of 5 changes rewrites the first run with its 5 last changes
    under the same number at its new first change's position; the mark's counts stay equal to what
    the kept table holds (changes and bytes), and the next read numbers the changes on from 6."""
    from setl.sinks import sql_quarantine

    monkeypatch.setattr(sql_quarantine, "_RUN_ROWS", 10)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="pr", position_schema=mysql_db,
                     on_table_error="quarantine", max_attempts=1)
    good = Changes(mysql_db, "good")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.good (id INT PRIMARY KEY)")
    kept_table, marks = f"`{mysql_db}`.setl_position_kept", f"`{mysql_db}`.setl_position_quarantine"
    try:
        load.load(make_batch([good.insert(id=0)], id=1, pipeline="pr"))  # the quarantine tables exist
        assert load.quarantine is not None
        store = load.quarantine.store
        changes = [at(good.insert(id=i), 1000 + i, i % 2) for i in range(1, 26)]
        conn = mariadb_target.connect()
        try:
            first = Position("mysql-bin.000001", 4)
            store.mark(conn, "x.t", "refused", first)
            record = store.keep(conn, Quarantined("x.t", "refused", first, 0, 0), changes, context={}, last_seq=0)
            conn.commit()

            def held() -> tuple:
                with conn.cursor() as cur:
                    cur.execute(f"SELECT (SELECT COUNT(*) FROM {kept_table}), (SELECT SUM(LENGTH(`change`)) FROM"
                                f" {kept_table}), (SELECT changes FROM {marks}), (SELECT nbytes FROM {marks}),"
                                f" (SELECT GROUP_CONCAT(seq, '@', `offset` ORDER BY seq) FROM {kept_table})")
                    return cur.fetchone()

            rows, size, counted, nbytes, seqs = held()
            assert (rows, counted, nbytes, seqs) == (3, 25, size, "10@1001,20@1011,25@1021")
            assert record.changes == 25 and record.nbytes == size
            read = store.first_kept(conn, "x.t", 5)
            assert [k.seq for k in read] == list(range(1, 11)) and [k.change for k in read] == changes[:10]
            left = store.drop_kept(conn, record, read, 5)
            conn.commit()
            rows, size, counted, nbytes, seqs = held()
            assert (rows, counted, nbytes, seqs) == (3, 20, size, "10@1006,20@1011,25@1021")
            assert (left.changes, left.nbytes) == (20, size)
            rest = store.first_kept(conn, "x.t", 100)
            assert [k.seq for k in rest] == list(range(6, 26)) and [k.change for k in rest] == changes[5:]
            assert sum(k.nbytes for k in rest) == size
            store.drop_kept(conn, left, rest, len(rest))
            assert held()[0] == 0 and held()[2:4] == (0, 0)
        finally:
            conn.rollback()
            conn.close()
    finally:
        load.close()


class _KeptByAnOlderBuild:
    """Pickles as a DdlChange whose state lacks `missing`: what a build whose DdlChange had fewer
    fields kept (attrs' ``__setstate__`` then leaves those slots unset)."""

    def __init__(self, change: object, missing: tuple[str, ...]) -> None:
        import attrs

        self.state = {f.name: getattr(change, f.name) for f in attrs.fields(type(change)) if f.name not in missing}
        self.cls = type(change)

    def __reduce__(self) -> tuple[object, ...]:
        return object.__new__, (self.cls,), self.state


def test_a_ddl_kept_by_an_older_build_comes_back_with_its_new_fields_at_their_defaults() -> None:
    """A DDL kept before its class gained fields (`logged_rows`, `ddl`) decodes with those fields at
    their defaults (the parsed model built from its statement); one lacking a field without a default
    is refused with a line naming the field, never handed on half-built."""
    import pickle

    from setl.errors import LoadError
    from setl.model import DdlChange, Position
    from setl.sinks.sql_quarantine import decode

    ddl = DdlChange("db", "t", "ALTER TABLE `t` ADD COLUMN w INT", Position("bin.000002", 99), refused="x")
    back = decode(pickle.dumps(_KeptByAnOlderBuild(ddl, ("logged_rows", "ddl")), protocol=5))
    assert back == ddl and back.logged_rows is False and back.ddl == ddl.ddl and back.refused == "x"
    with pytest.raises(LoadError, match="lacks field 'statement'"):
        decode(pickle.dumps(_KeptByAnOlderBuild(ddl, ("statement",)), protocol=5))


def _quarantine_statements(server, database: str) -> int:
    """The statements the general log holds that name `database`'s quarantine or kept table (this
    count's own statements left out)."""
    return server.query("SELECT COUNT(*) FROM mysql.general_log WHERE argument NOT LIKE '%%general_log%%'"
                        " AND (argument LIKE %s OR argument LIKE %s)",
                        (f"%{database}`.`setl_position_quarantine%", f"%{database}`.`setl_position_kept%"))[0][0]


@pytest.mark.parametrize("policy", ["pause", "quarantine"])
def test_a_pipeline_with_no_quarantined_table_sends_no_quarantine_statement_per_batch(
        mariadb_target, mysql_db, policy) -> None:
    """With no table quarantined, the quarantine is read once (at the first batch of the sink's fence
    epoch) and 30 later batches send not one statement naming the quarantine or kept table, as
    MariaDB's general log shows; the rows all land."""
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.good (id INT PRIMARY KEY, v VARCHAR(20))")
    good = Changes(mysql_db, "good")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="pn", position_schema=mysql_db,
                     on_table_error=policy, initial_backoff=0.01)
    mariadb_target.query("SET GLOBAL log_output = 'TABLE'")
    mariadb_target.query("SET GLOBAL general_log = 1")
    try:
        load.load(make_batch([good.insert(id=0, v="first")], id=1, pipeline="pn"))
        assert load.quarantine is not None and load.quarantine.reads == 1
        after_first = _quarantine_statements(mariadb_target, mysql_db)
        assert after_first > 0  # the one read at start is logged: the count below would see more
        for n in range(2, 32):
            changes = [good.insert(id=n, v=f"row {n}"), good.update({"id": n - 1, "v": f"row {n - 1}"}, v=f"now {n}")]
            load.load(make_batch(changes, id=n, pipeline="pn"))
        assert _quarantine_statements(mariadb_target, mysql_db) == after_first
        assert load.quarantine.reads == 1
        assert mariadb_target.query(f"SELECT COUNT(*), MIN(id), MAX(id) FROM `{mysql_db}`.good")[0] == (32, 0, 31)
    finally:
        mariadb_target.query("SET GLOBAL general_log = 0")
        mariadb_target.query("TRUNCATE TABLE mysql.general_log")
        load.close()


def test_a_quarantine_made_or_ended_by_another_process_is_seen(mariadb_target, mysql_db) -> None:
    """Sink A loads with nothing quarantined; sink B (another process, a later epoch) quarantines
    `bad`; A, leader again at a newer epoch, keeps `bad`'s next change instead of applying it. Then
    B replays after the fix (ending the quarantine) while A still knows `bad` quarantined: A's next
    batch applies `bad`'s change directly, nothing is left kept, and every row is there once."""
    for table, width in (("good", 20), ("bad", 3)):
        mariadb_target.query(f"CREATE TABLE `{mysql_db}`.`{table}` (id INT PRIMARY KEY, v VARCHAR({width}))")
    good, bad = Changes(mysql_db, "good"), Changes(mysql_db, "bad")

    def sink(token: str) -> MysqlLoad:
        made = MysqlLoad(mariadb_target.target_config(), pipeline="px", position_schema=mysql_db,
                         on_table_error="quarantine", initial_backoff=0.01)
        made.token = token
        return made

    a, b = sink("node-a"), sink("node-b")
    try:
        a.load(make_batch([good.insert(id=1, v="one"), bad.insert(id=1, v="ok")], id=1, epoch=1, pipeline="px"))
        b.load(make_batch([good.insert(id=2, v="two"), bad.insert(id=2, v="far too long")], id=2, epoch=2,
                          pipeline="px"))
        [found] = b.quarantined()
        assert found.changes == 1
        a.load(make_batch([good.insert(id=3, v="six"), bad.insert(id=3, v="ab")], id=3, epoch=3, pipeline="px"))
        [found] = a.quarantined()
        assert found.table == f"{mysql_db}.bad" and found.changes == 2, found  # kept, not applied
        assert mariadb_target.query(f"SELECT id FROM `{mysql_db}`.bad ORDER BY id") == [(1,)]

        mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad MODIFY v VARCHAR(20)")
        assert b.replay(found.table) == 2  # another process ends the quarantine A still knows
        a.load(make_batch([good.insert(id=4, v="four"), bad.insert(id=4, v="four")], id=4, epoch=3,
                          pipeline="px"))
        assert a.quarantined() == []
        assert a.quarantine_view() == []
        assert mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.setl_position_kept")[0][0] == 0
        assert mariadb_target.query(f"SELECT id, v FROM `{mysql_db}`.bad ORDER BY id") == [
            (1, "ok"), (2, "far too long"), (3, "ab"), (4, "four")]
        assert mariadb_target.query(f"SELECT id FROM `{mysql_db}`.good ORDER BY id") == [(1,), (2,), (3,), (4,)]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("kind", ["mariadb", "postgresql"])
def test_kept_changes_large_many_and_oddly_named_come_back_exact_at_replay(
        kind, mariadb_target, mysql_db, postgres_server, postgres_db) -> None:
    """A quarantined table keeps, in one batch, 2,500 changes (more than one INSERT's worth), some
    of 100 KB and 300 KB (past the hex and statement sizes), under a pipeline name holding ``%``
    and a quote; prepared ahead or not, the replay after the fix brings every row back exact."""
    pipeline = "p%'q"
    if kind == "mariadb":
        schema, query = mysql_db, mariadb_target.query
        for table, width in (("good", "LONGTEXT"), ("bad", "VARCHAR(3)")):
            query(f"CREATE TABLE `{schema}`.`{table}` (id INT PRIMARY KEY, v {width})")

        def sink() -> SqlLoad:
            return MysqlLoad(mariadb_target.target_config(), pipeline=pipeline, position_schema=mysql_db,
                             on_table_error="quarantine", initial_backoff=0.01)
        fix = f"ALTER TABLE `{schema}`.bad MODIFY v LONGTEXT"
    else:
        schema = "dw"

        def query(sql: str) -> list[tuple]:
            return postgres_server.query(sql, dbname=postgres_db)
        query("CREATE SCHEMA dw")
        query("CREATE TABLE dw.good (id integer PRIMARY KEY, v text)")
        query("CREATE TABLE dw.bad (id integer PRIMARY KEY, v varchar(3))")

        def sink() -> SqlLoad:
            return PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline=pipeline,
                                  on_table_error="quarantine", initial_backoff=0.01)
        fix = 'ALTER TABLE "dw"."bad" ALTER COLUMN "v" TYPE text'  # quoted: PostgreSQL, not the DDL corpus
    good, bad = Changes(schema, "good"), Changes(schema, "bad")

    def value(i: int) -> str:
        return {7: "x" * 100_000, 1500: "y" * 300_000}.get(i, f"v{i}%'\\")

    load = sink()
    try:
        load.load(make_batch([good.insert(id=0, v="a"), bad.insert(id=0, v="far too long")], id=1,
                             pipeline=pipeline))
        changes = [c for i in range(1, 1251) for c in (bad.insert(id=i, v=value(i)), good.insert(id=i, v=value(i)))]
        changes += [bad.update({"id": i, "v": value(i)}, v=value(i) + "!") for i in range(1, 1251)]
        second = make_batch(changes, id=2, pipeline=pipeline)
        load.prepare(second)  # encoded ahead on this thread, as a worker would
        load.load(second)
        [found] = load.quarantined()
        assert found.changes == 1 + 2500, found
        query(fix)
        assert load.replay(found.table, chunk=900) == found.changes
        want = [(0, "far too long")] + [(i, value(i) + "!") for i in range(1, 1251)]
        assert [tuple(r) for r in query(f"SELECT id, v FROM {schema}.bad ORDER BY id")] == want
        assert [tuple(r) for r in query(f"SELECT id, v FROM {schema}.good ORDER BY id")] == [(0, "a")] + [
            (i, value(i)) for i in range(1, 1251)]
        assert load.quarantined() == []
    finally:
        load.close()


def test_keeping_for_a_table_whose_quarantine_ended_raises_and_writes_nothing(mariadb_target, mysql_db) -> None:
    """`QuarantineStore.keep` for a table whose mark is gone (a replay ended it) raises
    `QuarantineEnded` and keeps nothing; past the bound it raises `QuarantineFull`, naming the counts."""
    load = MysqlLoad(mariadb_target.target_config(), pipeline="pk", position_schema=mysql_db,
                     on_table_error="quarantine", max_attempts=1, quarantine_max_rows=3)
    good = Changes(mysql_db, "good")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.good (id INT PRIMARY KEY)")
    try:
        load.load(make_batch([good.insert(id=1)], id=1, pipeline="pk"))  # the quarantine tables exist
        assert load.quarantine is not None
        store = load.quarantine.store
        conn = mariadb_target.connect()
        try:
            first = Position("mysql-bin.000001", 4)
            store.mark(conn, "x.t", "refused", first)
            record = Quarantined("x.t", "refused", first, 0, 0)
            record = store.keep(conn, record, [good.insert(id=2), good.insert(id=3)], context={}, last_seq=0)
            with pytest.raises(QuarantineFull, match="would keep 4 changes"):
                store.keep(conn, record, [good.insert(id=4), good.insert(id=5)], context={}, last_seq=2)
            store.release(conn, "x.t")
            with pytest.raises(QuarantineEnded, match="x.t"):
                store.keep(conn, record, [good.insert(id=6)], context={}, last_seq=2)
            with conn.cursor() as cur:  # what this transaction sees: nothing kept, no mark
                cur.execute(f"SELECT (SELECT COUNT(*) FROM `{mysql_db}`.setl_position_kept),"
                            f" (SELECT COUNT(*) FROM `{mysql_db}`.setl_position_quarantine)")
                assert cur.fetchone() == (0, 0)
        finally:
            conn.rollback()
            conn.close()
    finally:
        load.close()


def test_the_changes_of_quarantined_tables_are_told_apart_by_their_whole_qualified_names() -> None:
    """`split_tables` keeps each change of a named table by its qualified name, dots in schema and
    table names included, in order, and leaves every other change (another schema's table of the same
    bare name, a schema-level DDL) in the rest, in order."""
    from setl.model import DdlChange, Op, RowChange
    from setl.sinks.sql_load_path import split_tables

    def row(schema: str, table: str, i: int) -> RowChange:
        return RowChange(Op.INSERT, schema, table, ("id",), None, {"id": i})

    changes = [row("a.b", "c", 1), row("a", "b.c", 2), row("x", "c", 3), row("a.b", "c", 4),
               DdlChange("a.b.c", "", "CREATE DATABASE `a.b.c`"), row("a", "b", 5), row("a.b", "c.d", 6)]
    held, rest = split_tables(changes, {"a.b.c", "a.b"})
    assert held == {"a.b.c": [changes[0], changes[1], changes[3]], "a.b": [changes[5]]}
    assert rest == [changes[2], changes[4], changes[6]]
    assert split_tables(changes, set()) == ({}, changes)
