"""The shared binlog reader on real MariaDB: one stream for many pipelines, each getting exactly what
its own reader would, however it joins, falls behind, resumes or fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from setl.errors import SourceError
from setl.loop_marks import MARK_DDL
from setl.model import Position, RowChange, Transaction
from setl.sources import shared_binlog
from setl.sources.mysql_binlog.handoff import LATE_FRESH, LATE_SECONDS
from setl.sources.shared_binlog import READERS, SharedBinlogSource
from setl.testing.servers import wait_until
from tests.sources.binlog import bare, execute, head, make_source, next_server_id
from tests.sources.test_ignore_marks import THEIRS, write_echoes

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def subscribers(mariadb_source) -> Iterator[Callable[..., SharedBinlogSource]]:
    """Makes shared-reader subscribers of `mariadb_source` (one shared server_id per test), closing them after."""
    made: list[SharedBinlogSource] = []
    shared_id = next_server_id()

    def make(tables: tuple[str, ...] | None, *, pipeline: str = "p", **kwargs: Any) -> SharedBinlogSource:
        cfg = mariadb_source.source_config(next_server_id(), "latest")
        selects = None if tables is None else (lambda schema, table: table in tables)
        src = SharedBinlogSource.from_config(cfg, pipeline=pipeline, shared_server_id=shared_id, selects=selects,
                                             **kwargs)
        made.append(src)
        return src

    yield make
    for src in made:
        src.close()
    wait_until(lambda: READERS.count() == 0, timeout=10, message="every shared reader stopped")


def dumps(server: Any) -> int:
    """The binlog streams the server serves now."""
    return int(server.query("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                            "WHERE COMMAND LIKE 'Binlog Dump%'")[0][0])


def rows(transactions: list[Transaction]) -> list[tuple[str, str, int, Position | None]]:
    """Every row change as (table, op, id, its position)."""
    return [(c.table, c.op, c.image["id"], c.position) for tx in transactions for c in tx.changes
            if isinstance(c, RowChange)]


def poll_until(src: Any, end: Position, timeout: float = 20) -> list[Transaction]:
    """Poll `src`, keeping what it hands on, until its tell reaches `end`."""
    got: list[Transaction] = []

    def done() -> bool:
        tx = src.poll(0.1)
        if tx is not None:
            got.append(tx)
        at = src.tell()
        return at is not None and at.log == end.log and at.offset >= end.offset and at.row == 0

    wait_until(done, timeout=timeout, interval=0, message=f"the reader at {end}")
    return got


def alone(server: Any, start: Position, end: Position, tables: tuple[str, ...], **kwargs: Any) -> list[Transaction]:
    """What a pipeline's own reader hands on from `start` to `end` in transactions touching `tables`."""
    src = make_source(server, **kwargs)
    try:
        src.open(start)
        return [tx for tx in poll_until(src, end) if any(getattr(c, "table", None) in tables for c in tx.changes)]
    finally:
        src.close()


def setup_tables(server: Any, db: str, *names: str) -> None:
    execute(server, db, *(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20))" for name in names))


def test_three_pipelines_read_one_stream_and_each_gets_its_tables(mariadb_source, source_db, subscribers):
    """Three pipelines on different tables share one binlog connection; each gets exactly its own reader's rows."""
    setup_tables(mariadb_source, source_db, "a", "b", "c")
    wait_until(lambda: dumps(mariadb_source) == 0, timeout=15, message="no other binlog reader")
    start = head(mariadb_source)
    subs = {name: subscribers((name,), pipeline=f"p_{name}") for name in "abc"}
    for src in subs.values():
        src.open(start)
    execute(mariadb_source, source_db, *(f"INSERT INTO {t} VALUES ({i}, 'x')" for i in range(1, 21) for t in "abc"),
            "UPDATE a SET v = 'y' WHERE id < 5", "DELETE FROM c WHERE id > 15",
            "INSERT INTO b VALUES (100, 'z')")
    end = head(mariadb_source)
    got = {name: poll_until(src, end) for name, src in subs.items()}
    assert dumps(mariadb_source) == 1 and READERS.count() == 1
    for name, transactions in got.items():
        assert {c[0] for c in rows(transactions)} == {name}
        assert rows(transactions) == [r for r in rows(alone(mariadb_source, start, end, (name,))) if r[0] == name]
        assert all(src.shared for src in subs.values())


def test_a_paused_pipeline_is_dropped_and_reads_alone_exactly(mariadb_source, source_db, subscribers):
    """A pipeline that stops polling is dropped once its buffer fills; the other goes on; it then resumes exactly."""
    setup_tables(mariadb_source, source_db, "a")
    start = head(mariadb_source)
    fast, slow = subscribers(None, pipeline="fast", max_rows_in_memory=10), \
        subscribers(None, pipeline="slow", max_rows_in_memory=10)
    fast.open(start)
    slow.open(start)
    execute(mariadb_source, source_db, *(f"INSERT INTO a VALUES ({i}, 'x')" for i in range(1, 61)))
    end = head(mariadb_source)
    got_fast = poll_until(fast, end)  # `slow` polls nothing meanwhile: a paused pipeline
    assert [c[2] for c in rows(got_fast)] == list(range(1, 61))
    got_slow = poll_until(slow, end)
    assert slow.drops == 1 and rows(got_slow) == rows(got_fast)
    execute(mariadb_source, source_db, *(f"INSERT INTO a VALUES ({i}, 'x')" for i in range(61, 66)))
    end = head(mariadb_source)
    assert [c[2] for c in rows(poll_until(slow, end))] == list(range(61, 66))
    wait_until(lambda: slow.poll(0.1) is None and slow.shared, timeout=10, message="the dropped pipeline rejoined")
    assert [c[2] for c in rows(poll_until(fast, end))] == list(range(61, 66))


def test_pipelines_all_slower_than_the_stream_make_it_wait_instead_of_being_dropped(mariadb_source, source_db,
                                                                                   subscribers):
    """When every pipeline has rows queued (a catch-up), a full buffer makes the stream wait: nobody is dropped."""
    setup_tables(mariadb_source, source_db, "a")
    start = head(mariadb_source)
    subs = [subscribers(None, pipeline=f"s{n}", max_rows_in_memory=5) for n in range(2)]
    for src in subs:
        src.open(start)
    execute(mariadb_source, source_db, *(f"INSERT INTO a VALUES ({i}, 'x')" for i in range(1, 201)))
    end = head(mariadb_source)
    got: list[list[Transaction]] = [[], []]

    def both() -> bool:  # one thread polls both in turn, each a transaction at a time
        for n, src in enumerate(subs):
            tx = src.poll(0.05)
            if tx is not None:
                got[n].append(tx)
        return all(src.tell() is not None and src.tell() >= end for src in subs)  # type: ignore[operator]

    wait_until(both, timeout=30, interval=0, message="both pipelines at the end")
    assert [c[2] for c in rows(got[0])] == [c[2] for c in rows(got[1])] == list(range(1, 201))
    assert [src.drops for src in subs] == [0, 0] and all(src.shared for src in subs)


def test_position_marks_passed_over_free_their_room_in_the_buffer(mariadb_source, source_db, subscribers):
    """Marks a later mark supersedes leave the buffer's count with it: an emptied buffer counts nothing."""
    setup_tables(mariadb_source, source_db, "a", "b")
    start = head(mariadb_source)
    src = subscribers(("a",), pipeline="marks")
    src.open(start)
    reader = src._shared_reader
    assert reader is not None
    execute(mariadb_source, source_db, *(f"INSERT INTO b VALUES ({i}, 'x')" for i in range(1, 41)))  # marks for it
    end = head(mariadb_source)
    wait_until(lambda: reader.pumped >= end, timeout=20, message="the stream past the inserts")
    poll_until(src, end)
    assert src._sub is not None and src._sub.queued_rows() == 0


def test_pipelines_that_all_stop_asking_are_dropped_and_resume_exactly(mariadb_source, source_db, subscribers,
                                                                       monkeypatch):
    """When every pipeline stops asking for rows with its buffer full, the stream drops them all after STUCK_SECONDS."""
    monkeypatch.setattr(shared_binlog, "STUCK_SECONDS", 1.0)
    setup_tables(mariadb_source, source_db, "a")
    start = head(mariadb_source)
    subs = [subscribers(None, pipeline=f"s{n}", max_rows_in_memory=5) for n in range(2)]
    for src in subs:
        src.open(start)
    execute(mariadb_source, source_db, *(f"INSERT INTO a VALUES ({i}, 'x')" for i in range(1, 61)))
    end = head(mariadb_source)
    reader = subs[0]._shared_reader
    assert reader is not None
    wait_until(lambda: reader.pumped >= end, timeout=20, message="the stream past the inserts")  # nobody polls
    for src in subs:
        assert [c[2] for c in rows(poll_until(src, end))] == list(range(1, 61))
        assert src.drops == 1


def test_a_pipeline_started_behind_catches_up_exactly(mariadb_source, source_db, subscribers, monkeypatch):
    """A pipeline far behind the shared stream reads alone, gets exactly its own reader's rows, then joins."""
    monkeypatch.setattr(shared_binlog, "REWIND_BYTES", 0)  # any gap is "far"
    monkeypatch.setattr(shared_binlog, "MERGE_EVERY", 0.05)
    setup_tables(mariadb_source, source_db, "a", "b")
    early = head(mariadb_source)
    execute(mariadb_source, source_db, *(f"INSERT INTO {t} VALUES ({i}, 'x')" for i in range(1, 11) for t in "ab"))
    middle = head(mariadb_source)
    ahead = subscribers(("a",), pipeline="ahead")
    ahead.open(middle)
    # the stream reads from `middle` (it no longer waits for siblings built and not opened yet)
    wait_until(lambda: READERS.reading() == 1, timeout=10, message="the shared stream open")
    behind = subscribers(("b",), pipeline="behind")
    behind.open(early)
    assert ahead.shared and not behind.shared
    execute(mariadb_source, source_db, *(f"INSERT INTO {t} VALUES ({i}, 'x')" for i in range(11, 16) for t in "ab"))
    end = head(mariadb_source)
    got = poll_until(behind, end)  # read alone: every table's rows, as a pipeline's own reader hands them on
    expected = [r for r in rows(alone(mariadb_source, early, end, ("b",))) if r[0] == "b"]
    assert [r for r in rows(got) if r[0] == "b"] == expected and len(expected) == 15
    assert [c[2] for c in rows(poll_until(ahead, end))] == list(range(11, 16))
    wait_until(lambda: behind.poll(0.05) is None and behind.shared, timeout=10, message="the late pipeline joined")
    execute(mariadb_source, source_db, "INSERT INTO b VALUES (99, 'late')")
    assert [c[2] for c in rows(poll_until(behind, head(mariadb_source)))] == [99]
    # the server drops the dump thread of a closed stream when it next writes to it: wait for that
    wait_until(lambda: dumps(mariadb_source) == 1, timeout=10, message="one binlog stream")


def test_a_pipeline_joining_a_little_behind_rewinds_the_stream_and_nobody_repeats(mariadb_source, source_db,
                                                                                    subscribers):
    """A pipeline joining close behind rewinds the shared stream: it gets its rows, the other gets no row twice."""
    setup_tables(mariadb_source, source_db, "a")
    early = head(mariadb_source)
    first = subscribers(None, pipeline="first")
    first.open(early)
    execute(mariadb_source, source_db, *(f"INSERT INTO a VALUES ({i}, 'x')" for i in range(1, 11)))
    middle = head(mariadb_source)
    assert [c[2] for c in rows(poll_until(first, middle))] == list(range(1, 11))
    second = subscribers(None, pipeline="second")
    second.open(early)
    assert second.shared
    execute(mariadb_source, source_db, "INSERT INTO a VALUES (11, 'x')")
    end = head(mariadb_source)
    assert [c[2] for c in rows(poll_until(second, end))] == list(range(1, 12))
    assert [c[2] for c in rows(poll_until(first, end))] == [11]
    assert second._shared_reader is not None and second._shared_reader.rewinds == 1


def test_a_resume_inside_a_split_transaction_is_exact(mariadb_source, source_db, subscribers):
    """A pipeline resuming at a piece end inside a split transaction gets exactly the transaction's later rows."""
    setup_tables(mariadb_source, source_db, "a", "b")
    start = head(mariadb_source)
    statements = ["BEGIN", *(f"INSERT INTO {t} VALUES ({i}, 'x')" for i in range(1, 8) for t in "ab"), "COMMIT",
                  "INSERT INTO a VALUES (100, 'after')"]
    execute(mariadb_source, source_db, *statements)
    end = head(mariadb_source)
    everything = alone(mariadb_source, start, end, ("a", "b"), max_rows_in_memory=4)
    pieces = [tx for tx in everything if not tx.complete]
    assert len(pieces) >= 2
    for piece in pieces:
        resumed = subscribers(("a",), pipeline=f"r{piece.end.row}", max_rows_in_memory=4)
        resumed.open(piece.end)
        got = poll_until(resumed, end)
        expected = [r for r in rows(everything) if r[0] == "a" and r[3] is not None and r[3] > piece.end]
        assert rows(got) == expected and [r[2] for r in rows(got)][-1] == 100
        resumed.close()


def test_a_source_failure_reaches_every_pipeline_as_its_own_error(mariadb_source, source_db, subscribers):
    """A refusal of the shared stream (a statement-logged write) stops each pipeline with an error naming it."""
    setup_tables(mariadb_source, source_db, "a")
    start = head(mariadb_source)
    subs = [subscribers(None, pipeline=name) for name in ("one", "two")]
    for src in subs:
        src.open(start)
    execute(mariadb_source, source_db, "INSERT INTO a VALUES (1, 'row')", "SET SESSION binlog_format = 'STATEMENT'",
            "INSERT INTO a VALUES (2, 'statement')")
    for src in subs:
        seen, error = poll_until_error(src)
        assert error.context.get("pipeline") == src.pipeline and error.context.get("stage") == "select"
        assert "statement" in str(error).lower()
        assert [c[2] for c in rows(seen)] == [1]
    assert subs[0]._shared_reader is None and subs[1]._shared_reader is None


def poll_until_error(src: Any, timeout: float = 15) -> tuple[list[Transaction], SourceError]:
    """Poll `src` until it raises; what it handed on before, and the error."""
    got: list[Transaction] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tx = src.poll(0.1)
        except SourceError as exc:
            return got, exc
        if tx is not None:
            got.append(tx)
    raise AssertionError(f"no error within {timeout}s")


def test_a_pipeline_joining_a_stream_that_passed_over_its_table_gets_every_row(mariadb_source, source_db,
                                                                                 subscribers, monkeypatch):
    """A stream that passed over the rows of tables nobody read rewinds to its last hand-on when a
    pipeline reading one of them joins there: the rows read ahead and skipped are read again for it."""
    monkeypatch.setattr(shared_binlog, "STUCK_SECONDS", 60.0)  # the pump waits on `first` until `second` joins
    setup_tables(mariadb_source, source_db, "a", "b")
    start = head(mariadb_source)
    first = subscribers(("a",), pipeline="first", max_rows_in_memory=2)
    first.open(start)
    reader = first._shared_reader
    assert reader is not None
    execute(mariadb_source, source_db, *(f"INSERT INTO {t} VALUES ({i}, 'x')" for i in range(1, 31) for t in "ab"))
    end = head(mariadb_source)
    # `first` polls nothing: the pump waits on its full buffer with b's rows read ahead and passed over
    wait_until(lambda: reader.pumped > start and reader.source.passes_over(), timeout=20,
               message="the stream passed over b's rows")
    joined_at = reader.pumped
    time.sleep(0.3)  # the reader reads ahead meanwhile; the pump stays where it is (asserted below)
    assert reader.pumped == joined_at
    second = subscribers(("b",), pipeline="second", max_rows_in_memory=2)
    second.open(joined_at)
    assert second.shared and reader.rewinds == 0
    got = {"a": [], "b": []}  # type: dict[str, list[Transaction]]

    def both() -> bool:
        for name, src in (("a", first), ("b", second)):
            tx = src.poll(0.05)
            if tx is not None:
                got[name].append(tx)
        return all(src.tell() is not None and src.tell() >= end for src in (first, second))  # type: ignore[operator]

    wait_until(both, timeout=30, interval=0, message="both pipelines at the end")
    expected = [r for r in rows(alone(mariadb_source, start, end, ("b",))) if r[0] == "b" and r[3] > joined_at]
    assert rows(got["b"]) == expected and len(expected) >= 10
    assert reader.rewinds == 1
    assert [c[2] for c in rows(got["a"])] == list(range(1, 31))


def test_queued_transactions_come_joined_and_other_tables_queue_nothing(mariadb_source, source_db, subscribers):
    """A pipeline behind the stream takes its queued transactions joined (the same rows in order,
    each end a transaction's end); one whose tables got no rows has nothing queued and takes one mark."""
    setup_tables(mariadb_source, source_db, "a", "b", "c")
    start = head(mariadb_source)
    busy, idle = subscribers(("a",), pipeline="busy"), subscribers(("c",), pipeline="idle")
    busy.open(start)
    idle.open(start)
    execute(mariadb_source, source_db, *(f"INSERT INTO {t} VALUES ({i}, 'x')" for i in range(1, 31) for t in "ab"))
    end = head(mariadb_source)
    reader = busy._shared_reader
    assert reader is not None and idle._sub is not None
    wait_until(lambda: reader.pumped >= end, timeout=20, message="the stream past the inserts")  # nobody polls
    assert idle._sub.queued_rows() == 0 and idle._sub.passed == reader.pumped
    own = alone(mariadb_source, start, end, ("a",))
    got = poll_until(busy, end)
    assert rows(got) == [r for r in rows(own) if r[0] == "a"] and len(rows(got)) == 30
    assert len(got) < len(own)  # joined: fewer polls than transactions
    assert {tx.end for tx in got if tx.changes} <= {tx.end for tx in own} and all(tx.complete for tx in got)
    marks = poll_until(idle, end)
    assert [(tx.changes, tx.end) for tx in marks] == [((), reader.pumped)]
    assert idle.poll(0.05) is None  # handed on once


def test_the_pump_hands_on_ready_transactions_in_one_step_with_the_same_items_as_one_by_one(mariadb_source):
    """Transactions the stream has ready are queued for each pipeline in one step (one `put_all` each),
    and each pipeline takes the same transactions, joins and position marks, in the same order, as
    when they are handed on one at a time: a mark after a pipeline's share comes after that share."""
    from setl.testing.harness import insert

    def tx(n: int, *tables: str) -> Transaction:
        return Transaction(tuple(insert(t, {"id": n}) for t in tables), Position("mysql-bin.000001", 100 * n), True, 10)

    txs = [tx(1, "a"), tx(2, "b"), tx(3, "a", "b"), tx(4, "b"), tx(5, "c"), tx(6, "b"), tx(7, "a", "c"), tx(8, "b")]
    start = Position("mysql-bin.000001", 4)

    def run(bulks: list[list[Transaction]]) -> tuple[dict[str, list[tuple[tuple[Any, ...], Position]]], dict[str, int]]:
        reader = shared_binlog.SharedReader("k", make_source(mariadb_source), start)
        subs = {name: shared_binlog._Subscription(name, start, 1000, keep) for name, keep in (
            ("a", lambda s, t: t == "a"), ("c", lambda s, t: t == "c"), ("all", None), ("none", lambda s, t: False))}
        steps = dict.fromkeys(subs, 0)
        for name, sub in subs.items():
            put_all = sub.put_all

            def counted(items: Any, passed: Any = None, name: str = name, put_all: Any = put_all) -> None:
                steps[name] += 1
                put_all(items, passed)
            sub.put_all = counted  # type: ignore[method-assign]
        for bulk in bulks:
            reader._hand_on(bulk, tuple(subs.values()))
        taken: dict[str, list[tuple[tuple[Any, ...], Position]]] = {}
        for name, sub in subs.items():
            items = taken[name] = []
            while (item := sub.take(0.0)) is not None:
                assert isinstance(item, Transaction)
                items.append((tuple((c.table, c.after["id"]) for c in item.changes), item.end))
        return taken, steps

    bulk, bulk_steps = run([txs])
    single, single_steps = run([[t] for t in txs])
    assert bulk == single
    assert bulk["a"] == [((("a", 1),), txs[0].end), ((("a", 3),), txs[2].end), ((("a", 7),), txs[6].end),
                         ((), txs[7].end)]
    assert bulk["c"] == [((("c", 5),), txs[4].end), ((("c", 7),), txs[6].end), ((), txs[7].end)]
    assert bulk["none"] == [((), txs[7].end)]
    assert [end for _, end in bulk["all"]] == [t.end for t in txs]
    assert bulk_steps == {"a": 1, "c": 1, "all": 1, "none": 0}
    assert single_steps == {"a": 3, "c": 2, "all": 8, "none": 0}


def test_the_pump_passes_over_a_bulk_once_per_pipeline_with_the_same_marks_and_resume_points(mariadb_source):
    """A pipeline passes over the transactions after the last one it cut once per bulk (the last
    whole one's end, then the end of a split transaction's pieces after it), not once per
    transaction: each takes the same items and marks, in the same order, and stands at the same
    position afterwards, as when the same transactions come one at a time, pieces and a pipeline
    resuming inside a split transaction included."""
    import attrs

    from setl.testing.harness import insert

    log = "mysql-bin.000001"

    def tx(n: int, *tables: str) -> Transaction:
        return Transaction(tuple(insert(t, {"id": n}) for t in tables), Position(log, 100 * n + 99), True, 10)

    def pieces(n: int, *parts: tuple[str, ...], last: bool = True) -> list[Transaction]:
        """A transaction at offset 100 * n split into `parts` (tables, one row each): each change at its
        ordinal, each piece ending at its last one's; the last piece whole (unless `last` is False)."""
        out, row = [], 0
        for k, part in enumerate(parts):
            changes = []
            for table in part:
                row += 1
                changes.append(attrs.evolve(insert(table, {"id": 1000 * n + row}), position=Position(log, 100 * n,
                                                                                                   row=row)))
            whole = last and k == len(parts) - 1
            out.append(Transaction(tuple(changes), Position(log, 100 * n + 99) if whole else Position(log, 100 * n,
                                                                                                   row=row),
                                   whole, 10))
        return out

    txs = [tx(1, "a"), *pieces(2, ("a", "b"), ("b",), ("b", "c")), tx(3, "c"), tx(4, "b"), tx(5, "a"),
           *pieces(6, ("b",), ("c",), last=False)]
    start = Position(log, 4)
    keeps = {"a": lambda s, t: t == "a", "b": lambda s, t: t == "b", "c": lambda s, t: t == "c", "all": None,
             "none": lambda s, t: False}

    def run(bulks: list[list[Transaction]]) -> dict[str, tuple[list[tuple[tuple[Any, ...], Position]], Position]]:
        reader = shared_binlog.SharedReader("k", make_source(mariadb_source), start)
        subs = {name: shared_binlog._Subscription(name, start, 1000, keep) for name, keep in keeps.items()}
        subs["a inside"] = shared_binlog._Subscription("a inside", Position(log, 200, row=1), 1000, keeps["a"])
        subs["b inside"] = shared_binlog._Subscription("b inside", Position(log, 200, row=2), 1000, keeps["b"])
        for bulk in bulks:
            reader._hand_on(bulk, tuple(subs.values()))
        taken = {}
        for name, sub in subs.items():
            items = taken[name] = []
            while (item := sub.take(0.0)) is not None:
                assert isinstance(item, Transaction)
                items.append((tuple((c.table, c.after["id"]) for c in item.changes), item.end))
        return {name: (taken[name], sub.after) for name, sub in subs.items()}

    for cut_at in range(1, len(txs)):  # two bulks, split everywhere, against one by one
        assert run([txs[:cut_at], txs[cut_at:]]) == run([[t] for t in txs]), cut_at
    bulk = run([txs])
    assert bulk == run([[t] for t in txs])
    assert bulk["none"] == ([((), Position(log, 599))], Position(log, 600, row=2))
    # c: a split transaction's last piece, a whole one, and a piece of the split transaction at the end
    assert bulk["c"] == ([((("c", 2005),), Position(log, 299)), ((("c", 3),), Position(log, 399)),
                          ((("c", 6002),), Position(log, 600, row=2))], Position(log, 600, row=2))
    # resuming after the first row of the split transaction (its "a" row, handed on before): nothing of
    # it, its next row
    assert bulk["a inside"] == ([((("a", 5),), Position(log, 599))], Position(log, 600, row=2))
    # resuming after its second row: the rest of it, from the piece holding the third row on
    assert bulk["b inside"] == ([((("b", 2003),), Position(log, 200, row=3)),
                                 ((("b", 2004),), Position(log, 299)), ((("b", 4),), Position(log, 499)),
                                 ((("b", 6001),), Position(log, 600, row=1))], Position(log, 600, row=2))


def test_the_pump_wakes_a_pipeline_when_its_empty_queue_gets_rows_not_per_transaction(mariadb_source):
    """A subscription calls its `ready` (its Select's wake) when rows are queued after its last `take`
    found nothing (or before any), on a drop or a failure; not again while what was queued is not
    taken, not while its Select still takes (its last `take` returned something, so it asks again
    before it waits), and never for position marks (the Select polls for those at `NOTIFIED_IDLE`)."""
    from setl.testing.harness import insert

    def tx(n: int, *tables: str) -> Transaction:
        return Transaction(tuple(insert(t, {"id": n}) for t in tables), Position("mysql-bin.000001", 100 * n), True, 10)

    start = Position("mysql-bin.000001", 4)
    reader = shared_binlog.SharedReader("k", make_source(mariadb_source), start)
    woken = {"a": 0, "none": 0}
    subs = {name: shared_binlog._Subscription(name, start, 1000, keep, ready=lambda name=name: woken.__setitem__(
        name, woken[name] + 1)) for name, keep in (("a", lambda s, t: t == "a"), ("none", lambda s, t: False))}
    reader._hand_on([tx(1, "a"), tx(2, "b")], tuple(subs.values()))
    assert woken == {"a": 1, "none": 0}
    reader._hand_on([tx(3, "a")], tuple(subs.values()))  # "a" has not taken yet: woken already
    reader._hand_on([tx(4, "b")], tuple(subs.values()))
    assert woken == {"a": 1, "none": 0}
    while subs["a"].take(0.0) is not None:
        pass
    assert subs["none"].take(0.0) == Transaction((), tx(4).end, True, 0)  # its mark, polled
    reader._hand_on([tx(5, "a", "b")], tuple(subs.values()))
    assert woken == {"a": 2, "none": 0}
    assert subs["a"].take(0.0) is not None  # it took the last one, and has not found the queue empty yet
    reader._hand_on([tx(6, "a")], tuple(subs.values()))
    assert woken == {"a": 2, "none": 0}
    assert [tx.end for tx in iter(lambda: subs["a"].take(0.0), None)] == [tx(6).end]
    reader._hand_on([tx(7, "a")], tuple(subs.values()))
    assert woken == {"a": 3, "none": 0}
    subs["none"].fail(SourceError("gone"))
    subs["a"].drop()
    assert woken == {"a": 4, "none": 1}


def test_a_pipeline_joined_to_the_stream_is_woken_by_its_rows(mariadb_source, source_db, subscribers):
    """`listen`: while joined, the shared stream calls the pipeline's wake when its table's rows are
    queued for it (`notifies` is then true), and not for another table's; reading alone it does not
    notify."""
    setup_tables(mariadb_source, source_db, "a", "b")
    start = head(mariadb_source)
    src = subscribers(("a",))
    woken: list[float] = []
    src.listen(lambda: woken.append(time.monotonic()))
    assert not src.notifies()
    src.open(start)
    assert src.shared and src.notifies()
    reader = src._shared_reader
    assert reader is not None
    execute(mariadb_source, source_db, "INSERT INTO b VALUES (1, 'x')")
    wait_until(lambda: reader.pumped >= head(mariadb_source), timeout=20, message="the stream past b's insert")
    assert woken == []
    execute(mariadb_source, source_db, "INSERT INTO a VALUES (1, 'x')")
    end = head(mariadb_source)
    wait_until(lambda: len(woken) == 1, timeout=20, message="the pipeline woken by a's row")
    got = poll_until(src, end)
    assert [(table, key) for table, _, key, _ in rows(got)] == [("a", 1)] and len(woken) == 1
    src.close()
    assert not src.notifies()


def test_a_failure_right_after_ready_transactions_comes_after_them(mariadb_source):
    """A stream that fails while the pump gathers what is ready (one bulk) first hands on the
    transactions read before the failure, then the failure: nothing read before it is lost."""
    from setl.testing.harness import insert

    start = Position("mysql-bin.000001", 4)
    ready = [Transaction((insert("a", {"id": n}),), Position("mysql-bin.000001", 100 * n), True, 10) for n in (1, 2)]
    script: list[Transaction | SourceError] = [*ready, SourceError("refused: a statement-logged write")]
    source = make_source(mariadb_source)

    def poll(timeout: float) -> Transaction | None:
        if not script:
            time.sleep(min(timeout, 0.01))
            return None
        item = script.pop(0)
        if isinstance(item, SourceError):
            raise item
        return item

    source.open, source.poll, source.close = (lambda at: None), poll, (lambda timeout=5.0: None)  # type: ignore[method-assign]
    reader = shared_binlog.SharedReader("failing", source, start)
    sub = reader.attach("p", start, 1000, None)
    assert sub is not None
    reader.start()
    try:
        taken: list[object] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(isinstance(item, shared_binlog._Failed) for item in taken):
            item = sub.take(0.1)
            if item is not None:
                taken.append(item)
        got = [item for item in taken[:-1] if isinstance(item, Transaction)]
        assert len(got) == len(taken) - 1 and got[-1].end == ready[-1].end  # maybe joined: the same rows, in order
        assert [c.after["id"] for tx in got for c in tx.changes] == [1, 2]
        assert isinstance(taken[-1], shared_binlog._Failed)
        assert "statement-logged" in str(taken[-1].error)
    finally:
        reader.stop()


def test_a_channel_loop_guard_holds_on_the_shared_stream_and_passed_spans_its_echoes(mariadb_source, source_db,
                                                                                     subscribers):
    """A marker-guarded pipeline on the shared stream drops echoes, passed() spans them, a later row still comes."""
    execute(mariadb_source, source_db, "CREATE DATABASE IF NOT EXISTS setl", MARK_DDL,
            "CREATE TABLE IF NOT EXISTS setl.echo_pos (id INT PRIMARY KEY, n INT)",
            "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    src = subscribers(None, pipeline="guarded", ignore_marks=(THEIRS,))
    src.open(start)
    assert src.shared and src.passed() is None
    write_echoes(mariadb_source, source_db)
    echoes_end = head(mariadb_source)

    def polled_past_echoes() -> bool:
        tx = src.poll(0.1)
        assert tx is None or tx.end <= start, tx  # an echo hands on nothing, not even a position
        passed = src.passed()
        return passed is not None and passed[1] >= echoes_end

    wait_until(polled_past_echoes, timeout=10, interval=0, message=lambda: f"passed: {src.passed()}")
    after, through = src.passed()
    assert (after.log, after.offset) <= (start.log, start.offset) and through >= echoes_end
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (7)")
    got = [tx for tx in poll_until(src, head(mariadb_source)) if tx.changes]
    assert [(c.table, c.after) for tx in got for c in tx.changes] == [("t", {"id": 7})]
    assert got[0].end > echoes_end and src.shared


def test_pipelines_of_different_loop_guards_on_one_server_do_not_share_a_stream(mariadb_source, source_db,
                                                                                subscribers):
    """A pipeline whose guard differs from the shared stream's reads alone: each drops exactly its own echoes."""
    execute(mariadb_source, source_db, "CREATE DATABASE IF NOT EXISTS setl", MARK_DDL,
            "CREATE TABLE IF NOT EXISTS setl.echo_pos (id INT PRIMARY KEY, n INT)",
            "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    guarded = subscribers(None, pipeline="guarded", ignore_marks=(THEIRS,))
    plain = subscribers(None, pipeline="plain")
    guarded.open(start)
    plain.open(start)
    assert guarded.shared and not plain.shared and READERS.count() == 1
    write_echoes(mariadb_source, source_db, count=2)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (8)")
    end = head(mariadb_source)
    seen = {name: [(c.table, c.after) for tx in poll_until(src, end) for c in tx.changes]
            for name, src in (("guarded", guarded), ("plain", plain))}
    assert seen["guarded"] == [("t", {"id": 8})]
    assert seen["plain"][-1] == ("t", {"id": 8}) and ("echo_pos", {"id": 1, "n": 1}) in seen["plain"]
    time.sleep(shared_binlog.MERGE_EVERY + 0.2)
    plain.poll(0.1)  # its merge check: still refused while the other guard's stream runs
    assert not plain.shared and READERS.count() == 1


def test_a_pipeline_on_the_shared_stream_is_behind_while_the_stream_reads_a_backlog(mariadb_source, source_db,
                                                                                   subscribers):
    """behind() of a joined pipeline is the shared stream's: True on a backlog, False once it reads at the end."""
    setup_tables(mariadb_source, source_db, "a")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, *(f"INSERT INTO a VALUES ({i}, 'x')" for i in range(1, 31)))
    end = head(mariadb_source)
    time.sleep(LATE_SECONDS + 1.0)
    src = subscribers(("a",), pipeline="late")
    opened = time.time()
    src.open(start)
    assert src.shared and not src.figures.late
    first = src.poll(5.0)
    stream = src._shared_reader
    assert first is not None and first.changes and stream is not None and stream.source.figures.late >= opened
    poll_until(src, end)
    wait_until(lambda: not src.behind(), timeout=LATE_FRESH + 1.0, interval=0.05, message="not behind")
    stream.source.figures.late = time.time()  # the stream reads late again: the pipeline says so, its own reader unused
    assert src.behind() and not src.figures.late


def test_the_reader_thread_hands_on_a_backlog_in_bulks_and_no_thread_polls_the_stream(mariadb_source, source_db,
                                                                                    subscribers, monkeypatch):
    """The shared stream's reader hands each pipeline its share on its own thread, a full bulk at a
    time (`PUMP_BULK`), and its stream's own thread only hands on the rest once the reader waits:
    nobody polls the stream's hand-off. Each pipeline still gets exactly its own reader's rows."""
    setup_tables(mariadb_source, source_db, "a", "b")
    wait_until(lambda: dumps(mariadb_source) == 0, timeout=15, message="no other binlog reader")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, *(f"INSERT INTO {t} VALUES ({i}, 'x')" for i in range(1, 151) for t in "ab"))
    end = head(mariadb_source)
    bulks: list[tuple[str, int]] = []  # (the thread that queued a share, its transactions)
    put_all = shared_binlog._Subscription.put_all

    def recorded(sub: Any, items: Any, passed: Any = None) -> None:
        bulks.append((threading.current_thread().name, len(items)))
        put_all(sub, items, passed)

    monkeypatch.setattr(shared_binlog._Subscription, "put_all", recorded)
    polled: list[float] = []
    monkeypatch.setattr(shared_binlog._SharedStream, "poll", lambda self, timeout: polled.append(timeout))
    subs = {name: subscribers((name,), pipeline=f"p_{name}") for name in "ab"}
    for src in subs.values():
        src.open(start)
    got = {name: poll_until(src, end) for name, src in subs.items()}
    for name, transactions in got.items():
        assert rows(transactions) == [r for r in rows(alone(mariadb_source, start, end, (name,))) if r[0] == name]
    reader = subs["a"]._shared_reader
    assert reader is not None and reader.direct and not polled
    by_reader = [n for thread, n in bulks if thread.endswith("-binlog")]
    assert by_reader and max(n for _, n in bulks) > 1  # a bulk of several transactions queued at once
    assert sum(n for _, n in bulks) == 300 and len(bulks) < 300  # 150 rows a pipeline, fewer steps than rows


def test_a_frame_handed_on_at_once_keeps_order_and_a_failure_comes_after_the_pending_bulk(mariadb_source):
    """`_HandOn.put_all` (a reader handing on a frame) hands on as `put` one by one: the reader's
    bulk waits until it is full or flushed, in binlog order, and a failure read after it reaches the
    pipeline only after that bulk, as its own error; the hand-on then stops its reader."""
    from setl.sources.mysql_binlog.handoff import Failure, Stopped
    from setl.testing.harness import insert

    def tx(n: int) -> Transaction:
        return Transaction((insert("a", {"id": n}),), Position("mysql-bin.000001", 100 * n), True, 10)

    start = Position("mysql-bin.000001", 4)
    cfg = mariadb_source.source_config(next_server_id(), "latest")
    source = shared_binlog._SharedStream(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                                         server_id=cfg.server_id, pipeline="")
    reader = shared_binlog.SharedReader("frame", source, start)
    assert reader.direct and source.owner is reader
    sub = reader.attach("p", start, 1000, None)
    assert sub is not None
    handon = shared_binlog._HandOn(reader, 1000)
    stop = threading.Event()
    marked: list[int] = []
    handon.put_all([tx(1), tx(2), tx(3)], stop, late={1}, mark=lambda: marked.append(len(reader._pending)))
    assert marked == [1] and sub.take(0.0) is None and reader.pumped == start  # pending: not handed on yet
    with pytest.raises(Stopped):
        handon.put_all([tx(4), Failure(SourceError("the server went away"), tx(4).end)], stop)
    got = []
    while True:
        item = sub.take(0.0)
        assert item is not None
        if isinstance(item, shared_binlog._Failed):
            break
        got.append(item)
    assert [c.after["id"] for t in got for c in t.changes] == [1, 2, 3, 4] and got[-1].end == tx(4).end
    assert "went away" in str(item.error) and reader.ended and reader.pumped == tx(4).end


def test_a_pipeline_joining_inside_the_bulk_being_handed_on_leaves_the_others_no_gap(mariadb_source, source_db,
                                                                                      subscribers, monkeypatch):
    """A pipeline joins at a position inside the bulk that the reader's thread is handing on while that
    hand-on waits for room in another pipeline's full buffer: the rewind waits for the hand-on to end,
    so the other pipeline gets every row once, in order, and the joiner every row after its position.
    (A rewind that stopped the reader in the middle of the bulk left the other a gap: the bulk's rows
    before the joiner's position were read again for nobody.)"""
    monkeypatch.setattr(shared_binlog, "HOLD_SECONDS", 60.0)  # the full pipeline is never dropped here
    monkeypatch.setattr(shared_binlog, "STUCK_SECONDS", 60.0)
    setup_tables(mariadb_source, source_db, "a")
    start = head(mariadb_source)
    slow = subscribers(None, pipeline="slow", max_rows_in_memory=80)  # bulks of up to 10 one-row transactions
    slow.open(start)
    ends: list[Position] = []
    conn = mariadb_source.connect(database=source_db)
    try:
        with conn.cursor() as cur:
            for i in range(1, 501):  # more than slow's buffer (4 x 80 rows) holds
                cur.execute("INSERT INTO a VALUES (%s, 'x')", (i,))
                cur.execute("SHOW MASTER STATUS")
                log_name, offset = cur.fetchone()[:2]
                ends.append(Position(log_name, int(offset)))
    finally:
        conn.close()
    reader = slow._shared_reader
    assert reader is not None

    def handing_on_into_a_full_buffer() -> bool:
        before = reader.pumped
        time.sleep(0.3)
        return reader._handing.locked() and reader.pumped == before and bare(before) in ends

    wait_until(handing_on_into_a_full_buffer, timeout=20, interval=0, message="the reader waiting for room")
    k = ends.index(bare(reader.pumped))  # the bulk being handed on ends after row k + 1
    assert 1 <= k < len(ends) - 1
    joiner = subscribers(None, pipeline="joiner", max_rows_in_memory=80)
    joiner.open(ends[k - 1])  # after row k: inside that bulk
    assert joiner.shared
    time.sleep(0.5)  # the rewind is asked now, while the hand-on still waits
    assert [c[2] for c in rows(poll_until(slow, ends[-1]))] == list(range(1, 501))
    assert [c[2] for c in rows(poll_until(joiner, ends[-1]))] == list(range(k + 1, 501))
    assert reader.rewinds == 1 and slow.drops == 0
