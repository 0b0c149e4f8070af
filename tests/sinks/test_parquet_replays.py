"""The Parquet target's replay rule, driven without servers: a copy's chunk batches at one position,
the stream after them, split transactions and two tables, through kill -9 at every file write and
replays in later epochs cut differently. The change log must hold every change exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from setl.model import Batch, DdlChange, Op, Position, RowChange
from setl.sinks.parquet import ParquetLoad, file_name
from setl.stages.load import supports_per_table
from setl.testing.harness import parquet_rows, parquet_state

LOG = "bin.000001"
P0 = Position(LOG, 100)


class Killed(BaseException):
    """The process dies here (kill -9): nothing after it runs."""


def row(op: Op, table: str, image: dict[str, Any], at: Position, before: dict[str, Any] | None = None) -> RowChange:
    key = ("id",) if table == "k" else ()
    if op in (Op.INSERT, Op.READ):
        return RowChange(op, "s", table, key, None, image, at)
    if op is Op.DELETE:
        return RowChange(op, "s", table, key, image, None, at)
    return RowChange(op, "s", table, key, before, image, at)


def stream() -> list[tuple[tuple[RowChange, ...], Position]]:
    """Transactions as a snapshot source hands them on: (changes, end). Chunks end where the stream is."""
    at200, at500 = Position(LOG, 200), Position(LOG, 500)

    def split(n: int) -> Position:
        return Position(LOG, 300, row=n)

    return [
        (tuple(row(Op.READ, "k", {"id": i, "v": i}, P0) for i in (1, 2, 3)), P0),  # a chunk at the copy's position
        (tuple(row(Op.READ, "k", {"id": i, "v": i}, P0) for i in (4, 5, 6)), P0),  # another one, same place
        (tuple(row(Op.READ, "log", {"msg": m}, P0) for m in ("a", "a", "b")), P0),  # a keyless table's copy
        ((row(Op.UPDATE, "k", {"id": 2, "v": -2}, at200, {"id": 2, "v": 2}),
          row(Op.INSERT, "log", {"msg": "c"}, at200)), at200),
        (tuple(row(Op.READ, "k", {"id": i, "v": i}, at200) for i in (7, 8)), at200),  # a chunk after it
        ((row(Op.INSERT, "k", {"id": 9, "v": 9}, split(1)), row(Op.INSERT, "log", {"msg": "a"}, split(2))), split(2)),
        ((row(Op.UPDATE, "k", {"id": 9, "v": 90}, split(3), {"id": 9, "v": 9}),
          row(Op.DELETE, "log", {"msg": "a"}, split(4))), split(4)),
        ((row(Op.INSERT, "k", {"id": 10, "v": 10}, split(5)),), Position(LOG, 400)),  # the split one's last piece
        ((row(Op.DELETE, "k", {"id": 1, "v": 1}, at500), row(Op.INSERT, "log", {"msg": "d"}, at500)), at500),
    ]


def expected() -> tuple[dict[tuple[Any, ...], dict[str, Any]], list[dict[str, Any]]]:
    """The source's state after the whole stream: table k by key, table log as a list of rows."""
    keyed: dict[tuple[Any, ...], dict[str, Any]] = {}
    keyless: list[dict[str, Any]] = []
    for changes, _ in stream():
        for c in changes:
            if c.table == "k":
                if c.before is not None:
                    keyed.pop((c.before["id"],), None)
                if c.after is not None:
                    keyed[(c.after["id"],)] = c.after
            else:
                if c.before is not None:
                    keyless.remove(c.before)
                if c.after is not None:
                    keyless.append(c.after)
    return keyed, keyless


def cut(txs: list[tuple[tuple[RowChange, ...], Position]], first: int, start: Position, size: int, first_id: int,
        epoch: int) -> list[tuple[Batch, int]]:
    """Batches of `size` transactions from transaction `first`, with the index after each batch's last."""
    out = []
    i, bid = first, first_id
    while i < len(txs):
        chunk = txs[i:i + size]
        end = chunk[-1][1]
        out.append((Batch("p", bid, epoch, start, end, tuple(c for changes, _ in chunk for c in changes)),
                    i + len(chunk)))
        start, i, bid = end, i + len(chunk), bid + 1
    return out


def run(root: Path, monkeypatch: pytest.MonkeyPatch, *, acked: tuple[int, int, Position], size: int, epoch: int,
        die_after: int | None) -> tuple[int, int, Position]:
    """One process: open the target, load batches cut `size` transactions at a time from the ack, ack each
    batch but the last loaded one (it is still in flight), die after `die_after` file writes. The new ack."""
    txs = stream()
    acked_id, acked_tx, acked_at = acked
    load = ParquetLoad(root, pipeline="p", fsync=False)
    load.open()
    writes = [0]
    real = ParquetLoad._write_file

    def counted(self: ParquetLoad, *args: Any) -> Path:
        if die_after is not None and writes[0] >= die_after:
            raise Killed()
        writes[0] += 1
        return real(self, *args)

    monkeypatch.setattr(ParquetLoad, "_write_file", counted)
    loaded: list[tuple[Batch, int]] = []
    try:
        for batch, after in cut(txs, acked_tx, acked_at, size, acked_id + 1, epoch):
            load.load(batch)
            if loaded:  # the batch before this one is acked now
                done, done_tx = loaded[-1]
                acked_id, acked_tx, acked_at = done.id, done_tx, done.end
            loaded.append((batch, after))
        if loaded:
            done, done_tx = loaded[-1]
            acked_id, acked_tx, acked_at = done.id, done_tx, done.end
    except Killed:
        pass
    finally:
        monkeypatch.setattr(ParquetLoad, "_write_file", real)
    return acked_id, acked_tx, acked_at


def acked_changes_are_exact(root: Path, acked_id: int, acked_tx: int) -> None:
    """Rows of batches up to the ack are exactly the acked transactions' changes, once each."""
    want = Counter((c.table, c.op.value, str(c.position), repr(sorted((c.after or c.before or {}).items())))
                   for changes, _ in stream()[:acked_tx] for c in changes)
    got: Counter[tuple[str, str, str, str]] = Counter()
    for path in root.rglob("*.parquet"):
        table = path.parent.name.split(".", 1)[1]
        for r in pq.read_table(path).to_pylist():
            if r["_setl_batch"] <= acked_id:
                image = sorted((k, v) for k, v in r.items() if not k.startswith("_setl_"))
                got[(table, r["_setl_op"], r["_setl_position"], repr(image))] += 1
    assert got == want


def final_is_exact(root: Path) -> None:
    keyed, keyless = expected()
    assert parquet_state(root, "s.k") == keyed
    assert sorted(map(repr, parquet_rows(root, "s.log"))) == sorted(map(repr, keyless))
    total = sum(len(changes) for changes, _ in stream())
    assert sum(pq.read_metadata(p).num_rows for p in root.rglob("*.parquet")) == total  # no change twice


WRITES = 13  # file writes of the whole stream cut one transaction a batch (one per table touched)


@pytest.mark.parametrize("die_after", range(WRITES + 1))
def test_kill_at_every_write_then_replays_cut_differently_end_exact(tmp_path, monkeypatch, die_after):
    """Killed after each file write of a first run (1 transaction a batch), then killed again in a replay
    cut 2 transactions a batch, then replayed 3 a batch: acked changes are intact at each point, and the
    log ends holding every change once (chunks at one position, a split transaction, two tables)."""
    root = tmp_path / "lake"
    first = run(root, monkeypatch, acked=(0, 0, P0), size=1, epoch=1, die_after=die_after)
    acked_changes_are_exact(root, first[0], first[1])
    second = run(root, monkeypatch, acked=first, size=2, epoch=2, die_after=die_after // 2)
    acked_changes_are_exact(root, second[0], second[1])
    run(root, monkeypatch, acked=second, size=3, epoch=3, die_after=None)
    final_is_exact(root)


def test_the_stream_writes_the_counted_number_of_files(tmp_path, monkeypatch):
    """The whole stream, one transaction a batch, writes `WRITES` files (so the kill points above cover each)."""
    run(tmp_path / "lake", monkeypatch, acked=(0, 0, P0), size=1, epoch=1, die_after=None)
    assert len(list((tmp_path / "lake").rglob("*.parquet"))) == WRITES
    final_is_exact(tmp_path / "lake")


def test_chunk_batches_at_one_position_and_the_stream_after_them_keep_their_files(tmp_path):
    """Copy batches that start and end at the same position, and the streamed batch starting there, each
    keep their own file (the bug: all were part-LOG-OFFSET.parquet and the last one won)."""
    load = ParquetLoad(tmp_path / "lake", pipeline="p", fsync=False)
    txs = stream()
    batches = [Batch("p", 1, 1, P0, P0, txs[0][0]), Batch("p", 2, 1, P0, P0, txs[1][0]),
               Batch("p", 3, 1, P0, Position(LOG, 200), txs[3][0])]
    for batch in batches:
        load.load(batch)
    names = sorted(p.name for p in (tmp_path / "lake" / "s.k").glob("*.parquet"))
    assert names == sorted(file_name(P0, b.id, 1) for b in batches)
    assert sorted(parquet_state(tmp_path / "lake", "s.k")) == [(i,) for i in range(1, 7)]
    again = ParquetLoad(tmp_path / "lake", pipeline="p", fsync=False)  # a restart, streaming from P0 again
    again.load(Batch("p", 3, 2, P0, Position(LOG, 200), txs[3][0]))
    assert parquet_state(tmp_path / "lake", "s.k")[(2,)] == {"id": 2, "v": -2}
    assert len(parquet_state(tmp_path / "lake", "s.k")) == 6 and len(list((tmp_path / "lake").rglob("*.parquet"))) == 4


def test_a_sweep_never_removes_files_of_earlier_batches_or_older_names(tmp_path):
    """A replay in a new epoch removes files of its batch id and later of older epochs only: an earlier
    batch's file and a file named before batch ids were in names (treated as acknowledged) stay."""
    root = tmp_path / "lake"
    load = ParquetLoad(root, pipeline="p", fsync=False)
    txs = stream()
    load.load(Batch("p", 1, 1, P0, P0, txs[0][0]))
    load.load(Batch("p", 2, 1, P0, P0, txs[1][0]))
    old = root / "s.k" / "part-bin.000001-00000000000000000100.parquet"
    (root / "s.k" / file_name(P0, 1, 1)).rename(old)
    restarted = ParquetLoad(root, pipeline="p", fsync=False)
    restarted.load(Batch("p", 2, 5, P0, P0, txs[1][0]))
    assert sorted(p.name for p in (root / "s.k").glob("*.parquet")) == sorted([old.name, file_name(P0, 2, 5)])
    assert sorted(parquet_state(root, "s.k")) == [(i,) for i in range(1, 7)]


def test_the_target_does_not_load_per_table(tmp_path):
    """The replay rule needs batches loaded in id order: the target does not declare ``per_table``."""
    assert not supports_per_table(ParquetLoad(tmp_path / "lake", pipeline="p"))


def fields(path: Path) -> frozenset[tuple[str, str]]:
    """A file's columns and their types (readers match columns by name)."""
    return frozenset((f.name, str(f.type)) for f in pq.read_schema(path))


def truncate(table: str, at: Position) -> DdlChange:
    return DdlChange("s", table, f"TRUNCATE TABLE `s`.`{table}`", position=at, snapshot=True)


def test_a_truncate_empties_the_table_for_a_reader_and_the_copy_after_it_is_exact(tmp_path):
    """A snapshot's TRUNCATE is a ``truncate`` row: the re-copy after it replaces the table's rows
    (no keyless row twice, no row the source lost kept), even at the position of the changes before it."""
    root = tmp_path / "lake"
    load = ParquetLoad(root, pipeline="p", fsync=False)
    p200 = Position(LOG, 200)
    load.load(Batch("p", 1, 1, P0, p200, (row(Op.INSERT, "k", {"id": 1, "v": 1}, p200),
                                          row(Op.INSERT, "k", {"id": 2, "v": 2}, p200),
                                          row(Op.INSERT, "log", {"msg": "a"}, p200))))
    load.load(Batch("p", 2, 1, p200, p200, (truncate("k", p200),)))
    load.load(Batch("p", 3, 1, p200, p200, (truncate("log", p200),)))
    load.load(Batch("p", 4, 1, p200, p200, (row(Op.READ, "k", {"id": 2, "v": 2}, p200),
                                            row(Op.READ, "log", {"msg": "a"}, p200))))
    assert parquet_state(root, "s.k") == {(2,): {"id": 2, "v": 2}}
    assert parquet_rows(root, "s.log") == [{"msg": "a"}]
    ops = sorted(r["_setl_op"] for p in (root / "s.k").glob("*.parquet") for r in pq.read_table(p).to_pylist())
    assert ops == ["insert", "insert", "read", "truncate"]
    schemas = {fields(p) for p in (root / "s.k").glob("*.parquet")}
    assert len(schemas) == 1  # the truncate file has every column, typed: a reader may take its schema


def test_a_truncate_before_any_row_gets_the_columns_the_rows_bring(tmp_path):
    """A first copy's TRUNCATE, written before the table has any file, gains the columns of the rows
    after it (all NULL), so every file of the table reads with one schema."""
    root = tmp_path / "lake"
    load = ParquetLoad(root, pipeline="p", fsync=False)
    load.load(Batch("p", 1, 1, P0, P0, (truncate("k", P0),)))
    load.load(Batch("p", 2, 1, P0, P0, (row(Op.READ, "k", {"id": 1, "v": 1}, P0),)))
    assert {fields(p) for p in (root / "s.k").glob("*.parquet")} == {fields(root / "s.k" / file_name(P0, 2, 1))}
    assert parquet_state(root, "s.k") == {(1,): {"id": 1, "v": 1}}


def test_a_truncate_of_a_partitioned_table_is_in_the_null_partition(tmp_path):
    """With ``partition_by`` a truncate row (no image) goes to the NULL partition, and still empties
    every partition for a reader."""
    root = tmp_path / "lake"
    load = ParquetLoad(root, pipeline="p", fsync=False, partition_by=("v",))
    load.load(Batch("p", 1, 1, P0, P0, (row(Op.READ, "k", {"id": 1, "v": 1}, P0),
                                        row(Op.READ, "k", {"id": 2, "v": 2}, P0))))
    load.load(Batch("p", 2, 1, P0, P0, (truncate("k", P0),)))
    load.load(Batch("p", 3, 1, P0, P0, (row(Op.READ, "k", {"id": 2, "v": 2}, P0),)))
    assert (root / "s.k" / "v=__HIVE_DEFAULT_PARTITION__" / file_name(P0, 2, 1)).is_file()
    assert parquet_state(root, "s.k") == {(2,): {"id": 2, "v": 2}}
