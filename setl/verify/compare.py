"""The comparison loop of `setl verify` (`Verifier`): each chunk at a consistent point, the chunks that
differ drilled down to rows, and the rows re-checked at later positions before anything is reported.

The consistent point (docs/verify.md): the source chunk is read in a consistent snapshot whose
binlog position Pc the server tells; the target chunk is read once the pipeline's acked position has
reached Pc (on a thread of its own, while the source hashes the next chunks), so the target holds at
least everything up to Pc (it may hold more). Equal aggregates end the chunk. Otherwise it is cut in
16 parts (each part's aggregate compared the same way, in one pass per end) down to ranges of
`leaf_rows` rows, and the rows' hashes of each differing one are read in a sandwich: source at Pc1,
the target once acked past Pc1, the source again at Pc2. A key whose source row is the same at Pc1
and Pc2 did not change in between, so the target (somewhere in [Pc1, Pc2] for it) must hold that
row: a different target row is a difference; a key whose source row changed in between is unsettled
and looked at again. Every candidate is re-checked the same way `attempts - 1` more times; it is
reported only if it was found different in at least two checks (one when `attempts` is 1) and never
equal.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from setl import failpoints
from setl.model import Position
from setl.verify.ends import End, KeyText, Texts
from setl.verify.pace import Pace
from setl.verify.plan import TableCheck
from setl.verify.report import TableReport

#: keyless rows reported with their column texts (the others by their row hash)
SAMPLES = 100


class ChunkHashes(Protocol):
    """Hashes a window of a table's chunks somewhere else, as `End.summary` does (`Verifier.chunks`)."""

    def source_summaries(self, check: TableCheck, ranges: Sequence[tuple[Any, Any]]
                         ) -> list[tuple[tuple[int, int], Position | None]]:
        """Each range's (rows, hash sum) on the source, in a consistent snapshot, with its binlog position."""
        ...

    def target_summaries(self, check: TableCheck, ranges: Sequence[tuple[Any, Any]]) -> list[tuple[int, int]]:
        """Each range's (rows, hash sum) on the target."""
        ...


@attrs.define
class Verifier:
    """Compares tables of `pipeline`; `acked()` reads the pipeline's acked position (meta store).

    `sleep` and `clock` are injectable for tests; `max_rows_per_second` (0: unbounded) throttles
    every source read of a table (its chunks' hashes, and the drill-down, re-check and
    classification reads of those that differ: under heavy writes most of the source's work);
    `wait_timeout` bounds each wait for the acked position. `lag()` reads the pipeline's lag in
    seconds (None: not known, the pipeline not running): before each chunk the check waits while
    it is above `max_lag` (0: never), at most `lag_timeout` seconds in all."""

    pipeline: str
    acked: Callable[[], Position | None]
    attempts: int = 3
    max_rows_per_second: float = 0.0
    wait_timeout: float = 60.0
    #: seconds between re-checks; each re-check takes a new snapshot and waits for the acked position
    #: to reach it, so under traffic it is at a later position anyway
    recheck_delay: float = 0.0
    #: a differing range is cut in `parts` until it holds at most `leaf_rows` rows, then compared row by row
    leaf_rows: int = 1000
    parts: int = 16
    #: how many chunks the source hashes ahead of the target (which waits for the acked position)
    window: int = 8
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    #: called with (table, rows compared, estimated rows, done) after each window of chunks, e.g.
    #: a progress line on a terminal
    progress: Callable[[str, int, int, bool], None] | None = None
    lag: Callable[[], float | None] | None = None
    max_lag: float = 0.0
    lag_timeout: float = 600.0
    #: called with (table, lag) while the check pauses for the lag, and with (table, None) when it resumes
    paused: Callable[[str, float | None], None] | None = None
    #: hashes windows of chunks elsewhere (`setl.verify.spark_engine`, ``--engine spark``); None: here.
    #: Used for keyed tables hashed server-side in key ranges; the others, and every drill-down, are local
    chunks: ChunkHashes | None = None
    #: chunks per remote job and end
    remote_window: int = 64
    #: waits for the acked position and the lag, and throttles the source reads (made from the fields above)
    pace: Pace = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.pace = Pace(self.pipeline, self.acked, max_rows_per_second=self.max_rows_per_second,
                         wait_timeout=self.wait_timeout, sleep=self.sleep, clock=self.clock, lag=self.lag,
                         max_lag=self.max_lag, lag_timeout=self.lag_timeout, paused=self.paused)


    def table(self, check: TableCheck, source: End, target: End,
              boundary: Callable[[tuple[Any, ...] | None], tuple[Any, ...] | None]) -> TableReport:
        """Compare one table; `boundary(after)` gives the key that ends the chunk after `after`
        (None: the rest of the table is the last chunk)."""
        report = TableReport(str(check.source.name), str(check.target), check.mode, check.why,
                             unchecked=dict(check.unchecked))
        started = self.pace.begin()
        if check.keyless:
            self._keyless(check, source, target, report)
        else:
            self._keyed(check, source, target, boundary, report)
        report.seconds = self.clock() - started
        if self.progress is not None:
            self.progress(str(check.source.name), report.rows, check.source.estimate, True)
        return report

    # --- keyed tables ---------------------------------------------------------------------

    def _keyed(self, check: TableCheck, source: End, target: End,
               boundary: Callable[[tuple[Any, ...] | None], tuple[Any, ...] | None], report: TableReport) -> None:
        state: dict[KeyText, str] = {}
        raws: dict[KeyText, tuple[Any, ...]] = {}
        if self.chunks is not None and check.mode == "sql" and check.ranged:
            self._chunks_remote(check, source, target, boundary, report, state, raws)
        else:
            self._chunks_local(check, source, target, boundary, report, state, raws)
        self._settle(check, source, target, report, state, raws)

    def _chunks_local(self, check: TableCheck, source: End, target: End,
                      boundary: Callable[[tuple[Any, ...] | None], tuple[Any, ...] | None], report: TableReport,
                      state: dict[KeyText, str], raws: dict[KeyText, tuple[Any, ...]]) -> None:
        """Hash the table's chunks here; differing ones into `state`.

        The source hashes chunk after chunk, each in its own snapshot. The target hashes them in
        the same order on a thread of its own, each once the pipeline's ack has reached the
        chunk's position, so the two servers work at the same time; the source runs at most
        `window` chunks ahead. The differing chunks are drilled down (`_bisect`) once every chunk
        is hashed on both ends: each end's connection is used by one thread at a time."""
        name = str(check.source.name)
        lower: tuple[Any, ...] | None = None
        done = False
        hashed = 0  # chunks hashed on the source
        Summary = tuple[int, int]
        ahead: collections.deque[tuple[Any, Any, Summary, concurrent.futures.Future[Summary]]] = collections.deque()
        differing: list[tuple[Any, Any, int]] = []
        stop = threading.Event()  # the source side failed: the target side gives up its wait

        def target_hash(low: Any, high: Any, position: Position | None) -> Summary:
            self.pace.wait_acked(position, name, stop)
            with target.snapshot():
                return target.summary(low, high)

        def compared() -> None:  # the oldest chunk's target hash is in
            low, high, ours, theirs = ahead.popleft()
            their = theirs.result()
            report.rows += ours[0]
            report.chunks += 1
            if ours != their:
                differing.append((low, high, max(ours[0], their[0])))
            if self.progress is not None and report.chunks % self.window == 0:
                self.progress(name, report.rows, check.source.estimate, False)

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"verify-{name}"[:40]) as pool:
            try:
                while not done:
                    self.pace.wait_lag(name)
                    upper = boundary(lower) if check.ranged else None
                    with source.snapshot() as position:
                        failpoints.hit("verify_chunk", hashed, task=name)
                        ours = source.summary(lower, upper)
                    hashed += 1
                    ahead.append((lower, upper, ours, pool.submit(target_hash, lower, upper, position)))
                    done, lower = upper is None, upper
                    self.pace.charge(ours[0])
                    while len(ahead) > self.window:
                        compared()
                while ahead:
                    compared()
            except BaseException:
                stop.set()
                for *_, pending in ahead:
                    pending.cancel()
                raise
        for low, high, rows in differing:
            self._bisect(check, source, target, low, high, rows, state, raws)
        if self.progress is not None:
            self.progress(name, report.rows, check.source.estimate, False)

    def _chunks_remote(self, check: TableCheck, source: End, target: End,
                       boundary: Callable[[tuple[Any, ...] | None], tuple[Any, ...] | None], report: TableReport,
                       state: dict[KeyText, str], raws: dict[KeyText, tuple[Any, ...]]) -> None:
        """Hash the table's chunks with `chunks` (Spark tasks), `remote_window` of them per job and end:
        the boundaries found here, the source's aggregates (each chunk in its own snapshot), one wait
        for the ack past the last of their positions, the target's; differing chunks drilled down
        here as with the local engine."""
        assert self.chunks is not None
        name = str(check.source.name)
        lower: tuple[Any, ...] | None = None
        done = False
        while not done:
            self.pace.wait_lag(name)
            ranges: list[tuple[Any, Any]] = []
            while len(ranges) < self.remote_window and not done:
                upper = boundary(lower)
                ranges.append((lower, upper))
                done, lower = upper is None, upper
            ours = self.chunks.source_summaries(check, ranges)
            self.pace.wait_acked(max((p for _, p in ours if p is not None), default=None), name)
            theirs = self.chunks.target_summaries(check, ranges)
            for (low, high), (mine, _), their in zip(ranges, ours, theirs):
                report.rows += mine[0]
                report.chunks += 1
                self.pace.charge(mine[0])
                if mine != their:
                    self._bisect(check, source, target, low, high, max(mine[0], their[0]), state, raws)
            if self.progress is not None:
                self.progress(name, report.rows, check.source.estimate, False)

    def _settle(self, check: TableCheck, source: End, target: End, report: TableReport,
                state: dict[KeyText, str], raws: dict[KeyText, tuple[Any, ...]]) -> None:
        """Re-check the candidate keys in `state` and report those that stay different."""
        name = str(check.source.name)
        seen = collections.Counter(k for k, v in state.items() if v == "different")
        for _ in range(1, self.attempts):
            if not state:
                break
            if self.recheck_delay:
                self.sleep(self.recheck_delay)
            keys = list(state)
            different, unsettled, equal = self._sandwich(source, target, None, None, [raws[k] for k in keys], raws,
                                                         name, asked=keys)
            for key in keys:
                if key in equal:
                    del state[key]
                elif key in different:
                    state[key] = "different"
                    seen[key] += 1
                else:
                    state[key] = "unsettled"
        needed = min(2, self.attempts)
        confirmed = [k for k in state if seen[k] >= needed]
        unsure = [k for k in state if seen[k] < needed]
        self._classify(check, source, target, confirmed, raws, report)
        report.unsettled = [{"key": self._key(check, k)} for k in unsure]

    def _bisect(self, check: TableCheck, source: End, target: End, lower: tuple[Any, ...] | None,
                upper: tuple[Any, ...] | None, rows: int, state: dict[KeyText, str],
                raws: dict[KeyText, tuple[Any, ...]]) -> None:
        """A range whose aggregates differ: cut into `parts` parts (keys of every n-th source row),
        each part's aggregate compared at one consistent point in one pass per end, and the
        differing parts cut again while they hold more than `leaf_rows` rows; then the rows of
        each differing part (`_sandwich`) into `state`."""
        name = str(check.source.name)
        splits = source.splits(lower, upper, max(1, -(-rows // self.parts))) \
            if check.mode == "sql" and check.ranged and rows > self.leaf_rows else []
        if not splits:
            different, unsettled, _ = self._sandwich(source, target, lower, upper, None, raws, name)
            state.update({k: "different" for k in different})
            state.update({k: "unsettled" for k in unsettled})
            return
        with source.snapshot() as position:
            ours = source.summaries(lower, upper, splits)
        self.pace.charge(rows)
        self.pace.wait_acked(position, name)
        with target.snapshot():
            theirs = target.summaries(lower, upper, splits)
        bounds = [lower, *splits, upper]
        for i in sorted(set(ours) | set(theirs)):
            mine, their = ours.get(i, (0, 0)), theirs.get(i, (0, 0))
            if mine != their:
                self._bisect(check, source, target, bounds[i], bounds[i + 1], max(mine[0], their[0]), state, raws)

    def _sandwich(self, source: End, target: End, lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None,
                  keys: Sequence[tuple[Any, ...]] | None, raws: dict[KeyText, tuple[Any, ...]], name: str,
                  asked: Sequence[KeyText] = ()) -> tuple[set[KeyText], set[KeyText], set[KeyText]]:
        """(different, unsettled, equal) keys of a range or of `keys`: source, target, source again."""
        with source.snapshot() as position:
            first = source.rows(lower, upper, keys)
        self.pace.wait_acked(position, name)
        with target.snapshot():
            theirs = target.rows(lower, upper, keys)
        with source.snapshot():
            second = source.rows(lower, upper, keys)
        self.pace.charge(len(first) + len(second))
        for found in (theirs, second, first):
            raws.update({k: raw for k, (_, raw) in found.items()})
        different, unsettled, equal = set(), set(), set()
        for key in set(first) | set(theirs) | set(second) | set(asked):
            before, after, there = (first.get(key, ("",))[0], second.get(key, ("",))[0], theirs.get(key, ("",))[0])
            if before != after:
                unsettled.add(key)
            elif before != there:
                different.add(key)
            else:
                equal.add(key)
        return different, unsettled, equal

    @staticmethod
    def _key(check: TableCheck, key: KeyText) -> dict[str, str | None]:
        return {c.source: text for c, text in zip(check.key, key)}

    def _classify(self, check: TableCheck, source: End, target: End, keys: list[KeyText],
                  raws: dict[KeyText, tuple[Any, ...]], report: TableReport) -> None:
        if not keys:
            return
        wanted = [raws[k] for k in keys]
        with source.snapshot():
            ours = source.texts(wanted)
        self.pace.charge(len(wanted))
        with target.snapshot():
            theirs = target.texts(wanted)
        for key in sorted(keys, key=lambda k: tuple("" if t is None else t for t in k)):
            item: dict[str, Any] = {"key": self._key(check, key)}
            if key in ours and key not in theirs:
                report.missing.append(item)
            elif key in theirs and key not in ours:
                report.extra.append(item)
            else:
                item["columns"] = _columns(check, ours.get(key), theirs.get(key))
                report.different.append(item)

    # --- keyless tables -------------------------------------------------------------------

    def _keyless(self, check: TableCheck, source: End, target: End, report: TableReport) -> None:
        name = str(check.source.name)
        self.pace.wait_lag(name)
        with source.snapshot() as position:
            ours = source.summary(None, None)
        self.pace.charge(ours[0])
        self.pace.wait_acked(position, name)
        with target.snapshot():
            theirs = target.summary(None, None)
        report.rows, report.chunks = ours[0], 1
        if ours == theirs:
            return
        state: dict[str, str] = {}
        counts: dict[str, int] = {}  # row hash -> source copies minus target copies, when last found different
        seen: collections.Counter[str] = collections.Counter()
        for attempt in range(self.attempts):
            if attempt:
                if not state:
                    break
                if self.recheck_delay:
                    self.sleep(self.recheck_delay)
            with source.snapshot() as position:
                first = source.multiset()
            self.pace.wait_acked(position, name)
            with target.snapshot():
                there = target.multiset()
            with source.snapshot():
                second = source.multiset()
            self.pace.charge(sum(first.values()) + sum(second.values()))
            # a row whose copies changed on the source meanwhile says nothing this time
            hashes = set(first) | set(there) | set(second) if not attempt else set(state)
            for row_hash in hashes:
                if first[row_hash] != second[row_hash]:
                    state[row_hash] = "unsettled"
                elif first[row_hash] != there[row_hash]:
                    state[row_hash] = "different"
                    counts[row_hash] = first[row_hash] - there[row_hash]
                    seen[row_hash] += 1
                else:
                    state.pop(row_hash, None)
        needed = min(2, self.attempts)
        for shown, row_hash in enumerate(sorted(state)):
            if seen[row_hash] < needed:
                report.unsettled.append({"row": _sample(check, source, row_hash, shown)})
                continue
            count = counts[row_hash]
            item = {"row": _sample(check, source if count > 0 else target, row_hash, shown), "count": abs(count)}
            (report.missing if count > 0 else report.extra).append(item)


def _sample(check: TableCheck, end: End, row_hash: str, shown: int) -> dict[str, Any]:
    """A keyless row's column texts; past the first `SAMPLES` rows (each sample scans the table),
    its row hash."""
    texts = end.sample(row_hash) if shown < SAMPLES else None
    if texts is None:
        return {"row_hash": row_hash}
    return {c.source: t for c, t in zip(check.columns, texts)}


def _columns(check: TableCheck, ours: Texts | None, theirs: Texts | None) -> list[str]:
    """The (source) names of the columns whose texts differ."""
    if ours is None or theirs is None:
        return []
    return [c.source for c, a, b in zip(check.columns, ours, theirs) if a != b]
