"""Extract and Transform of the batches in flight: each batch is one task of one or two calls,
and reports its result to the ledger."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from setl.model import Batch
from setl.runtime import Progress
from setl.scheduler.events import Listener
from setl.scheduler.ledger import Ledger, Slot
from setl.stages import Extract, Transform

log = logging.getLogger("setl.scheduler")

#: Extract and Transform of one batch run in one call when Extract took less than this.
ETL_SLICE = 0.005


class Worker:
    """The Extract/Transform side of a `Scheduler`: `task(slot)` is the work on one batch.

    It holds no state between batches. A batch's task extracts, then transforms (in a second
    call when Extract took longer than `ETL_SLICE`), lets the ordered load `prepare` what it
    can work out ahead, and reports to the ledger (`Ledger.worked`): READY or FAILED, or,
    for a batch discarded meanwhile, nothing but its permits given back. A discarded batch,
    or one of a halted ledger, is not extracted or transformed any further.
    """

    def __init__(self, ledger: Ledger, extract: Extract, transform: Transform, *, name: str,
                 listener: Listener, prepare: Callable[[Batch], object] | None,
                 wake: Callable[..., None],
                 wrap: Callable[[BaseException, str, Batch | None], BaseException]) -> None:
        self.ledger = ledger
        self.extract = extract
        self.transform = transform
        self.name = name
        self.listener = listener
        self.prepare = prepare
        self._wake = wake
        self._wrap = wrap

    def task(self, slot: Slot) -> Callable[[], Progress]:
        """Extract then Transform `slot`'s batch, as one or two calls (DONE after the last)."""
        progress: dict[str, Batch] = {}  # the extracted batch, once Extract is done

        def step() -> Progress:
            batch = progress.get("extracted", slot.batch)
            stage = "transform" if "extracted" in progress else "extract"
            error: BaseException | None = None
            try:
                if stage == "extract":
                    began = time.perf_counter()
                    if self._live(slot):
                        batch = self.extract.extract(batch)
                    took = time.perf_counter() - began
                    self.listener.on_stage("extract", batch, took)
                    progress["extracted"], stage = batch, "transform"
                    if took > ETL_SLICE:
                        return Progress.PROGRESS
                if self._live(slot):
                    began = time.perf_counter()
                    batch = self.transform.transform(batch)
                    self.listener.on_stage("transform", batch, time.perf_counter() - began)
            except BaseException as exc:  # noqa: BLE001 - the worker hands any failure to Termin, which rolls back
                error = exc
            if error is None and self.prepare is not None and self._live(slot):
                try:  # off the ordered load's path: what the load can work out ahead
                    self.prepare(batch)
                except Exception:
                    log.debug("pipeline=%s batch=%d: preparing its load failed (the load works it out)",
                              self.name, batch.id, exc_info=True)
            wrapped = self._wrap(error, stage, slot.batch) if error is not None else None
            if self.ledger.worked(slot, batch, wrapped):
                self._wake("load")
            return Progress.DONE

        return step

    def _live(self, slot: Slot) -> bool:
        """Whether work on `slot` is still wanted (read without the lock: a stale answer only wastes work)."""
        return not slot.discarded and not self.ledger.halted


__all__ = ["ETL_SLICE", "Worker"]
