"""The connector test kit: the Load and Select contract suites every built-in connector passes,
for a third party to run against their own (as bytewax ships its testing connectors).

Subclass `LoadContract` in a pytest module and give it a `probe` fixture returning a
`TargetProbe` for a fresh, empty target; subclass `SelectContract` with a `probe` fixture
returning a `SourceProbe`::

    class TestMyTarget(LoadContract):
        @pytest.fixture
        def probe(self, tmp_path):
            return MyProbe(tmp_path)

The suites need pytest (and hypothesis for the model check), setl's test extras.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest

from setl.config import PipelineSettings
from setl.errors import ConfigError
from setl.model import Batch, Change, Op, Position, RowChange, Transaction
from setl.stages.load import Load, LoadCapabilities
from setl.stages.select import Select, SelectCapabilities
from setl.testing.harness import reference_state

#: A column kind a probe maps to its own type: "int" (a 32-bit integer) or "text" (up to 64 characters).
ColumnKind = str


@attrs.frozen
class TableSpec:
    """A table the suites write to: `columns` (name, kind) in order, `key` its primary key."""

    schema: str
    name: str
    columns: tuple[tuple[str, ColumnKind], ...] = (("id", "int"), ("name", "text"), ("qty", "int"))
    key: tuple[str, ...] = ("id",)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def insert(self, **after: Any) -> RowChange:
        return RowChange(Op.INSERT, self.schema, self.name, self.key, None, after)

    def update(self, before: Mapping[str, Any], **changed: Any) -> RowChange:
        return RowChange(Op.UPDATE, self.schema, self.name, self.key, dict(before), {**before, **changed})

    def delete(self, **before: Any) -> RowChange:
        return RowChange(Op.DELETE, self.schema, self.name, self.key, before, None)

    def read(self, **after: Any) -> RowChange:
        """A snapshot read of a row (`Op.READ`): "insert, or replace the row with the same key"."""
        return RowChange(Op.READ, self.schema, self.name, self.key, None, after)


def row(id: int, name: str = "n", qty: int | None = 1) -> dict[str, Any]:
    """A row of the default `TableSpec` columns."""
    return {"id": id, "name": name, "qty": qty}


def make_batch(changes: Sequence[Change], id: int = 1, epoch: int = 1, pipeline: str = "p",
               log: str = "kit-log.000001") -> Batch:
    """Batch `id` of `pipeline`; batch n covers positions (log, 100 * (n - 1) + 4) to (log, 100 * n + 4).

    The batch is one transaction: a change without a position gets the batch's end, as a source's
    changes carry the position after their transaction (a change-log target orders by it).
    """
    end = Position(log, 4 + id * 100)
    stamped = tuple(attrs.evolve(c, position=end) if c.position is None else c for c in changes)
    return Batch(pipeline=pipeline, id=id, epoch=epoch, start=Position(log, 4 + (id - 1) * 100),
                 end=end, changes=stamped)


class TargetProbe:
    """A connector author's access to one fresh, empty target, for `LoadContract`.

    `make_load` builds the connector's Load (not opened) the way the connector's `build` does,
    so it carries the connector's capabilities. `create` makes a table the target needs before
    rows arrive (a target that creates tables itself does nothing). `state` reads a table back
    as it stands now, by key: a change-log target folds its log.
    """

    @property
    def capabilities(self) -> LoadCapabilities:
        load = self.make_load("capabilities")  # built only to be asked: closed, as a built Load may hold connections
        try:
            return load.capabilities
        finally:
            load.close()

    def make_load(self, pipeline: str = "p") -> Load:
        raise NotImplementedError

    def create(self, table: TableSpec) -> None:
        """Create `table` if the target needs it to exist before rows arrive. A `TableSpec` with
        an empty `key` is a table without a primary key."""

    def state(self, table: TableSpec) -> dict[tuple[Any, ...], dict[str, Any]]:
        raise NotImplementedError

    def rows(self, table: TableSpec) -> list[dict[str, Any]]:
        """Every row of `table` as the target holds it now, duplicates included: what a table
        without a primary key holds. The default takes `state`'s values, which is right only when
        `state` keys a keyless table by the whole row; a probe whose `state` keys it otherwise
        overrides this."""
        return list(self.state(table).values())

    @property
    def schema(self) -> str:
        """The schema (database) the suite's tables go into."""
        return "demo"


class LoadContract:
    """What every target must do: merged, idempotent, replayable loads, and the capabilities it
    declares. Subclasses provide a `probe` fixture (a `TargetProbe`)."""

    @pytest.fixture
    def kit_items(self, probe: TargetProbe) -> TableSpec:
        spec = TableSpec(probe.schema, "items")
        probe.create(spec)
        return spec

    @pytest.fixture
    def kit_load(self, probe: TargetProbe):
        load = probe.make_load()
        load.open()
        yield load
        load.close()

    def test_batch_leaves_each_key_at_its_last_image(self, probe, kit_items, kit_load):
        """Insert, update and delete of several keys in one batch leave each key's last image."""
        items = kit_items
        kit_load.load(make_batch([items.insert(**row(1, "a")), items.insert(**row(2, "b")),
                                  items.update(row(1, "a"), name="c", qty=7), items.delete(**row(2, "b")),
                                  items.insert(**row(3, "d", None))]))
        assert probe.state(items) == {(1,): row(1, "c", 7), (3,): row(3, "d", None)}

    def test_key_change_moves_the_row(self, probe, kit_items, kit_load):
        """An update of the primary key removes the old key and holds the row under the new one."""
        items = kit_items
        kit_load.load(make_batch([items.insert(**row(1, "a")), items.insert(**row(2, "b"))], id=1))
        kit_load.load(make_batch([items.update(row(1, "a"), id=5)], id=2))
        assert probe.state(items) == {(2,): row(2, "b"), (5,): row(5, "a")}

    def test_batch_loaded_twice_is_idempotent(self, probe, kit_items, kit_load):
        """Loading a batch a second time leaves the target as loading it once."""
        items = kit_items
        batch = make_batch([items.insert(**row(1)), items.insert(**row(2)), items.update(row(1), name="z"),
                            items.delete(**row(2))])
        kit_load.load(batch)
        once = probe.state(items)
        kit_load.load(batch)
        assert probe.state(items) == once == {(1,): row(1, "z")}

    def test_replay_after_a_restart(self, probe, kit_items, kit_load):
        """A new Load replaying batches the old one loaded (at-least-once after a crash) ends equal."""
        items = kit_items
        txs = [[items.insert(**row(i, f"n{i}", i))] for i in range(1, 5)]
        txs += [[items.update(row(i, f"n{i}", i), qty=-i)] for i in range(1, 3)] + [[items.delete(**row(4, "n4", 4))]]
        batches = [make_batch(tx, id=n) for n, tx in enumerate(txs, start=1)]
        for batch in batches[:5]:
            kit_load.load(batch)
        again = probe.make_load()
        again.open()
        try:
            for batch in batches[2:]:
                again.load(batch)
        finally:
            again.close()
        assert probe.state(items) == reference_state(txs)[items.qualified]

    def test_position_is_stored_only_when_declared(self, probe, kit_items, kit_load):
        """`committed()` follows `stores_position`: the last batch's end, also for a new Load, or None."""
        items = kit_items
        first, second = make_batch([items.insert(**row(1))], id=1), make_batch([items.insert(**row(2))], id=2)
        assert kit_load.committed() is None
        kit_load.load(first)
        kit_load.load(second)
        other = probe.make_load()
        other.open()
        try:
            expected = second.end if probe.capabilities.stores_position else None
            found = (kit_load.committed(), other.committed())
            assert found == (expected, expected), (
                f"committed() of the loading and of a new Load: {found}, expected {expected} "
                f"(stores_position={probe.capabilities.stores_position})")
        finally:
            other.close()

    def test_per_table_parts_when_declared(self, probe, kit_items, kit_load):
        """With `per_table`, a batch loaded as one part per table and then marked equals it loaded
        whole, and its position is stored only once marked; without it the scheduler refuses
        ``load.mode: per_table``."""
        items = kit_items
        if not probe.capabilities.per_table:
            from setl.meta.sqlite import SqliteMetaStore
            from setl.scheduler import Scheduler
            from setl.stages import Extract, Transform
            from setl.testing.harness import ScriptedSource

            settings = attrs.evolve(PipelineSettings(), load=attrs.evolve(PipelineSettings().load, mode="per_table"))
            with pytest.raises(ConfigError, match="cannot load per table"):
                Scheduler("p", settings, ScriptedSource(), Extract(), Transform(), kit_load,
                          SqliteMetaStore(":memory:"))
            return
        others = TableSpec(probe.schema, "others")
        probe.create(others)
        batch = make_batch([items.insert(**row(1)), others.insert(**row(7)), items.update(row(1), qty=3)])
        for table in batch.tables:
            kit_load.load_part(batch.replace(tuple(c for c in batch.changes if c.qualified_table == table)))
        if probe.capabilities.stores_position:
            assert kit_load.committed() is None
        kit_load.mark_loaded(batch)
        assert probe.state(items) == {(1,): row(1, "n", 3)} and probe.state(others) == {(7,): row(7)}
        if probe.capabilities.stores_position:
            assert kit_load.committed() == batch.end

    def test_close_twice(self, probe, kit_items):
        """`close()` is idempotent, also on a Load that never opened."""
        items = kit_items
        never = probe.make_load()
        never.close()
        never.close()
        load = probe.make_load()
        load.open()
        load.load(make_batch([items.insert(**row(1))]))
        load.close()
        load.close()
        assert probe.state(items) == {(1,): row(1)}

    # -- snapshot reads (Op.READ): "insert, or replace the row with the same key"

    def test_read_batch_loaded_twice_is_idempotent(self, probe, kit_items, kit_load):
        """A batch of snapshot reads applied twice (a chunk copied again after a crash) leaves the
        target as applied once, also when loaded again by a new Load."""
        items = kit_items
        batch = make_batch([items.read(**row(i, f"r{i}", i)) for i in range(1, 6)], id=1)
        kit_load.load(batch)
        once = probe.state(items)
        kit_load.load(batch)
        again = probe.make_load()
        again.open()
        try:
            again.load(batch)
        finally:
            again.close()
        assert probe.state(items) == once == {(i,): row(i, f"r{i}", i) for i in range(1, 6)}

    def test_read_replaces_an_existing_row(self, probe, kit_items, kit_load):
        """A read of a key the target holds replaces that row (from an earlier batch, and from an
        insert or update earlier in the same batch)."""
        items = kit_items
        kit_load.load(make_batch([items.insert(**row(1, "old", 1))], id=1))
        kit_load.load(make_batch([items.read(**row(1, "snap", 2)),
                                  items.insert(**row(2, "new", 3)), items.update(row(2, "new", 3), qty=4),
                                  items.read(**row(2, "snap", 5))], id=2))
        assert probe.state(items) == {(1,): row(1, "snap", 2), (2,): row(2, "snap", 5)}

    def test_read_then_delete(self, probe, kit_items, kit_load):
        """A delete after a read of the same key removes the row, in the same batch or a later one;
        a change after a read applies on top of it."""
        items = kit_items
        kit_load.load(make_batch([items.read(**row(1)), items.read(**row(2)), items.delete(**row(1)),
                                  items.read(**row(3))], id=1))
        kit_load.load(make_batch([items.delete(**row(2)), items.update(row(3), qty=9)], id=2))
        assert probe.state(items) == {(3,): row(3, "n", 9)}

    def test_reads_into_a_table_without_a_key(self, probe, kit_load):
        """Into a table without a primary key a read is a plain insert: every read row arrives once,
        duplicates of equal rows included."""
        loose = TableSpec(probe.schema, "loose", key=())
        probe.create(loose)
        reads = [loose.read(**row(i % 3, f"r{i % 3}", i % 3)) for i in range(7)]
        kit_load.load(make_batch(reads, id=1))
        got = sorted(probe.rows(loose), key=lambda r: sorted(r.items(), key=repr))
        want = sorted((dict(c.after) for c in reads if c.after is not None), key=lambda r: sorted(r.items(), key=repr))
        assert got == want, (f"rows of a keyless table after 7 reads: {got}; if the target holds them, "
                             f"the probe's rows() should return them all (see TargetProbe.rows)")

    def test_random_sequences_match_the_model(self, probe):
        """Random inserts, updates (key changes included) and deletes, cut into random batches,
        leave the table as applying them one by one does."""
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        counter = itertools.count(1)

        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.data())
        def check(data: st.DataObject) -> None:
            n = next(counter)
            spec = TableSpec(probe.schema, f"model{n}")
            probe.create(spec)
            live: dict[int, dict[str, Any]] = {}
            changes: list[RowChange] = []
            for _ in range(data.draw(st.integers(1, 30), label="length")):
                key = data.draw(st.integers(0, 5), label="key")
                if key not in live:
                    live[key] = row(key, data.draw(st.sampled_from("abc")), data.draw(st.none() | st.integers(-5, 5)))
                    changes.append(spec.insert(**live[key]))
                    continue
                action = data.draw(st.sampled_from(["update", "rekey", "delete"]), label="action")
                before = live.pop(key)
                if action == "delete":
                    changes.append(spec.delete(**before))
                    continue
                free = [k for k in range(6) if k not in live]
                new = data.draw(st.sampled_from(free), label="new key") if action == "rekey" else key
                live[new] = {**before, "id": new, "qty": data.draw(st.none() | st.integers(-5, 5))}
                changes.append(spec.update(before, **live[new]))
            cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(changes) - 1)), max_size=4), label="cuts"))
            bounds = [0, *[c for c in cuts if c < len(changes)], len(changes)]
            load = probe.make_load(f"model{n}")
            load.open()
            try:
                for number, (lo, hi) in enumerate(itertools.pairwise(bounds), start=1):
                    load.load(make_batch(changes[lo:hi], id=number, pipeline=f"model{n}"))
            finally:
                load.close()
            assert probe.state(spec) == {(k,): v for k, v in live.items()}

        check()


# --- sources --------------------------------------------------------------------------------


class SourceProbe:
    """A connector author's access to one fresh, empty source, for `SelectContract`.

    `write` commits transactions at the source, in order (a file source appends lines, a database
    runs them). `make_select` builds the connector's Select (not opened), reading the source from
    its beginning. `tables` lists the tables the suite writes, created by `create`.
    """

    #: Seconds the suite waits for a written transaction to come out of `poll`.
    wait = 20.0

    @property
    def capabilities(self) -> SelectCapabilities:
        select = self.make_select()  # built only to be asked: closed, as a built Select may hold a process
        try:
            return select.capabilities
        finally:
            select.close()

    def create(self, table: TableSpec) -> None:
        """Create `table` at the source if it must exist before rows are written."""

    def write(self, transactions: Sequence[Sequence[RowChange]]) -> None:
        raise NotImplementedError

    def make_select(self, pipeline: str = "p") -> Select:
        raise NotImplementedError

    def owns(self, tx: Transaction) -> bool:
        """Whether a transaction read is one of the suite's (a shared server's log holds others too)."""
        return True

    @property
    def schema(self) -> str:
        return "demo"


def _rows(tx: Transaction | Sequence[Change]) -> list[tuple[Any, ...]]:
    """What a transaction says, without positions: (op, table, key, before, after) per row change."""
    changes = tx.changes if isinstance(tx, Transaction) else tx
    return [(c.op, c.schema, c.table, tuple(c.primary_key),
             dict(c.before) if c.before is not None else None,
             dict(c.after) if c.after is not None else None)
            for c in changes if isinstance(c, RowChange)]


class SelectContract:
    """What every source must do: whole transactions in log order, each once, resumable after any
    transaction's end, and the capabilities it declares. Subclasses provide a `probe` fixture (a
    `SourceProbe`)."""

    @pytest.fixture
    def kit_items(self, probe: SourceProbe) -> TableSpec:
        spec = TableSpec(probe.schema, "items")
        probe.create(spec)
        return spec

    def txs(self, items: TableSpec, first: int, count: int) -> list[list[RowChange]]:
        """`count` transactions: one inserting two rows, the next updating one and deleting the other."""
        result = []
        for i in range(first, first + count):
            if i % 2:
                result.append([items.insert(**row(2 * i, f"a{i}", i)), items.insert(**row(2 * i + 1, f"b{i}", i))])
            else:
                j = i - 1
                result.append([items.update(row(2 * j, f"a{j}", j), name=f"c{i}"),
                               items.delete(**row(2 * j + 1, f"b{j}", j))])
        return result

    def read(self, select: Select, probe: SourceProbe, count: int) -> list[Transaction]:
        """`count` complete transactions from `select`, joining pieces, within the probe's wait."""
        found: list[Transaction] = []
        pieces: list[Change] = []
        deadline = time.monotonic() + probe.wait
        while len(found) < count:
            assert time.monotonic() < deadline, f"only {len(found)} of {count} transactions arrived"
            tx = select.poll(0.2)
            if tx is None:
                continue
            pieces.extend(tx.changes)
            if tx.complete:
                whole = attrs.evolve(tx, changes=tuple(pieces))
                pieces = []
                if probe.owns(whole):
                    found.append(whole)
        return found

    def write_and_read(self, probe: SourceProbe, items: TableSpec, select: Select,
                       count: int) -> tuple[list[list[RowChange]], list[Transaction]]:
        """`count` transactions (`txs`) written, and what `select`, opened at the start, reads of them."""
        written = self.txs(items, 1, count)
        probe.write(written)
        select.open(None)
        return written, self.read(select, probe, count)

    def nothing_more(self, select: Select, probe: SourceProbe, seconds: float = 0.5) -> bool:
        """Whether no transaction of the suite's arrives within `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            tx = select.poll(0.1)
            if tx is not None and probe.owns(tx):
                return False
        return True

    @pytest.fixture
    def kit_select(self, probe: SourceProbe):
        select = probe.make_select()
        yield select
        select.close()

    def test_transactions_in_order_once(self, probe, kit_items, kit_select):
        """Written transactions come out whole, in order, with ascending ends, and nothing after them."""
        written, got = self.write_and_read(probe, kit_items, kit_select, 4)
        assert [_rows(tx) for tx in got] == [_rows(tx) for tx in written]
        ends = [tx.end for tx in got]
        assert ends == sorted(set(ends))
        assert self.nothing_more(kit_select, probe)

    def test_open_after_an_end_resumes_there(self, probe, kit_items, kit_select):
        """Opening at a transaction's end yields the transactions after it and none before."""
        written, got = self.write_and_read(probe, kit_items, kit_select, 4)
        again = probe.make_select()
        again.open(got[1].end)
        try:
            assert [_rows(tx) for tx in self.read(again, probe, 2)] == [_rows(tx) for tx in written[2:]]
        finally:
            again.close()

    def test_seek_rewinds(self, probe, kit_items, kit_select):
        """`seek` to an earlier end replays the transactions after it, as the scheduler's rollback needs."""
        written, got = self.write_and_read(probe, kit_items, kit_select, 3)
        kit_select.seek(got[0].end)
        assert [_rows(tx) for tx in self.read(kit_select, probe, 2)] == [_rows(tx) for tx in written[1:]]

    def test_transactions_written_later_arrive(self, probe, kit_items, kit_select):
        """Transactions committed after `open` come out too, after the earlier ones."""
        items = kit_items
        written = self.txs(items, 1, 4)
        probe.write(written[:2])
        kit_select.open(None)
        first = self.read(kit_select, probe, 2)
        probe.write(written[2:])
        assert [_rows(tx) for tx in first + self.read(kit_select, probe, 2)] == [_rows(tx) for tx in written]

    def test_head_when_declared(self, probe, kit_items, kit_select):
        """With `reports_head`, `head()` is at or past the last transaction's end; without it, None."""
        _, got = self.write_and_read(probe, kit_items, kit_select, 2)
        head = kit_select.head()
        if probe.capabilities.reports_head:
            assert head is not None and head >= got[-1].end
        else:
            assert head is None

    def test_close_twice(self, probe):
        """`close()` is idempotent, also on a Select that never opened."""
        select = probe.make_select()
        select.close()
        select.open(None)
        select.close()
        select.close()
        assert select.capabilities == probe.capabilities
