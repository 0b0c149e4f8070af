"""Seeing a node at work: per-pipeline lag figures (`lag`), Prometheus metrics (`metrics`), an hour
of history (`history`), and the HTTP endpoint that serves them with the status page (`server`).

`NodeObserver` ties them to a node: it hands each pipeline's scheduler a listener, samples every
pipeline's figures once a second on a thread of its own, and answers the endpoint's questions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from setl.meta.base import MetaStore
from setl.observe.history import History
from setl.observe.lag import Figures, LagTracker
from setl.observe.memory import jvm_rss_bytes, rss_bytes
from setl.observe.metrics import NodeMetrics, PipelineMetrics
from setl.scheduler.events import Fanout, Listener

log = logging.getLogger("setl.observe")

#: What the node tells the observer of each of its pipelines (`setl.node.Node.live`).
NodeLive = Callable[[], dict[str, dict[str, Any]]]


class NodeObserver:
    """Figures, metrics and history of one node's pipelines.

    `names` are the pipelines the node is configured with; `live` says which it runs now and how
    those that ended did. `meta` is the node's open meta store (read through `setl.status`).
    The sampler thread (`start`/`stop`) records every pipeline's figures each `interval` seconds
    and asks the sources of pipelines that are behind for their log end every `refresh_every`
    seconds. With `metrics` false there is no Prometheus registry and its hooks cost nothing
    (the node keeps figures for `setl status` without an HTTP endpoint).
    """

    def __init__(self, node_id: str, names: list[str], meta: MetaStore, live: NodeLive, *,
                 interval: float = 1.0, refresh_every: float = 2.0, history_size: int = 3600,
                 metrics: bool = True, clock: Callable[[], float] = time.time) -> None:
        self.node_id = node_id
        self.names = list(names)
        self.meta = meta
        self.live = live
        self.interval = interval
        self.refresh_every = refresh_every
        self.clock = clock
        self.history = History(history_size)
        self.trackers: dict[str, LagTracker] = {}
        self._listeners: dict[str, PipelineMetrics] = {}
        self._lock = threading.Lock()
        self.metrics = NodeMetrics(node_id, self._scrape) if metrics else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = clock()
        #: under HA, the whole cluster as ZooKeeper holds it (`setl.ha.cluster.cluster_view`)
        self.cluster: Callable[[], dict[str, Any]] | None = None

    def watch_cluster(self, view: Callable[[], dict[str, Any]]) -> None:
        """Show the cluster (`view`) in `/api/status` and the cluster metrics."""
        self.cluster = view
        if self.metrics is not None:
            self.metrics.watch_cluster(view)

    def cluster_view(self) -> dict[str, Any] | None:
        """The cluster for `/api/status` (None in single-node mode, or with the error when unreadable)."""
        if self.cluster is None:
            return None
        try:
            return self.cluster()
        except Exception as exc:  # noqa: BLE001 - the status page shows why the cluster is unreadable
            return {"error": str(exc)}

    # --- wiring ----------------------------------------------------------------------------------

    def listener(self, name: str, select: Any) -> Listener:
        """The hooks for a scheduler of pipeline `name` reading `select` (kept across its restarts)."""
        with self._lock:
            tracker = self.trackers.get(name)
            if tracker is None:
                tracker = self.trackers[name] = LagTracker(name, select, clock=self.clock)
            else:
                tracker.read_from(select)  # a reload's or a restart's new source
            counting = self._listeners.get(name)
            if counting is None and self.metrics is not None:
                counting = self._listeners[name] = self.metrics.pipeline(name)
        try:
            ack = self.meta.position(name)
        except Exception as exc:  # noqa: BLE001 - lag figures are best effort
            log.debug("pipeline=%s cannot read its ack for the lag figures: %s", name, exc)
        else:
            tracker.start_at(ack.position if ack is not None else None)
        return Fanout(tracker, counting) if counting is not None else tracker

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_loop, name="setl-observe", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # --- sampling ----------------------------------------------------------------------------

    def _sample_loop(self) -> None:
        next_refresh = 0.0
        next_sample = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample()
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + self.refresh_every
                    self._refresh()
            except Exception:
                log.exception("sampling the pipelines' figures failed")
            next_sample += self.interval
            self._stop.wait(max(0.0, next_sample - time.monotonic()))
            if time.monotonic() - next_sample > 10 * self.interval:
                next_sample = time.monotonic()  # a long stall: do not sample in a burst to catch up

    def sample(self) -> None:
        """Record every pipeline's figures in the history now."""
        now = self.clock()
        self.history.record(now, self.figures(now))

    def figures(self, now: float | None = None) -> dict[str, Figures | None]:
        now = self.clock() if now is None else now
        return {name: self.figures_of(name, now) for name in self.names}

    def figures_of(self, name: str, now: float | None = None) -> Figures | None:
        """One pipeline's figures (None before it first ran here)."""
        with self._lock:
            tracker = self.trackers.get(name)
        return tracker.figures(self.clock() if now is None else now) if tracker is not None else None

    def _refresh(self) -> None:
        live = self.live()
        with self._lock:
            trackers = dict(self.trackers)
        for name, tracker in trackers.items():
            if not live.get(name, {}).get("running_here") or tracker.figures().caught_up:
                continue
            try:
                tracker.refresh()
            except Exception as exc:  # noqa: BLE001 - lag figures are best effort
                log.debug("pipeline=%s cannot read the source's log end: %s", name, exc)

    def _scrape(self) -> dict[str, tuple[Figures | None, bool]]:
        live = self.live()
        figures = self.figures()
        return {name: (figures.get(name), bool(live.get(name, {}).get("running_here"))) for name in self.names}

    # --- what the endpoint serves ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """`/api/status`: the rows of `setl status --json` with each pipeline's live figures."""
        from setl.status import status_rows

        now = self.clock()
        rows = status_rows(self.meta, self.names)
        live = self.live()
        figures = self.figures(now)
        for row in rows:
            name = row["pipeline"]
            known = live.get(name, {})
            found = figures.get(name)
            tracker = self.trackers.get(name)
            row["running_here"] = bool(known.get("running_here"))
            if known.get("starting") and row["status"] in ("stopped", "dead"):
                row["status"] = "starting"  # this node is checking it before its start (Spark may be starting)
            row["ended"] = known.get("outcome") if known.get("ended") else None
            if known.get("error") and not row.get("error"):
                row["error"] = known["error"]
            row["figures"] = found.to_dict() if found is not None else None
            row["recent_rollbacks"] = list(tracker.rollbacks) if tracker is not None else []
            row["healthy"] = _healthy(row, known)
        found_status = {"node": self.node_id, "time": round(now, 3), "started": round(self.started, 3),
                        "healthy": all(row["healthy"] for row in rows), "threads": threading.active_count(),
                        "rss_bytes": rss_bytes(), "jvm_rss_bytes": jvm_rss_bytes(), "pipelines": rows}
        cluster = self.cluster_view()
        if cluster is not None:
            found_status["cluster"] = cluster
        return found_status

    def health(self) -> tuple[bool, dict[str, Any]]:
        """`/healthz`: whether every pipeline of the node is healthy, and which are not."""
        status = self.status()
        bad = {row["pipeline"]: row.get("error") or row["status"] for row in status["pipelines"]
               if not row["healthy"]}
        return not bad, {"node": self.node_id, "healthy": not bad, "unhealthy": bad}


def _healthy(row: dict[str, Any], known: dict[str, Any]) -> bool:
    """Not paused, and not ended by a failure in this node."""
    if row.get("status") == "paused":
        return False
    return not (known.get("ended") and known.get("error"))


__all__ = ["Figures", "History", "LagTracker", "NodeMetrics", "NodeObserver"]
