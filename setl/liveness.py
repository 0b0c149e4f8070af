"""A node's liveness records: which process runs each pipeline, kept fresh while it is alive.

`setl status` trusts a pipeline's RUNNING state only while its record is fresh
(`setl.meta.base.STALE_AFTER`); in single-node mode the record is also the run lock that refuses a
second `setl start` of the same pipeline (HA nodes are kept apart by their election instead).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from setl.errors import UsageError
from setl.meta.base import BEAT_INTERVAL, STALE_AFTER, Liveness, MetaStore

log = logging.getLogger(__name__)

Figures = Callable[[str], Mapping[str, Any]]


class Heartbeat:
    """Claims, beats and releases the liveness records of the pipelines this process runs.

    `figures(pipeline)` gives the live figures stored with each beat (rates, lag). `on_lost` is
    called (from the beating thread) when another process has taken a record this one held:
    this process was frozen or cut off for longer than `STALE_AFTER`, and must stop writing.
    """

    def __init__(self, meta: MetaStore, node: str | None, *, figures: Figures = lambda name: {},
                 on_lost: Callable[[str, Liveness | None], None] = lambda name, holder: None,
                 interval: float = BEAT_INTERVAL, clock: Callable[[], float] | None = None) -> None:
        self.meta, self.node, self.figures, self.on_lost = meta, node, figures, on_lost
        self.interval = interval
        self._clock = clock or time.time
        self._held: dict[str, Liveness] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def claim(self, pipeline: str, *, force: bool = False) -> None:
        """Hold `pipeline`'s record; UsageError (exit 2) naming the live holder if another process runs it.

        `force` takes it whatever its state (an HA leader).
        """
        live = Liveness.mine(pipeline, self.node, uuid.uuid4().hex, self._clock())
        holder = self.meta.claim_run(live, stale_after=0.0 if force else STALE_AFTER)
        if holder is not None:
            raise UsageError(
                f"pipeline {pipeline} is already running: pid {holder.pid} on {holder.host or '?'}"
                f" (node {holder.node or '-'}), last seen {holder.age(self._clock()):.0f}s ago;"
                f" stop that process first (a record older than {STALE_AFTER:.0f}s, or of a process"
                f" gone from this host, does not block)", pipeline=pipeline)
        with self._lock:
            self._held[pipeline] = live
        self._start()

    def release(self, pipeline: str) -> None:
        with self._lock:
            live = self._held.pop(pipeline, None)
        if live is not None:
            try:
                self.meta.release_run(pipeline, live.token)
            except Exception as exc:  # noqa: BLE001 - the record goes stale by itself
                log.warning("pipeline=%s cannot remove its liveness record: %s", pipeline, exc)

    def close(self) -> None:
        """Release every record and stop beating."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5.0)
        for pipeline in list(self._held):
            self.release(pipeline)

    def beat_now(self) -> None:
        """One beat of every held record (what the thread does every `interval`)."""
        with self._lock:
            held = dict(self._held)
        for pipeline, live in held.items():
            try:
                figures = dict(self.figures(pipeline))
            except Exception as exc:  # noqa: BLE001 - figures are best effort: a beat goes out without them
                log.debug("pipeline=%s figures failed: %s", pipeline, exc)
                figures = {}
            try:
                ours = self.meta.beat(attrs.evolve(live, figures=figures))
            except Exception as exc:  # noqa: BLE001 - the meta store is away: the next beat tries again
                log.warning("pipeline=%s liveness beat failed: %s", pipeline, exc)
                continue
            if not ours:
                with self._lock:
                    if self._held.get(pipeline) is not live:
                        continue  # released (or claimed again) while this beat ran: not a loss
                    self._held.pop(pipeline, None)
                holder = None
                try:
                    holder = self.meta.liveness(pipeline)
                except Exception:  # noqa: BLE001 - best effort: the record is being taken over anyway
                    pass
                log.error("pipeline=%s another process took over this pipeline (%s); stopping it here",
                          pipeline, f"pid {holder.pid} on {holder.host}" if holder else "record removed")
                self.on_lost(pipeline, holder)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="setl-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat_now()
