"""The in-flight ledger: the state Select, Load and Termin share, and its transitions.

`Ledger` owns one pipeline's epoch, its batches in flight (one `Slot` each), the ids to load
and to ack next, the acked position, and the rollback and rewind that a failure starts; each
change of that state is one method with its contract in the docstring, so a unit test can
drive the Termin state machine without threads (the scheduler's tasks only call it).
`Permits` are what the batches in flight hold (invariant 4).
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Iterator

import attrs

from setl.model import Batch, Position
from setl.retry import Backoff
from setl.runtime import BatchCap


class SlotState(enum.Enum):
    """Where a batch in flight is."""

    WORKING = "working"  # in Extract/Transform
    READY = "ready"  # transformed, waiting for its turn to load
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@attrs.define(eq=False)
class Slot:
    """A batch in flight: it holds a permit until it is retired (acked, or discarded and its worker done)."""

    batch: Batch
    state: SlotState = SlotState.WORKING
    error: BaseException | None = None
    discarded: bool = False
    worker_done: bool = False
    retired: bool = False
    loading_since: float = 0.0  # per_table: when its parts were handed to the load slots (perf_counter)
    parts: bool = False  # loaded as parts on the load slots: Termin records its position (`mark_loaded`)


class Permits:
    """The permits of one pipeline's batches in flight (invariant 4), and its share of the node's cap.

    A batch takes one of the pipeline's `parallelism` permits when Select starts cutting it
    (`take`), and, with a node `cap` (`BatchCap`), one node permit with its first transaction
    (`node_permit`, so an idle pipeline's empty cut holds none). Both are the batch's from
    `admit` until `retire` (acked, or discarded and its worker done), exactly once. `close`
    gives back everything the ended pipeline still holds and leaves the cap's queue.

    Shares the scheduler's `lock`: `admit`, `retire` and `release_node` are called with it held.
    `wake_select` is how the cap wakes Select when it hands it a permit; `on_retire` is called
    (lock held) with the retired batch and the number still in flight.
    """

    def __init__(self, parallelism: int, cap: BatchCap | None, lock: threading.Condition,
                 wake_select: Callable[[], None], on_retire: Callable[[Batch, int], None]) -> None:
        self._own = threading.Semaphore(parallelism)
        self.cap = cap
        self._lock = lock
        self._wake_select = wake_select
        self._on_retire = on_retire
        self._holding: set[Slot] = set()  # batches not retired yet: each holds a permit (and a node permit)
        self.live = 0
        self._cut_own = False  # Select's cut holds one of the pipeline's permits
        self._cut_node = False  # Select's cut holds a node permit
        self._closed = False  # the pipeline ended and gave its node permits back

    def take(self) -> bool:
        """Take a pipeline permit for Select's next cut; False when none is free (a retire wakes Select)."""
        if self._cut_own:
            return True
        if not self._own.acquire(blocking=False):
            return False
        self._cut_own = True
        return True

    def node_permit(self) -> bool:
        """Whether Select's cut holds a node permit, or now took one (always, without a cap).

        Without one, Select is queued on the cap, which wakes it when it hands it one.
        """
        if self.cap is None:
            return True
        with self._lock:
            if self._cut_node:
                return True
            if self._closed or not self.cap.try_acquire(self, self._wake_select):
                return False
            self._cut_node = True
            return True

    def admit(self, slot: Slot) -> int:
        """Lock held: the cut became `slot`'s batch, in flight with the cut's permits; how many are in flight."""
        self._cut_own = self._cut_node = False
        self._holding.add(slot)
        self.live += 1
        return self.live

    def discard_cut(self) -> None:
        """Lock held: the cut was read but is not handed on (a rewind or stop came): give its permits back."""
        if self._cut_own:
            self._cut_own = False
            self._own.release()
        if self._cut_node:
            self._cut_node = False
            self.release_node()

    def abandon_cut(self) -> None:
        """Select dropped its cut (a stop or a rewind): give its permits back, or stop waiting for a node permit."""
        with self._lock:
            waiting = self.cap is not None and not self._cut_node
            self.discard_cut()
            if waiting:
                assert self.cap is not None
                self.cap.cancel(self)

    def retire(self, slot: Slot) -> None:
        """Lock held: give a batch's permits back, exactly once."""
        if slot.retired:
            return
        slot.retired = True
        self._holding.discard(slot)
        self.live -= 1
        self._own.release()
        self._on_retire(slot.batch, self.live)
        # After the listener: a listener counting batches across pipelines never sees the cap exceeded.
        self.release_node()
        self._wake_select()

    def release_node(self) -> None:
        """Lock held: give one node permit back, unless the ended pipeline already gave them all back."""
        if self.cap is not None and not self._closed:
            self.cap.release()

    def close(self) -> None:
        """The pipeline is over: retire the batches it abandoned, and give back Select's node permit."""
        with self._lock:
            for slot in list(self._holding):
                self.retire(slot)
            if self.cap is not None:
                if self._cut_node:
                    self._cut_node = False
                    self.cap.release()
                self.cap.cancel(self)
                self._closed = True


@attrs.frozen
class Rewind:
    """Where Select starts again after a rollback: at `position` (None: the configured start)
    with batch id `next_id`, not before `resume_at` (on the scheduler's clock)."""

    position: Position | None
    next_id: int
    resume_at: float


@attrs.frozen
class Rollback:
    """A rollback under way: batch `failed_id` failed with `error`; the replay runs in `epoch`."""

    failed_id: int
    error: BaseException
    epoch: int


class Ledger:
    """The batches in flight of one pipeline, and the epoch, ids and position that order them.

    It is the state machine at the heart of otter's SETL: Select admits batches (`admit`),
    Extract/Transform report on them (`worked`), Load takes them in id order (`loadable`,
    `begin_load`, `loaded`; per_table: `parts_settled`), and Termin acks them in id order
    (`result`, `ack`) or rolls back (`begin_rollback`, `rollback_ready`, `complete_rollback`),
    which discards the failed batch and every later one, bumps the epoch and asks Select to
    rewind (`take_rewind`) to the acked position.

    Invariants the transitions keep: `next_ack <= next_load`; ids are acked strictly in
    ascending order; a batch of an old epoch is never admitted, loaded or acked (a late
    result of one only gives its permits back); each batch's permits are given back exactly
    once (`Permits.retire`), when it is acked, or when it is discarded and its worker is done.

    Every method takes `lock` (the scheduler's condition, re-entrant), so callers may hold it
    already; none blocks, and none does I/O: the meta store, the source and the target are
    the callers' business, outside the lock. Attributes are read-only outside this class.
    """

    def __init__(self, permits: Permits, lock: threading.Condition, backoff: Backoff,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.permits = permits
        self._lock = lock
        self._backoff = backoff
        self._clock = clock
        self._slots: dict[int, Slot] = {}
        self._epoch = 0
        self._next_load = 1
        self._next_ack = 1
        self._acked: Position | None = None
        self._halted = False
        self._load_blocked = False  # a failed batch stops loading until the rollback completes
        self._load_barrier: int | None = None  # per_table: parts of this batch id and later must not run
        self._load_tasks = 0  # per_table: part and EOF tasks submitted and not finished
        self._attempt = 0
        # Where the last rollback rewound to: attempts start again only once an ack passes it
        # (pieces of a split transaction acked before its failing piece do not move the ack).
        self._retry_from: Position | None = None
        self._rolling: Rollback | None = None
        self._rewind: Rewind | None = None
        self._select_error: BaseException | None = None

    # --- reading -----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch: batches of any other are stale."""
        return self._epoch

    @property
    def acked(self) -> Position | None:
        """The last acked position (where a rollback rewinds to)."""
        return self._acked

    @property
    def next_load(self) -> int:
        """The batch id Load takes next."""
        return self._next_load

    @property
    def next_ack(self) -> int:
        """The batch id Termin acks next."""
        return self._next_ack

    @property
    def attempt(self) -> int:
        """Failed attempts since the ack last moved past the point the last rollback rewound to."""
        return self._attempt

    @property
    def halted(self) -> bool:
        """The pipeline is tearing down: nothing more is extracted, loaded or acked."""
        return self._halted

    @property
    def rolling(self) -> Rollback | None:
        """The rollback waiting for running loads, if any."""
        return self._rolling

    @property
    def load_tasks(self) -> int:
        """per_table: part and EOF tasks submitted and not finished."""
        return self._load_tasks

    @property
    def select_failed(self) -> bool:
        """The source failed and the rollback it asks for has not rewound Select yet."""
        return self._select_error is not None

    @property
    def rolling_back(self) -> bool:
        """A rollback is under way, or its rewind is not taken yet: nothing after the ack survives."""
        with self._lock:
            return self._rolling is not None or self._rewind is not None

    def slot(self, batch_id: int) -> Slot | None:
        """The slot of batch `batch_id`, if it is in flight."""
        return self._slots.get(batch_id)

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[Slot]:
        return iter(list(self._slots.values()))

    # --- start and stop ----------------------------------------------------------------------

    def begin(self, epoch: int, acked: Position | None, next_id: int) -> None:
        """Before any task runs: start in `epoch` from the ack `acked`, with batch id `next_id`
        (may be called again, before the tasks start, once the source tells where it opened)."""
        with self._lock:
            self._epoch = epoch
            self._acked = acked
            self._next_load = self._next_ack = next_id

    def halt(self) -> None:
        """Teardown: from now on nothing is extracted, loaded or acked (`halted`)."""
        with self._lock:
            self._halted = True
            self._lock.notify_all()

    # --- select ------------------------------------------------------------------------------

    def admit(self, batch: Batch, *, closing: bool = False) -> tuple[Slot, int] | None:
        """Select hands `batch` on with its cut's permits: its slot (WORKING) and how many batches
        are in flight. None (the cut's permits given back) when `batch` is of an old epoch, a
        rewind is pending, or the pipeline is `closing`."""
        with self._lock:
            if closing or batch.epoch != self._epoch or self._rewind is not None:
                self.permits.discard_cut()
                return None
            assert batch.id not in self._slots, f"batch {batch.id} is already in flight"
            slot = Slot(batch)
            self._slots[batch.id] = slot
            return slot, self.permits.admit(slot)

    def source_failed(self, error: BaseException) -> None:
        """The source failed: Termin rolls back once every batch handed on before it is acked."""
        with self._lock:
            self._select_error = error
            self._lock.notify_all()

    def take_rewind(self) -> Rewind | None:
        """Select: the rewind a completed rollback asks for, once (it also clears the source
        failure, which that rollback dealt with); None when there is none."""
        with self._lock:
            rewind, self._rewind = self._rewind, None
            if rewind is not None:
                self._select_error = None
            return rewind

    # --- extract and transform ---------------------------------------------------------------

    def worked(self, slot: Slot, batch: Batch | None = None, error: BaseException | None = None) -> bool:
        """Extract/Transform of `slot` ended: READY with the transformed `batch`, or FAILED with
        `error`. False if the slot was discarded meanwhile (a late result of an old epoch): it is
        ignored, and the slot's permits are given back now."""
        with self._lock:
            slot.worker_done = True
            if slot.discarded:
                self.permits.retire(slot)
                return False
            if error is not None:
                slot.state, slot.error = SlotState.FAILED, error
            else:
                assert batch is not None
                slot.state, slot.batch = SlotState.READY, batch
            self._lock.notify_all()
            return True

    # --- load --------------------------------------------------------------------------------

    def loadable(self) -> Slot | None:
        """The batch whose turn it is to load, once Extract/Transform are done with it (READY or
        FAILED); None while they are not, or while a failure blocks loading."""
        with self._lock:
            slot = self._slots.get(self._next_load)
            if slot is None or self._load_blocked or slot.state not in (SlotState.READY, SlotState.FAILED):
                return None
            return slot

    def block_load(self) -> None:
        """A batch failed before its load: no load starts until the rollback completes."""
        with self._lock:
            self._load_blocked = True
            self._lock.notify_all()

    def begin_load(self, slot: Slot, *, parts: bool = False) -> None:
        """`slot` (the `loadable` one) starts loading. With `parts` (per_table) its parts go to the
        load slots and the next batch's turn comes at once; otherwise it comes with `loaded`."""
        with self._lock:
            assert slot.batch.id == self._next_load
            slot.state = SlotState.LOADING
            if parts:
                slot.parts = True
                slot.loading_since = time.perf_counter()
                self._next_load += 1

    def loaded(self, slot: Slot, error: BaseException | None = None) -> None:
        """The whole load of `slot` ended: LOADED, and the next batch's turn; or FAILED, and
        loading blocked until the rollback. A slot discarded meanwhile gives its permits back."""
        with self._lock:
            if error is not None:
                slot.state, slot.error = SlotState.FAILED, error
                self._load_blocked = True
            else:
                slot.state = SlotState.LOADED
                self._next_load += 1
            if slot.discarded:
                self.permits.retire(slot)
            self._lock.notify_all()

    def parts_unacked(self, before: int) -> bool:
        """Whether a batch before id `before` went by parts and is not acked yet: its position is
        recorded only at its ack (`mark_loaded`), which must not overwrite a later batch's."""
        with self._lock:
            return any(slot.parts for batch_id, slot in self._slots.items() if batch_id < before)

    def parts_submitted(self, tasks: int) -> None:
        """per_table: `tasks` part or EOF tasks were submitted to the load slots."""
        with self._lock:
            self._load_tasks += tasks

    def part_finished(self) -> None:
        """per_table: a part or EOF task ran, failed or was skipped."""
        with self._lock:
            self._load_tasks -= 1

    def runnable(self, slot: Slot, part: Batch) -> bool:
        """per_table: whether `part` of `slot`'s batch may still be written (its batch neither
        discarded nor of an old epoch, and no part of it or an earlier batch failed)."""
        with self._lock:
            if self._halted or slot.discarded or part.epoch != self._epoch:
                return False
            return self._load_barrier is None or part.id < self._load_barrier

    def bar_from(self, batch_id: int) -> None:
        """per_table: a part of batch `batch_id` failed: no part of it or a later batch may run."""
        with self._lock:
            if self._load_barrier is None or batch_id < self._load_barrier:
                self._load_barrier = batch_id

    def parts_settled(self, slot: Slot, error: BaseException | None = None) -> None:
        """per_table: every part of `slot` is in (LOADED), or one failed (FAILED with `error`)."""
        with self._lock:
            if error is None:
                slot.state = SlotState.LOADED
            else:
                slot.state, slot.error = SlotState.FAILED, error
            self._lock.notify_all()

    # --- termin ------------------------------------------------------------------------------

    def result(self) -> Slot | None:
        """The batch whose turn it is to be acked, once its load ended (LOADED or FAILED)."""
        with self._lock:
            slot = self._slots.get(self._next_ack)
            if slot is None or slot.state not in (SlotState.LOADED, SlotState.FAILED):
                return None
            return slot

    def source_failure(self) -> BaseException | None:
        """The source's failure, once every batch handed on before it is acked (the rollback then
        rewinds from the newest ack); None otherwise."""
        with self._lock:
            if self._select_error is not None and self._rewind is None and not self._slots:
                return self._select_error
            return None

    def ack(self, slot: Slot) -> None:
        """`slot` (the `result`, LOADED) was acked: it leaves the ledger, its end is the acked
        position, the next id's turn comes, and its permits are given back. The attempts count
        starts again once the ack passes where the last rollback rewound to."""
        with self._lock:
            assert slot.batch.id == self._next_ack and self._slots.get(slot.batch.id) is slot
            del self._slots[slot.batch.id]
            self._next_ack += 1
            self._acked = slot.batch.end
            if self._retry_from is None or slot.batch.end > self._retry_from:
                self._attempt, self._retry_from = 0, None
            self.permits.retire(slot)
            self._lock.notify_all()

    def ack_position(self, position: Position) -> None:
        """During a rollback: `position`, which the target already holds, was acked as the failed batch."""
        with self._lock:
            self._acked = position

    def begin_rollback(self, failed_id: int, error: BaseException, epoch: int) -> None:
        """Batch `failed_id` failed: roll it and every later batch back, the replay to run in
        `epoch` (a new one from the meta store). No load or part starts from now on; the
        rollback completes (`complete_rollback`) once `rollback_ready`."""
        with self._lock:
            self._rolling = Rollback(failed_id, error, epoch)
            self._load_blocked = True
            if self._load_barrier is None or failed_id < self._load_barrier:
                self._load_barrier = failed_id
            self._lock.notify_all()

    def rollback_ready(self) -> bool:
        """Whether no load is running: a late write could otherwise land after the replay of an
        earlier batch touching the same keys."""
        with self._lock:
            return not self._load_tasks and not any(s.state is SlotState.LOADING for s in self._slots.values())

    def complete_rollback(self, resume: Position | None, next_id: int, rewind: bool = True) -> tuple[int, float]:
        """Complete the rollback: discard every batch from the failed one on (a discarded batch
        whose worker is done gives its permits back now, the others when it ends), switch to the
        rollback's epoch, load and ack again from `next_id`, and ask Select to rewind to `resume`
        after the backoff's delay (`rewind` False: a pause ends the run, and Select hands nothing
        on again). Returns the attempt number and that delay."""
        with self._lock:
            rolling = self._rolling
            assert rolling is not None
            self._rolling = None
            for batch_id in [b for b in self._slots if b >= rolling.failed_id]:
                slot = self._slots.pop(batch_id)
                slot.discarded = True
                if slot.worker_done:
                    self.permits.retire(slot)
            self._epoch = rolling.epoch
            self._next_load = self._next_ack = next_id
            self._load_blocked = False
            self._load_barrier = None
            self._attempt += 1
            delay = self._backoff.delay(self._attempt)
            # Set together with the new epoch: otherwise Select could hand on a batch cut from
            # its old cursor under the new epoch.
            # Never due without `rewind`: Select drops what it cut and waits for the end of the run.
            self._rewind = Rewind(resume, next_id, self._clock() + delay if rewind else math.inf)
            self._retry_from = resume
            self._lock.notify_all()
            return self._attempt, delay
