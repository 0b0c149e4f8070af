"""The behaviour every SQL sink shares, as a test class each dialect's test module subclasses.

A subclass provides a `target` fixture returning a `Target` for a fresh schema. `SinkContract`
extends the connector kit's `LoadContract` (setl.testing.connectors), which every target
passes, with what SQL targets do besides: DDL, lock waits, killed sessions, epochs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from setl.errors import LoadError, TransientLoadError
from setl.model import Batch, DdlChange, Op, Position, RowChange, TableName
from setl.sinks.sql_common import SqlLoad
from setl.sinks.sql_staging import staging_name
from setl.stages.load import Load
from setl.testing.connectors import LoadContract, TableSpec, TargetProbe
from setl.testing.servers import wait_until

ITEMS_DDL = "CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT, note TEXT)"
PAIRS_DDL = "CREATE TABLE {table} (a INT NOT NULL, b VARCHAR(16) NOT NULL, v INT, PRIMARY KEY (a, b))"
LOOSE_DDL = "CREATE TABLE {table} (name VARCHAR(64), qty INT)"


class Target:
    """One dialect's test access to a fresh target schema."""

    schema: str
    load_class: type[SqlLoad]
    #: a keyed table with a column the server computes, d = v * 2 (`{table}`: its qualified name)
    generated_ddl: str = ""

    def execute(self, statement: str) -> None:
        raise NotImplementedError

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def qualified(self, table: str) -> str:
        raise NotImplementedError

    def rows(self, table: str, order: str = "1") -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def columns(self, table: str) -> list[str]:
        """The table's column names in order."""
        raise NotImplementedError

    def config(self, unreachable: bool = False) -> Any:
        """The sink's target config; `unreachable` points it at a port nobody listens on."""
        raise NotImplementedError

    def load_options(self) -> dict[str, Any]:
        return {}

    def make_load(self, pipeline: str = "p", unreachable: bool = False, **options: Any) -> SqlLoad:
        options.setdefault("sleep", lambda seconds: None)
        return self.load_class(self.config(unreachable), pipeline=pipeline, **self.load_options(), **options)

    def session_id(self, load: SqlLoad) -> int:
        raise NotImplementedError

    def short_lock_waits(self) -> contextlib.AbstractContextManager[None]:
        """While open, new sink sessions give up waiting for a row lock after about a second."""
        raise NotImplementedError

    def lock_row(self, table: str, key: int) -> Any:
        """A connection whose open transaction holds row `key` of `table` (call .rollback())."""
        raise NotImplementedError

    def read_in_transaction(self, qualified: str) -> Any:
        """A connection whose open transaction has read table `qualified` (call .rollback()): DDL on
        it waits until then."""
        raise NotImplementedError

    def table_lock_waiters(self) -> int:
        """How many sessions wait for a table lock (DDL behind `read_in_transaction`)."""
        raise NotImplementedError

    def kill(self, session: int) -> None:
        """Kill a server session from another connection."""
        raise NotImplementedError

    def session_alive(self, session: int) -> bool:
        raise NotImplementedError

    def kill_session(self, load: SqlLoad) -> None:
        """Kill the load's server session from another connection and wait until it is gone."""
        session = self.session_id(load)
        self.kill(session)
        wait_until(lambda: not self.session_alive(session), message="the killed session to disappear")

    def position_table(self, suffix: str = "") -> str:
        """The qualified name of the sinks' position table (or of its `suffix` companion:
        _fence, _session, _table)."""
        raise NotImplementedError

    def create(self, ddl: str, table: str) -> None:
        self.execute(ddl.format(table=self.qualified(table)))

    def lock_waits(self, holder: Any) -> int:
        """How many sessions wait now for a lock that `holder` (a `lock_row` connection) holds. Only
        the holder's waiters: a wait anywhere else on the shared server must not pass for the one a
        test waits for (`tests.helpers.locks`).

        Poll it at most every 0.3 s: InnoDB refreshes INFORMATION_SCHEMA.INNODB_TRX and
        INNODB_LOCK_WAITS only after 100 ms without a read of them, so faster polling can see the
        same stale answer forever."""
        raise NotImplementedError

    def create_old_position_table(self, log: str, offset: int, epoch: int) -> None:
        """The position table as sinks made it before positions had a row, holding one position of pipeline p."""
        raise NotImplementedError


class SqlProbe(TargetProbe):
    """The connector kit's view of a `Target`: Loads built as the dialect's connector declares."""

    KINDS = {"int": "INT", "text": "VARCHAR(64)"}

    def __init__(self, target: Target) -> None:
        self.target = target

    @property
    def schema(self) -> str:
        return self.target.schema

    def make_load(self, pipeline: str = "p") -> Load:
        from setl.connectors import registry

        load = self.target.make_load(pipeline)
        load.capabilities = registry().target(self.target.config().type).capabilities
        return load

    def create(self, table: TableSpec) -> None:
        columns = ", ".join(f"{name} {self.KINDS[kind]}" for name, kind in table.columns)
        key = f", PRIMARY KEY ({', '.join(table.key)})" if table.key else ""
        self.target.execute(f"CREATE TABLE {self.target.qualified(table.name)} ({columns}{key})")

    def state(self, table: TableSpec) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {tuple(r[k] for k in table.key): r for r in self.rows(table)}

    def rows(self, table: TableSpec) -> list[dict[str, Any]]:
        names = [name for name, _kind in table.columns]
        rows = self.target.query(f"SELECT {', '.join(names)} FROM {self.target.qualified(table.name)}")
        return [dict(zip(names, r)) for r in rows]


class Changes:
    """Builds row changes for one table of the target schema."""

    def __init__(self, schema: str, table: str = "items", key: Sequence[str] = ("id",)) -> None:
        self.schema, self.table, self.key = schema, table, tuple(key)

    def insert(self, **after: Any) -> RowChange:
        return RowChange(Op.INSERT, self.schema, self.table, self.key, None, after)

    def update(self, before: dict[str, Any], **after: Any) -> RowChange:
        return RowChange(Op.UPDATE, self.schema, self.table, self.key, before, {**before, **after})

    def delete(self, **before: Any) -> RowChange:
        return RowChange(Op.DELETE, self.schema, self.table, self.key, before, None)


def read(table: Changes, after: dict[str, Any]) -> RowChange:
    """A snapshot read (`Op.READ`) of `after` in `table`."""
    return RowChange(Op.READ, table.schema, table.table, table.key, None, after)


def make_batch(changes: Sequence[Any], id: int = 1, epoch: int = 1, pipeline: str = "p") -> Batch:
    return Batch(pipeline=pipeline, id=id, epoch=epoch,
                 start=Position("mysql-bin.000001", 4 + (id - 1) * 100),
                 end=Position("mysql-bin.000001", 4 + id * 100, gtid=f"0-1-{id}"),
                 changes=tuple(changes))


def at(change: RowChange, offset: int, row: int = 0) -> RowChange:
    """`change` at source position mysql-bin.000001:offset (+row)."""
    return attrs.evolve(change, position=Position("mysql-bin.000001", offset, row=row))


def span(changes: Sequence[RowChange], start: int, end: int, id: int = 1, epoch: int = 1,
         end_row: int = 0, start_row: int = 0) -> Batch:
    """A batch of pipeline p from mysql-bin.000001:start to :end holding `changes`."""
    return Batch(pipeline="p", id=id, epoch=epoch, start=Position("mysql-bin.000001", start, row=start_row),
                 end=Position("mysql-bin.000001", end, row=end_row), changes=tuple(changes))


def parts(batch: Batch) -> list[Batch]:
    """`batch` split by table, as the scheduler hands it to `load_part` (load.mode per_table)."""
    return [batch.replace(tuple(c for c in batch.changes if c.qualified_table == table)) for table in batch.tables]


def frozen_and_deposed(target: Target, deposed_write: Callable[[], None], new_write: Callable[[], None],
                       what: str) -> tuple[dict[str, Any], float]:
    """Run `deposed_write` (an old writer's load of an older epoch) in a thread, held inside its
    transaction by a lock on ``items`` row 1 (as if frozen), then, once it waits, `new_write` (the
    newer epoch's load). Returns what the old load did (``error`` or ``committed``) and how long
    `new_write` took, after the old thread ended."""
    blocker = target.lock_row("items", 1)
    outcome: dict[str, Any] = {}

    def deposed() -> None:
        try:
            deposed_write()
            outcome["committed"] = True
        except LoadError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=deposed, name=f"deposed-{what}")
    thread.start()
    try:
        wait_until(lambda: target.lock_waits(blocker) >= 1, interval=0.3,  # see TargetProbe.lock_waits
                   message=f"the old {what} to wait inside its transaction")
        started = time.monotonic()
        new_write()
        took = time.monotonic() - started
    finally:
        blocker.rollback()
        blocker.close()
        thread.join(60)
    assert not thread.is_alive(), outcome
    return outcome, took


def item(id: int, name: str = "n", qty: int | None = 1, note: str | None = None) -> dict[str, Any]:
    return {"id": id, "name": name, "qty": qty, "note": note}


#: Hypothesis settings for the model check: examples reuse the test's fresh schema.
model_settings = settings(max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])


class SinkContract(LoadContract):
    """Tests every SQL sink must pass. Subclasses provide the `target` fixture."""

    @pytest.fixture
    def probe(self, target: Target) -> SqlProbe:
        return SqlProbe(target)

    @pytest.fixture
    def items(self, target: Target) -> Changes:
        target.create(ITEMS_DDL, "items")
        return Changes(target.schema)

    @pytest.fixture
    def load(self, target: Target):
        load = target.make_load()
        load.open()
        yield load
        load.close()

    # -- re-copies into a staging table (setl.sinks.sql_staging)

    @staticmethod
    def _tables_like(target: Target, prefix: str) -> list[str]:
        return [str(r[0]) for r in target.query(
            f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{target.schema}'"
            f" AND table_name LIKE '{prefix}%'")]

    @staticmethod
    def _truncate(target: Target, table: str = "items") -> DdlChange:
        return DdlChange(target.schema, table, f"TRUNCATE TABLE `{target.schema}`.`{table}`", snapshot=True)

    def test_a_recopy_of_a_table_with_rows_goes_to_a_staging_table_until_its_end(self, target, items, load):
        """A snapshot TRUNCATE of a table holding rows leaves them; the copy's reads and the streamed
        changes go to a staging table; the copy's end marker switches the table to them and drops the
        staging table and its record; the marker replayed changes nothing."""
        load.load(make_batch([items.insert(**item(1, "old")), items.insert(**item(2, "old")),
                              items.insert(**item(3, "old"))], id=1))
        load.load(make_batch([self._truncate(target)], id=2))
        staging = staging_name("p", target.schema, "items")
        assert self._tables_like(target, staging) == [staging]
        assert target.rows("items") == [(1, "old", 1, None), (2, "old", 1, None), (3, "old", 1, None)]
        load.load(make_batch([read(items, item(1, "new")), read(items, item(4, "new")),
                              items.insert(**item(5, "streamed")), items.delete(**item(4, "new"))], id=3))
        assert target.rows("items") == [(1, "old", 1, None), (2, "old", 1, None), (3, "old", 1, None)]
        marker = DdlChange.end_of_copy(TableName(target.schema, "items"), Position("mysql-bin.000001", 400))
        load.load(make_batch([marker], id=4))
        assert target.rows("items") == [(1, "new", 1, None), (5, "streamed", 1, None)]
        assert self._tables_like(target, staging) == []
        assert target.query(f"SELECT COUNT(*) FROM {target.position_table('_copy')}") == [(0,)]
        load.load(make_batch([marker], id=5))
        load.load(make_batch([items.update(item(5, "streamed"), qty=9)], id=6))
        assert target.rows("items") == [(1, "new", 1, None), (5, "streamed", 9, None)]
        assert load.committed() == make_batch([], id=6).end

    def test_a_copy_into_an_empty_table_truncates_it_as_before(self, target, items, load):
        """A first copy (the table empty): no staging table, the reads go to the table, the marker is a no-op."""
        load.load(make_batch([self._truncate(target)], id=1))
        load.load(make_batch([read(items, item(1, "a"))], id=2))
        assert target.rows("items") == [(1, "a", 1, None)]
        assert self._tables_like(target, "setl_copy_") == []
        load.load(make_batch([DdlChange.end_of_copy(TableName(target.schema, "items"), None)], id=3))
        assert target.rows("items") == [(1, "a", 1, None)]

    def test_a_ddl_during_a_recopy_applies_to_the_table_and_drops_the_staging_table(self, target, items, load):
        """An ALTER of a table being re-copied alters the table and drops its staging table and record
        (the source copies it again from a new TRUNCATE, which stages it from the altered table)."""
        load.load(make_batch([items.insert(**item(1, "old"))], id=1))
        load.load(make_batch([self._truncate(target)], id=2))
        load.load(make_batch([read(items, item(2, "new"))], id=3))
        alter = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN `extra` INT")
        load.load(make_batch([alter], id=4))
        assert self._tables_like(target, "setl_copy_") == []
        assert target.columns("items") == ["id", "name", "qty", "note", "extra"]
        load.load(make_batch([self._truncate(target)], id=5))
        assert self._tables_like(target, "setl_copy_") == [staging_name("p", target.schema, "items")]
        load.load(make_batch([read(items, {**item(2, "new"), "extra": 5})], id=6))
        load.load(make_batch([DdlChange.end_of_copy(TableName(target.schema, "items"), None)], id=7))
        assert target.rows("items") == [(2, "new", 1, None, 5)]
        assert self._tables_like(target, "setl_copy_") == []

    def test_a_switch_leaves_generated_columns_to_the_server(self, target, load):
        """The switch copies every column but those the server computes, which it computes again."""
        target.create(target.generated_ddl, "gen")
        gen = Changes(target.schema, "gen")
        load.load(make_batch([gen.insert(id=1, v=1)], id=1))
        load.load(make_batch([self._truncate(target, "gen")], id=2))
        load.load(make_batch([read(gen, {"id": 1, "v": 10}), read(gen, {"id": 2, "v": 20})], id=3))
        load.load(make_batch([DdlChange.end_of_copy(TableName(target.schema, "gen"), None)], id=4))
        assert target.rows("gen") == [(1, 10, 20), (2, 20, 40)]

    def test_a_staging_table_no_record_names_is_dropped_by_the_next_leader(self, target, items, load):
        """A staging table left behind (a crash between a COMMIT and the DROP after it) is dropped when
        a new leader takes the target; a recorded one is kept."""
        load.load(make_batch([items.insert(**item(1, "old"))], id=1))
        load.load(make_batch([self._truncate(target)], id=2))
        left = staging_name("p", target.schema, "gone")
        target.execute(f"CREATE TABLE {target.qualified(left)} (id INT)")
        other = target.make_load()
        try:
            other.committed()  # a new leader: takes the fence
            assert sorted(self._tables_like(target, "setl_copy_")) == [staging_name("p", target.schema, "items")]
        finally:
            other.close()

    # -- merge semantics

    def test_insert_then_update_leaves_last_image(self, target, items, load):
        """An insert and an update of one key in a batch leave the update's after-image."""
        load.load(make_batch([items.insert(**item(1, "a")), items.update(item(1, "a"), name="b", qty=7)]))
        assert target.rows("items") == [(1, "b", 7, None)]

    def test_update_then_update_leaves_last_image(self, target, items, load):
        """Two updates of a key leave the second after-image."""
        load.load(make_batch([items.insert(**item(1, "a"))], id=1))
        load.load(make_batch([items.update(item(1, "a"), name="b"),
                              items.update(item(1, "b"), name="c", note="x")], id=2))
        assert target.rows("items") == [(1, "c", 1, "x")]

    def test_insert_then_delete_leaves_nothing(self, target, items, load):
        """A key inserted and deleted in one batch is absent afterwards."""
        load.load(make_batch([items.insert(**item(1)), items.insert(**item(2)), items.delete(**item(1))]))
        assert target.rows("items") == [(2, "n", 1, None)]

    def test_delete_then_insert_leaves_row(self, target, items, load):
        """A key deleted and inserted again in one batch holds the new row."""
        load.load(make_batch([items.insert(**item(1, "old"))], id=1))
        load.load(make_batch([items.delete(**item(1, "old")), items.insert(**item(1, "new"))], id=2))
        assert target.rows("items") == [(1, "new", 1, None)]

    def test_composite_key(self, target, load):
        """Deletes and upserts address rows by every column of a composite key."""
        target.create(PAIRS_DDL, "pairs")
        pairs = Changes(target.schema, "pairs", ("a", "b"))
        load.load(make_batch([pairs.insert(a=1, b="x", v=1), pairs.insert(a=1, b="y", v=2),
                              pairs.insert(a=2, b="x", v=3)], id=1))
        load.load(make_batch([pairs.delete(a=1, b="x", v=1), pairs.update({"a": 2, "b": "x", "v": 3}, v=4)],
                             id=2))
        assert target.rows("pairs", order="a, b") == [(1, "y", 2), (2, "x", 4)]

    def test_many_rows_in_chunks(self, target, items):
        """A batch larger than the chunk size is applied completely, deletes and upserts alike."""
        load = target.make_load(chunk_rows=7)
        rows = [item(i, f"n{i}", i) for i in range(1, 101)]
        load.load(make_batch([items.insert(**r) for r in rows], id=1))
        load.load(make_batch([items.delete(**r) for r in rows[:50]]
                             + [items.update(r, qty=-r["id"]) for r in rows[50:]], id=2))
        assert target.rows("items") == [(i, f"n{i}", -i, None) for i in range(51, 101)]
        load.close()

    # -- snapshot reads (Op.READ) in bulk

    def test_a_snapshot_chunk_of_reads_replaces_and_is_idempotent(self, target, items):
        """1,200 reads (past PostgreSQL's COPY threshold, many multi-row statements on MariaDB) over a
        table holding stale versions of some keys leave exactly the read rows, loaded once or twice,
        with NULLs, quotes, backslashes and non-ASCII text intact."""
        load = target.make_load(chunk_rows=100)
        try:
            load.load(make_batch([items.insert(**item(i, "stale", -1, "x")) for i in range(0, 1200, 7)], id=1))
            reads = make_batch([read(items, item(i, f"n{i}'\\é", i if i % 5 else None, None if i % 3 else "q\"t"))
                                for i in range(1200)], id=2)
            load.load(reads)
            load.load(reads)
        finally:
            load.close()
        want = [(i, f"n{i}'\\é", i if i % 5 else None, None if i % 3 else "q\"t") for i in range(1200)]
        assert target.rows("items") == want

    def test_a_bad_row_in_a_chunk_of_reads_fails_the_batch_in_one_line(self, target, items, load):
        """One row breaking a constraint among 1,200 reads (COPY on PostgreSQL) fails the batch with a
        LoadError naming pipeline, table, batch and position; none of the chunk lands."""
        rows = [item(i) for i in range(1200)]
        rows[700] = item(700, name=None)  # type: ignore[arg-type]
        batch = make_batch([read(items, r) for r in rows], id=1)
        with pytest.raises(LoadError) as info:
            load.load(batch)
        text = str(info.value)
        assert "\n" not in text and not isinstance(info.value, TransientLoadError)
        assert "pipeline=p" in text and "table=" in text and "items" in text and "batch=1" in text
        assert info.value.context["position"] == batch.end
        assert target.rows("items") == [] and load.committed() is None

    def test_wide_reads_are_split_into_statements_the_server_takes(self, target, items, load):
        """300 reads of 30,000 two-byte characters each (18 MB of text, more than MariaDB's default
        16 MB packet) are all applied: statements are cut by size as well as by row count."""
        wide = "é" * 30_000
        load.load(make_batch([read(items, item(i, f"w{i}", i, wide)) for i in range(300)], id=1))
        assert target.query(f"SELECT COUNT(*), MIN(LENGTH(note)), MAX(LENGTH(note)) FROM {target.qualified('items')}"
                            ) == [(300, *(2 * [len(wide.encode()) if target.load_class.dialect == "mysql"
                                                 else len(wide)]))]

    def test_reads_into_a_keyless_table_keep_their_place_among_changes(self, target, load):
        """Keyless: runs of inserts and reads go in bulk, yet a delete between them removes one row of
        what came before it, and 1,500 reads (COPY on PostgreSQL) all arrive."""
        target.create(LOOSE_DDL, "loose")
        loose = Changes(target.schema, "loose", ())
        load.load(make_batch([read(loose, {"name": "a", "qty": 1}), loose.insert(name="a", qty=1),
                              loose.delete(name="a", qty=1), read(loose, {"name": "a", "qty": 1}),
                              read(loose, {"name": None, "qty": 2})], id=1))
        assert sorted(target.rows("loose"), key=repr) == [("a", 1), ("a", 1), (None, 2)]
        load.load(make_batch([read(loose, {"name": f"r{i}", "qty": i}) for i in range(1500)], id=2))
        assert len(target.rows("loose")) == 1503

    def test_a_batch_runs_the_load_path_s_steps_in_order(self, target, items, load, monkeypatch):
        """One batch runs fence; per segment each keyed table's deletes then upserts, a keyless table
        in order, a DDL in its place (the fence held again where DDL commits); positions and COMMIT."""
        target.create(LOOSE_DDL, "loose")
        loose = Changes(target.schema, "loose", ())
        load.load(make_batch([items.insert(**item(1)), items.insert(**item(2))], id=1))
        steps: list[tuple[str, str | None]] = []

        def record(owner: Any, name: str, label: Callable[..., str | None]) -> None:
            real = getattr(owner, name)
            monkeypatch.setattr(owner, name, lambda *a, **k: steps.append((name, label(*a, **k))) or real(*a, **k))

        record(load.fence, "check", lambda conn, batch, table=None: None)
        for name in ("patch", "delete", "upsert", "in_order"):
            record(load.sql.rows, name, lambda conn, table: table.table)
        record(load.sql, "apply_ddl", lambda conn, batch, step: step.change.table)
        record(load.positions, "record_and_commit", lambda conn, batch, tables, pipeline: None)
        alter = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN `extra` INT")
        load.load(make_batch([items.delete(**item(1)), items.update(item(2), qty=5), loose.insert(name="x", qty=1),
                              alter, items.insert(**item(3))], id=2))
        refence = [] if load.sql.transactional_ddl else [("check", None)]
        assert steps == [("check", None), ("delete", "items"), ("upsert", "items"), ("in_order", "loose"),
                         ("apply_ddl", "items"), *refence, ("delete", "items"), ("upsert", "items"),
                         ("record_and_commit", None)]
        assert target.rows("items") == [(2, "n", 5, None, None), (3, "n", 1, None, None)]
        assert target.rows("loose") == [("x", 1)] and load.committed() == make_batch([], id=2).end

    # -- idempotency, position, atomicity

    def test_position_is_committed_with_the_batch(self, target, items, load):
        """committed() returns the end of the last loaded batch, also to a new sink instance."""
        assert load.committed() is None
        batch = make_batch([items.insert(**item(1))], id=1)
        load.load(batch)
        assert load.committed() == batch.end
        second = make_batch([items.insert(**item(2))], id=2)
        load.load(second)
        other = target.make_load()
        assert other.committed() == second.end and other.committed().gtid == "0-1-2"
        other.close()

    def test_failing_batch_leaves_nothing(self, target, items, load):
        """A batch with one bad row applies none of its rows and does not move the position."""
        first = make_batch([items.insert(**item(1))], id=1)
        load.load(first)
        bad = make_batch([items.insert(**item(2)), items.update(item(1), qty=5),
                          items.insert(**item(3, name=None))], id=2)
        with pytest.raises(LoadError) as info:
            load.load(bad)
        assert not isinstance(info.value, TransientLoadError)
        text = str(info.value)
        assert "pipeline=p" in text and "batch=2" in text and "items" in text
        assert info.value.context["position"] == bad.end
        assert target.rows("items") == [(1, "n", 1, None)]
        assert load.committed() == first.end
        load.load(make_batch([items.insert(**item(2))], id=2))  # the sink is still usable
        assert len(target.rows("items")) == 2

    def test_older_epoch_is_refused(self, target, items, load):
        """A batch with an epoch older than the one the target holds is refused and not applied."""
        load.load(make_batch([items.insert(**item(1))], id=1, epoch=3))
        load.load(make_batch([items.insert(**item(2))], id=2, epoch=3))  # same epoch: fine
        stale = target.make_load()
        with pytest.raises(LoadError, match="epoch 2 is older than epoch 3"):
            stale.load(make_batch([items.insert(**item(9))], id=3, epoch=2))
        stale.close()
        assert [r[0] for r in target.rows("items")] == [1, 2]
        load.load(make_batch([items.insert(**item(3))], id=3, epoch=4))  # newer: fine
        assert [r[0] for r in target.rows("items")] == [1, 2, 3]

    def test_committed_epoch_is_the_last_batch_epoch(self, target, items, load):
        """`committed_epoch` reads the epoch the target holds, so a scheduler can start above it."""
        assert load.committed_epoch() is None
        load.load(make_batch([items.insert(**item(1))], id=1, epoch=7))
        assert load.committed_epoch() == 7
        load.load(make_batch([items.insert(**item(2))], id=2, epoch=9))
        assert target.make_load().committed_epoch() == 9

    def test_position_table_lives_in_the_target(self, target, items, load):
        """The position row holds the batch's end (row included), id and epoch, written by the batch itself."""
        load.load(make_batch([items.insert(id=1, name="a", qty=None, note=None)], id=3, epoch=2))
        rows = [row[:7] for row in target.query(f"SELECT * FROM {target.position_table()}")]
        assert rows == [("p", "mysql-bin.000001", 304, 0, "0-1-3", 3, 2)]

    def test_pipelines_keep_separate_positions(self, target, items):
        """Two pipelines loading one target keep their own positions and epochs."""
        one, two = target.make_load("one"), target.make_load("two")
        one.load(make_batch([items.insert(**item(1))], id=5, epoch=9, pipeline="one"))
        two.load(make_batch([items.insert(**item(2))], id=1, epoch=1, pipeline="two"))
        assert one.committed().offset == 504 and two.committed().offset == 104
        one.close()
        two.close()

    # -- tables without a key, errors

    def test_table_without_primary_key(self, target, load, caplog):
        """Keyless rows are applied in order: an update or delete changes one row equal in every
        column, NULLs included; one warning names the table, however many batches touch it."""
        target.create(LOOSE_DDL, "loose")
        loose = Changes(target.schema, "loose", ())
        load.load(make_batch([loose.insert(name="a", qty=1), loose.insert(name="a", qty=1),
                              loose.insert(name=None, qty=2)], id=1))
        load.load(make_batch([loose.delete(name="a", qty=1),
                              loose.update({"name": None, "qty": 2}, qty=3)], id=2))
        assert sorted(target.rows("loose"), key=repr) == sorted([("a", 1), (None, 3)], key=repr)
        warnings = [r.getMessage() for r in caplog.records if "no primary key" in r.getMessage()]
        assert len(warnings) == 1 and f"{target.schema}.loose" in warnings[0]

    def test_missing_table_is_named_and_nothing_applied(self, target, items, load):
        """A batch touching a table the target lacks fails naming pipeline, stage, table and
        position, and rolls back: its rows for other tables are not applied either."""
        ghosts = Changes(target.schema, "ghosts")
        batch = make_batch([items.insert(**item(1)), ghosts.insert(id=1)], id=7)
        with pytest.raises(LoadError) as info:
            load.load(batch)
        assert f"{target.schema}.ghosts" in str(info.value)
        assert info.value.context == {"pipeline": "p", "stage": "load", "table": f"{target.schema}.ghosts",
                                      "batch": 7, "position": batch.end}
        assert target.rows("items") == [] and load.committed() is None

    # -- DDL

    def ddl(self, target: Target, statement: str, table: str = "gadgets") -> DdlChange:
        return DdlChange(target.schema, table, statement.format(t=f"`{target.schema}`.`{table}`",
                                                                s=f"`{target.schema}`"))

    def test_ddl_sequence_in_batch_order(self, target, load):
        """CREATE, ALTER (add, rename, modify, drop column), RENAME, TRUNCATE and DROP TABLE are
        applied in batch order with the rows around them, each DDL batch moving the position."""
        gadgets = Changes(target.schema, "gadgets")
        batches = iter(range(1, 100))

        def run(*changes: Any) -> None:
            batch = make_batch(changes, id=next(batches))
            load.load(batch)
            assert load.committed() == batch.end

        run(self.ddl(target, "CREATE TABLE {t} (id INT NOT NULL PRIMARY KEY, name VARCHAR(20))"))
        run(gadgets.insert(id=1, name="a"), gadgets.insert(id=2, name="b"))
        run(self.ddl(target, "ALTER TABLE {t} ADD COLUMN qty INT NULL AFTER name"))
        run(gadgets.insert(id=3, name="c", qty=5))
        run(self.ddl(target, "ALTER TABLE {t} CHANGE name label VARCHAR(40) NOT NULL, MODIFY qty BIGINT"))
        run(gadgets.update({"id": 3, "label": "c", "qty": 5}, label="x" * 40, qty=2**40))
        assert target.columns("gadgets") == ["id", "label", "qty"]
        assert target.rows("gadgets") == [(1, "a", None), (2, "b", None), (3, "x" * 40, 2**40)]
        run(self.ddl(target, "ALTER TABLE {t} DROP COLUMN qty, RENAME COLUMN label TO name"))
        run(gadgets.delete(id=1, name="a"))
        assert target.rows("gadgets") == [(2, "b"), (3, "x" * 40)]
        run(self.ddl(target, "RENAME TABLE {t} TO {s}.`gizmos`"))
        gizmos = Changes(target.schema, "gizmos")
        run(gizmos.insert(id=4, name="d"))
        assert target.rows("gizmos") == [(2, "b"), (3, "x" * 40), (4, "d")]
        run(self.ddl(target, "TRUNCATE TABLE {s}.`gizmos`", "gizmos"))
        assert target.rows("gizmos") == []
        run(self.ddl(target, "DROP TABLE {s}.`gizmos`", "gizmos"))
        assert target.columns("gizmos") == []

    def test_create_table_of_an_existing_table(self, target, load):
        """CREATE TABLE of a table that exists with the same shape counts as applied; with another
        shape it fails naming the table."""
        create = "CREATE TABLE {t} (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, v VARCHAR(8))"
        load.load(make_batch([self.ddl(target, create, "same")], id=1))
        load.load(make_batch([Changes(target.schema, "same").insert(id=1, v="a")], id=2))
        load.load(make_batch([self.ddl(target, create, "same")], id=3))
        load.load(make_batch([self.ddl(target, create.replace("(8)", "(9)"), "other")], id=4))
        with pytest.raises(LoadError, match="already exists") as info:
            load.load(make_batch([self.ddl(target, create, "other")], id=5))
        assert info.value.context["table"] == f"{target.schema}.other"
        assert target.rows("same") == [(1, "a")] and load.committed().offset == 404

    def test_ddl_inside_a_batch_keeps_its_place(self, target, items, load):
        """Rows before a DDL in the same batch are applied before it, rows after it after it."""
        batch = make_batch([items.insert(**item(1)),
                            self.ddl(target, "ALTER TABLE {t} ADD COLUMN extra INT", "items"),
                            items.insert(**item(2), extra=7), items.update(item(1), extra=8)])
        load.load(batch)
        assert target.rows("items") == [(1, "n", 1, None, 8), (2, "n", 1, None, 7)]
        assert load.committed() == batch.end

    def test_added_not_null_column_fills_existing_rows(self, target, items, load):
        """ADD COLUMN ... NOT NULL without DEFAULT fills the rows already there with MySQL's
        implicit default (0, empty string), as the source did without logging a row."""
        load.load(make_batch([items.insert(**item(1))], id=1))
        load.load(make_batch([self.ddl(target, "ALTER TABLE {t} ADD COLUMN n INT NOT NULL, "
                                               "ADD COLUMN s VARCHAR(3) NOT NULL", "items")], id=2))
        load.load(make_batch([items.insert(**item(2), n=5, s="x")], id=3))
        assert target.rows("items") == [(1, "n", 1, None, 0, ""), (2, "n", 1, None, 5, "x")]

    def test_ddl_skip_applies_the_rows_and_moves_on(self, target, items):
        """Under ddl=skip a DDL is logged and not applied; the batch's rows and position are."""
        load = target.make_load(ddl="skip")
        batch = make_batch([items.insert(**item(1)), self.ddl(target, "DROP TABLE {t}", "items")])
        load.load(batch)
        assert target.rows("items") == [(1, "n", 1, None)] and load.committed() == batch.end
        load.close()

    def test_ddl_fail_refuses_the_batch(self, target, items):
        """Under ddl=fail a DDL fails its batch with an error naming pipeline, table, position and
        statement, and nothing of the batch is applied."""
        load = target.make_load(ddl="fail")
        ddl = attrs.evolve(self.ddl(target, "ALTER TABLE {t} ADD COLUMN extra INT", "items"),
                           position=Position("mysql-bin.000001", 150))
        with pytest.raises(LoadError) as info:
            load.load(make_batch([items.insert(**item(1)), ddl], id=3))
        text = str(info.value)
        assert "pipeline=p" in text and "stage=load" in text and "ADD COLUMN extra INT" in text
        assert info.value.context["table"] == f"{target.schema}.items"
        assert info.value.context["position"] == Position("mysql-bin.000001", 150)
        assert target.rows("items") == [] and load.committed() is None
        load.close()

    def test_non_table_ddl_is_not_applied(self, target, items, load):
        """A statement that is not table DDL (here CREATE DATABASE) is logged and passed over."""
        batch = make_batch([DdlChange(target.schema, None, "CREATE DATABASE IF NOT EXISTS elsewhere")])
        load.load(batch)
        assert load.committed() == batch.end


    # -- positions inside split transactions

    def test_a_batch_ending_inside_a_split_transaction_round_trips(self, target, items, load):
        """A batch ending at a piece of a split transaction records (log, offset, row); committed() returns it."""
        piece = span([at(items.insert(**item(1)), 104, 1), at(items.insert(**item(2)), 104, 2)], 4, 104, end_row=2)
        load.load(piece)
        assert load.committed() == piece.end and load.committed().row == 2
        rest = span([at(items.insert(**item(3)), 104, 3)], 104, 300, id=2, start_row=2)
        load.load(rest)
        assert load.committed() == Position("mysql-bin.000001", 300) and load.committed().row == 0
        assert [r[0] for r in target.rows("items")] == [1, 2, 3]

    def test_a_position_table_without_row_is_migrated(self, target, items):
        """A position table made before positions had a row gains the column and keeps its position and
        epoch (the first read of a new sink takes the fence one epoch above it)."""
        target.create_old_position_table("mysql-bin.000001", 504, epoch=3)
        load = target.make_load()
        try:
            assert load.committed() == Position("mysql-bin.000001", 504) and load.committed_epoch() == 4
            load.load(span([items.insert(**item(1))], 504, 600, id=6, epoch=4, end_row=4))
            assert load.committed() == Position("mysql-bin.000001", 600, row=4)
        finally:
            load.close()

    def test_an_old_position_table_opened_by_several_sinks_at_once_is_migrated_once(self, target, items):
        """Nodes and CLI commands opening one old target together: each adds the missing column or
        finds it added by another, and none fails on the other's ALTER TABLE. A transaction reading
        the old table holds all four at it until each has begun opening, so they go on together."""
        target.create_old_position_table("mysql-bin.000001", 504, epoch=3)
        reader = target.read_in_transaction(target.position_table())  # holds every opener at the table
        start = threading.Barrier(4)
        opened: list[Any] = []
        errors: list[BaseException] = []

        def open_one() -> None:
            start.wait(timeout=30)
            try:
                load = target.make_load()
                opened.append(load)
                load.open()  # creates or migrates the position tables
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(4)]
        try:
            for thread in threads:
                thread.start()
            wait_until(lambda: target.table_lock_waiters() >= 4 or not any(t.is_alive() for t in threads),
                       timeout=60, message=lambda: f"four sinks waiting at the position table "
                                                   f"({target.table_lock_waiters()} waiting)")
        finally:
            reader.rollback()
            for thread in threads:
                thread.join(timeout=120)
        try:
            assert not errors, errors
            assert [load.committed() for load in opened] == [Position("mysql-bin.000001", 504)] * 4
        finally:
            for load in opened:
                load.close()

    # -- fencing a deposed writer

    def test_a_newer_epoch_kills_a_writer_blocked_inside_its_transaction(self, target, items):
        """A writer of another process stuck inside its batch transaction (as if frozen) is killed by
        the first batch of a newer epoch, which does not wait for it; the old batch never commits."""
        target.create(LOOSE_DDL, "loose")
        loose = Changes(target.schema, "loose", key=())
        target.execute(f"INSERT INTO {target.qualified('items')} VALUES (1, 'n', 1, NULL), (2, 'n', 1, NULL)")
        old = target.make_load(fence_lock_timeout=1.0)
        old.token = "another-process"
        old.load(make_batch([loose.insert(name="a", qty=1)], id=1, epoch=1))
        new = target.make_load(fence_lock_timeout=1.0)
        try:
            outcome, took = frozen_and_deposed(
                target,
                lambda: old.load(make_batch([loose.insert(name="b", qty=2), items.update(item(1), qty=5)], id=2,
                                            epoch=1)),
                lambda: new.load(make_batch([loose.insert(name="b", qty=2), items.update(item(2), qty=7)], id=2,
                                            epoch=2)),
                "writer")
        finally:
            old.close()
            new.close()
        assert "committed" not in outcome
        assert "refused: batch epoch 1 is older than epoch 2" in str(outcome["error"])
        assert took < 20, took
        assert sorted(target.rows("loose")) == [("a", 1), ("b", 2)]
        assert target.rows("items") == [(1, "n", 1, None), (2, "n", 7, None)]
        assert new.committed_epoch() == 2

    def test_the_first_read_of_a_new_leader_fences_the_old_one(self, target, items):
        """A new sink's first committed() kills the other processes' sessions and raises the fence
        above the stored epoch, so the old writer's next batch is refused and the position read stays true."""
        old = target.make_load()
        old.token = "another-process"
        new = target.make_load()
        try:
            old.load(make_batch([items.insert(**item(1))], id=1, epoch=5))
            session = target.session_id(old)
            assert new.committed() == make_batch([], id=1).end
            wait_until(lambda: not target.session_alive(session), message="the old writer's session to be killed")
            with pytest.raises(LoadError, match="refused: batch epoch 5 is older than epoch 6"):
                old.load(make_batch([items.insert(**item(2))], id=2, epoch=5))
            assert new.committed_epoch() == 6 and [r[0] for r in target.rows("items")] == [1]
            new.load(make_batch([items.insert(**item(2))], id=2, epoch=7))
            assert [r[0] for r in target.rows("items")] == [1, 2]
        finally:
            old.close()
            new.close()

    def test_a_leader_back_after_another_one_fences_it_before_reading(self, target, items):
        """A sink whose pipeline another process has written since its own last batch (leadership
        lost and regained) takes the fence again on its next committed()."""
        mine = target.make_load()
        other = target.make_load()
        other.token = "another-process"
        try:
            mine.load(make_batch([items.insert(**item(1))], id=1, epoch=1))
            assert mine.committed_epoch() == 1 and mine.committed().offset == 104
            other.load(make_batch([items.insert(**item(2))], id=2, epoch=2))
            session = target.session_id(other)
            assert mine.committed().offset == 204
            wait_until(lambda: not target.session_alive(session), message="the other writer's session to be killed")
            assert mine.committed_epoch() == 3
            with pytest.raises(LoadError, match="refused: batch epoch 2 is older than epoch 3"):
                other.load(make_batch([items.insert(**item(3))], id=3, epoch=2))
        finally:
            mine.close()
            other.close()

    def test_a_deposed_writer_is_refused_without_killing_the_newer_one(self, target, items):
        """A writer of an older epoch arriving after a newer one took the fence is refused and kills nothing."""
        new = target.make_load()
        old = target.make_load()
        old.token = "another-process"
        try:
            new.load(make_batch([items.insert(**item(1))], id=1, epoch=2))
            session = target.session_id(new)
            with pytest.raises(LoadError, match="refused: batch epoch 1 is older than epoch 2"):
                old.load(make_batch([items.insert(**item(2))], id=2, epoch=1))
            assert target.session_alive(session) and [r[0] for r in target.rows("items")] == [1]
        finally:
            old.close()
            new.close()

    def test_sessions_of_its_own_process_are_not_killed(self, target, items):
        """Taking the fence for a newer epoch leaves the sessions of the same process alive."""
        first = target.make_load()
        second = target.make_load()
        try:
            first.load(make_batch([items.insert(**item(1))], id=1, epoch=1))
            session = target.session_id(first)
            second.load(make_batch([items.insert(**item(2))], id=2, epoch=2))
            assert target.session_alive(session)
        finally:
            first.close()
            second.close()

    # -- load.mode per_table

    def test_a_replay_after_one_part_failed_applies_each_change_once(self, target):
        """per_table: the keyless table's part commits, the other table's part fails (its table is
        missing); the replay, cut into one bigger batch, leaves the keyless table equal to the source."""
        target.create(LOOSE_DDL, "loose")
        loose, items = Changes(target.schema, "loose", key=()), Changes(target.schema)
        changes = [at(loose.insert(name="a", qty=1), 200), at(items.insert(**item(1)), 200),
                   at(loose.insert(name="b", qty=2), 300), at(loose.update({"name": "a", "qty": 1}, qty=9), 400)]
        load = target.make_load()
        try:
            first = span(changes[:2], 104, 200, id=1, epoch=1)
            keyless, keyed = parts(first)
            load.load_part(keyless)
            with pytest.raises(LoadError, match="does not exist"):
                load.load_part(keyed)
            for _ in range(2):  # a retry that fails again commits nothing twice
                load.load_part(keyless)
            assert target.rows("loose") == [("a", 1)]
            target.create(ITEMS_DDL, "items")
            replay = span(changes, 104, 400, id=1, epoch=2)
            for part in parts(replay):
                load.load_part(part)
            load.mark_loaded(replay)
            assert sorted(target.rows("loose")) == [("a", 9), ("b", 2)]
            assert [r[0] for r in target.rows("items")] == [1]
            assert load.committed() == replay.end
        finally:
            load.close()

    def test_a_replay_after_later_parts_committed_applies_each_change_once(self, target):
        """per_table: the keyless table's parts of batches 1 and 2 commit, batch 1's other part fails;
        replaying batches 1 and 2 does not move the table's position back nor apply batch 2 twice."""
        target.create(LOOSE_DDL, "loose")
        loose, items = Changes(target.schema, "loose", key=()), Changes(target.schema)
        first = span([at(loose.insert(name="a", qty=1), 200), at(items.insert(**item(1)), 200)], 104, 200, id=1)
        second = span([at(loose.insert(name="b", qty=2), 300)], 200, 300, id=2)
        load = target.make_load()
        try:
            load.load_part(parts(first)[0])
            load.load_part(second)
            with pytest.raises(LoadError, match="does not exist"):
                load.load_part(parts(first)[1])
            target.create(ITEMS_DDL, "items")
            for batch in (attrs.evolve(first, epoch=2), attrs.evolve(second, epoch=2)):
                for part in parts(batch):
                    load.load_part(part)
                load.mark_loaded(batch)
            assert sorted(target.rows("loose")) == [("a", 1), ("b", 2)]
            assert [r[0] for r in target.rows("items")] == [1] and load.committed() == second.end
        finally:
            load.close()

    def test_a_crash_between_parts_replays_each_change_once(self, target, items):
        """per_table: a process dies after one part of a batch committed; a new one replaying the batch
        applies the rest and does not apply the committed part again."""
        target.create(LOOSE_DDL, "loose")
        loose = Changes(target.schema, "loose", key=())
        batch = span([at(loose.insert(name="a", qty=1), 200), at(items.insert(**item(1)), 200),
                      at(loose.insert(name="a", qty=1), 300)], 104, 300, id=1, epoch=1)
        crashed = target.make_load()
        crashed.load_part(parts(batch)[0])
        crashed.close()
        load = target.make_load()
        try:
            assert load.committed() is None
            replay = attrs.evolve(batch, epoch=2)
            for part in parts(replay):
                load.load_part(part)
            load.mark_loaded(replay)
            assert target.rows("loose") == [("a", 1), ("a", 1)]
            assert [r[0] for r in target.rows("items")] == [1]
            assert load.committed() == batch.end
        finally:
            load.close()

    def test_parts_of_different_tables_run_at_once(self, target, items):
        """per_table: a part blocked on a row lock does not hold up another table's part (own connection)."""
        target.create(LOOSE_DDL, "loose")
        loose = Changes(target.schema, "loose", key=())
        target.execute(f"INSERT INTO {target.qualified('items')} VALUES (1, 'n', 1, NULL)")
        batch = span([at(items.update(item(1), qty=3), 200), at(loose.insert(name="x", qty=1), 200)], 104, 200)
        keyed, keyless = parts(batch)
        load = target.make_load()
        blocker = target.lock_row("items", 1)
        thread = threading.Thread(target=load.load_part, args=(keyed,), name="blocked-part")
        try:
            load.load_part(span([], 4, 104))  # takes the fence before the race
            thread.start()
            wait_until(lambda: target.lock_waits(blocker) >= 1, interval=0.3,  # see TargetProbe.lock_waits
                       message="the keyed part to wait for its row lock")
            load.load_part(keyless)
            assert target.rows("loose") == [("x", 1)] and thread.is_alive()
        finally:
            blocker.rollback()
            blocker.close()
            thread.join(30)
            load.close()
        assert target.rows("items") == [(1, "n", 3, None)]

    def test_a_deposed_part_frozen_inside_its_transaction_never_commits(self, target, items):
        """per_table: a part of another process stuck inside its transaction after its fence and
        table position read (as if frozen) is killed by a newer epoch's part, which does not wait
        for it; the old part never commits and the table position is the new one's."""
        target.execute(f"INSERT INTO {target.qualified('items')} VALUES (1, 'n', 1, NULL), (2, 'n', 1, NULL)")
        old = target.make_load(fence_lock_timeout=1.0)
        old.token = "another-process"
        old.load_part(span([at(items.update(item(2), qty=3), 150)], 104, 150, id=1, epoch=1))
        new = target.make_load(fence_lock_timeout=1.0)
        try:
            outcome, took = frozen_and_deposed(
                target,
                lambda: old.load_part(span([at(items.update(item(1), qty=5), 200)], 150, 200, id=2, epoch=1)),
                lambda: new.load_part(span([at(items.update(item(2), qty=7), 200)], 150, 200, id=2, epoch=2)),
                "part")
        finally:
            old.close()
        try:
            assert "committed" not in outcome, outcome
            assert took < 20, took
            assert target.rows("items") == [(1, "n", 1, None), (2, "n", 7, None)]
            positions = target.query(f"SELECT batch_id, epoch FROM {target.position_table('_table')}")
            assert positions == [(2, 2)]
        finally:
            new.close()

    def test_a_table_s_parts_go_to_the_connection_that_loaded_it_last(self, target, items):
        """per_table: with two idle pooled connections, two tables' parts each take their own,
        and a table's next part takes the connection that loaded it last."""
        target.create(LOOSE_DDL, "loose")
        loose = Changes(target.schema, "loose", key=())
        load = target.make_load()
        try:
            load.load_part(span([], 4, 104))  # takes the fence
            opened = [load.pool.checkout(None) for _ in range(2)]
            load.pool.idle.extend(opened)
            sessions = []
            for number, part in enumerate([items.insert(**item(1)), loose.insert(name="a", qty=1),
                                           items.insert(**item(2)), loose.insert(name="b", qty=2)], start=2):
                load.load_part(span([at(part, 100 * number)], 100 * number - 100, 100 * number, id=number))
                sessions.append(target.session_id(load))  # the connection just given back
            assert sessions[0] != sessions[1] and sessions[2:] == sessions[:2]
            assert [r[0] for r in target.rows("items")] == [1, 2] and len(target.rows("loose")) == 2
        finally:
            load.close()

    # -- transient errors

    def test_reconnects_after_its_session_is_killed(self, target, items):
        """After the server kills the sink's session, the next load reconnects and replays."""
        sleeps: list[float] = []
        load = target.make_load(sleep=sleeps.append)
        load.load(make_batch([items.insert(**item(1))], id=1))
        target.kill_session(load)
        load.load(make_batch([items.insert(**item(2))], id=2))
        assert [r[0] for r in target.rows("items")] == [1, 2]
        assert load.committed().offset == 204
        assert len(sleeps) == 1  # exactly one failed attempt, then a replay
        load.close()

    def test_lock_wait_timeout_is_retried_in_place(self, target, items):
        """A batch that times out waiting for a row lock is replayed by the sink itself, after a
        backoff during which the lock goes away."""
        target.execute(f"INSERT INTO {target.qualified('items')} VALUES (1, 'n', 1, NULL)")
        blocker = target.lock_row("items", 1)
        sleeps: list[float] = []

        def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            blocker.rollback()

        with target.short_lock_waits():
            load = target.make_load(sleep=sleep)
            try:
                load.load(make_batch([items.update(item(1), qty=2)], id=1))
            finally:
                load.close()
                blocker.close()
        assert target.rows("items") == [(1, "n", 2, None)] and len(sleeps) == 1

    def test_gives_up_after_bounded_attempts(self, target, items):
        """A target that stays unreachable fails with a TransientLoadError after max_attempts."""
        sleeps: list[float] = []
        load = target.make_load(max_attempts=3, sleep=sleeps.append, unreachable=True)
        with pytest.raises(TransientLoadError, match="3 attempts in a row failed") as info:
            load.load(make_batch([items.insert(**item(1))], id=4))
        assert info.value.context["batch"] == 4 and info.value.context["pipeline"] == "p"
        assert len(sleeps) == 2

    # -- the model check

    def check_random_sequences(self, target: Target, items: Changes, load: Load, data: st.DataObject) -> None:
        """Random inserts, updates (key changes included) and deletes over a few keys, cut into
        random batches, must leave the table equal to applying them one by one to a dict.

        Each dialect's module wraps this in its own hypothesis test (hypothesis refuses one test
        method run from two classes)."""
        target.execute(f"DELETE FROM {target.qualified('items')}")
        target.execute(f"DELETE FROM {target.position_table()}")
        target.execute(f"DELETE FROM {target.position_table('_fence')}")
        load.close()  # the next connection takes the fence again
        load.fence.epoch = 0
        model: dict[int, dict[str, Any]] = {}
        changes: list[RowChange] = []
        keys = st.integers(0, 5)
        for _ in range(data.draw(st.integers(1, 40), label="length")):
            key = data.draw(keys, label="key")
            if key not in model:
                row = item(key, data.draw(st.sampled_from("abc")), data.draw(st.none() | st.integers(-5, 5)))
                model[key] = row
                changes.append(items.insert(**row))
                continue
            action = data.draw(st.sampled_from(["update", "rekey", "delete"]), label="action")
            before = model[key]
            if action == "delete":
                del model[key]
                changes.append(items.delete(**before))
            elif action == "rekey":
                free = [k for k in range(6) if k not in model]
                new = data.draw(st.sampled_from(free), label="new key") if free else key
                after = {**before, "id": new}
                del model[key]
                model[new] = after
                changes.append(items.update(before, **after))
            else:
                after = {**before, "qty": data.draw(st.integers(-5, 5)),
                         "note": data.draw(st.none() | st.text("xy", max_size=3))}
                model[key] = after
                changes.append(items.update(before, **after))
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(changes) - 1)), max_size=5), label="cuts"))
        bounds = [0, *[c for c in cuts if c < len(changes)], len(changes)]
        epoch = data.draw(st.integers(1, 3), label="epoch")
        for number, (lo, hi) in enumerate(zip(bounds, bounds[1:]), start=1):
            load.load(make_batch(changes[lo:hi], id=number, epoch=epoch, pipeline="p"))
        expected = sorted((r["id"], r["name"], r["qty"], r["note"]) for r in model.values())
        assert target.rows("items") == expected

