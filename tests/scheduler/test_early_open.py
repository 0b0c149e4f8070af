"""A scheduler started on a source opened early at the ack (`setl.scheduler.opening.EarlyOpen`, what a
new HA leader does while it fences the target): it reads from where the target really is, loads
nothing twice and skips nothing, and a failed or abandoned early open leaves nothing behind."""

from __future__ import annotations

import pytest

from setl.config import BatchSettings, PipelineSettings, RetrySettings
from setl.errors import SourceError
from setl.meta import SqliteMetaStore
from setl.model import Position
from setl.scheduler import Outcome, Scheduler
from setl.scheduler.opening import EarlyOpen
from setl.stages import Extract, Transform
from setl.testing.harness import MemorySink, ScriptedSource, insert, reference_state


def settings() -> PipelineSettings:
    return PipelineSettings(parallelism=1, batch=BatchSettings(max_rows=3, max_wait_ms=2),
                            retry=RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=2),
                            drain_timeout_ms=5000)


def stream(n: int) -> list[list]:
    return [[insert("t", {"id": i, "v": i})] for i in range(1, n + 1)]


class Recording(ScriptedSource):
    """Records where it was opened and how often closed; `fail_at` makes an open there fail."""

    def __init__(self, txs: list, fail_at: Position | None = None) -> None:
        super().__init__(txs)
        self.opened_at: list[Position | None] = []
        self.closes = 0
        self.fail_at = fail_at

    def open(self, start: Position | None) -> None:
        self.opened_at.append(start)
        if start is not None and start == self.fail_at:
            raise SourceError(f"cannot read the binlog at {start}", pipeline="test", stage="select")
        super().open(start)

    def close(self) -> None:
        self.closes += 1
        super().close()


def scheduler(source: ScriptedSource, sink: MemorySink, meta: SqliteMetaStore, guess: Position) -> Scheduler:
    return Scheduler("test", settings(), source, Extract(), Transform(), sink, meta,
                     opening=EarlyOpen("test", source, guess))


def test_a_target_ahead_of_the_ack_moves_the_early_opened_source_to_the_target_s_position():
    """Opened early at the ack while the target holds more (its batch's ack lost): the source is
    moved to the target's position, so nothing is loaded twice or skipped and the target equals
    the source."""
    txs = stream(9)
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    Scheduler("test", settings(), ScriptedSource(txs[:6]), Extract(), Transform(), sink, meta).run(until_caught_up=True)
    held = sink.committed()
    assert held == Position("scripted", 6)
    meta.reset_position("test", None)  # as if the last acks were lost
    meta.ack("test", 1, 1, Position("scripted", 3))
    loads_before = len(sink.loads)
    source = Recording(txs)
    assert scheduler(source, sink, meta, Position("scripted", 3)).run(until_caught_up=True) is Outcome.CAUGHT_UP
    assert source.opened_at == [Position("scripted", 3), held]
    assert [r.start for r in sink.loads[loads_before:]][0] == held
    assert sink.tables == reference_state(txs)
    meta.close()


def test_an_early_open_at_the_real_start_is_the_only_open():
    """The ack is where the target is: the early open is kept, the source is opened once."""
    txs = stream(7)
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    Scheduler("test", settings(), ScriptedSource(txs[:4]), Extract(), Transform(), sink, meta).run(until_caught_up=True)
    ack = meta.position("test")
    assert ack is not None and ack.position == Position("scripted", 4)
    source = Recording(txs)
    assert scheduler(source, sink, meta, ack.position).run(until_caught_up=True) is Outcome.CAUGHT_UP
    assert source.opened_at == [ack.position]
    assert sink.tables == reference_state(txs)
    meta.close()


def test_a_failed_early_open_fails_the_start_with_its_error_and_opens_nothing_again():
    """The early open at the start fails: the start raises that error (as a plain open would) and
    does not open the source a second time."""
    txs = stream(4)
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    Scheduler("test", settings(), ScriptedSource(txs[:2]), Extract(), Transform(), sink, meta).run(until_caught_up=True)
    ack = meta.position("test")
    assert ack is not None
    source = Recording(txs, fail_at=ack.position)
    with pytest.raises(SourceError, match="cannot read the binlog at"):
        scheduler(source, sink, meta, ack.position).run(until_caught_up=True)
    assert source.opened_at == [ack.position]
    meta.close()


def test_an_abandoned_early_open_closes_the_source_it_opened():
    """A start given up before the scheduler runs (a pause, a refused target) closes the early-opened source."""
    source = Recording(stream(2))
    early = EarlyOpen("test", source, Position("scripted", 1))
    early.abandon()
    assert (source.opened_at, source.closes) == ([Position("scripted", 1)], 1)
    failing = Recording(stream(2), fail_at=Position("scripted", 1))
    EarlyOpen("test", failing, Position("scripted", 1)).abandon()
    assert failing.closes == 0  # it never opened: nothing to close
