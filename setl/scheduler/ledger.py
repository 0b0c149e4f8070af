"""The in-flight ledger's entries: one `Slot` per batch between Select and Termin."""

from __future__ import annotations

import enum

import attrs

from setl.model import Batch


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
