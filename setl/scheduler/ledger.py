"""The in-flight ledger: one `Slot` per batch between Select and Termin, and the `Permits` they hold."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

import attrs

from setl.model import Batch
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
