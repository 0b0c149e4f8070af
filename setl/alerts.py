"""Alerts: JSON POSTs to the webhooks under `alerts:` in setl.yaml, never blocking a pipeline.

Each webhook has a sender thread and a bounded queue: `Alerts.emit` only enqueues (an alert that
finds the queue full is dropped with a logged error), and a failing POST is retried with
exponential backoff for the webhook's `max_elapsed_ms`. A body is one JSON object::

    {"pipeline": "p1", "event": "paused", "node": "node-1", "time": 1764115200.5,
     "error": "pipeline=p1 stage=load ...", ...}

with `error` for ``paused`` (an operator's `setl pause` too: "paused by an operator"); `status`,
`figure`, `value` and `threshold` for a threshold such as ``lag_seconds > 30``: sent with `status`
``firing`` when the figure crosses it upwards, and with ``resolved`` when it falls back to or below
it (then firing again only on the next crossing); `node` for ``leader_changed`` (the node that now
runs the pipeline); `table`, `rows` and `chunks` for ``snapshot_done`` (one per source table whose
copy was acked to its end); `from`, `to` and `reason` for ``rebalanced`` (sent by the cluster's
coordinator when a pipeline changes node, docs/cluster.md); `differences`, `tables` (those that
differ) and `error` (a check that reached no verdict) for ``verify_failed`` (a scheduled check,
docs/verify.md#scheduled-checks); `table`, `key`, `decision`, `policy`, `reason` and `position` for
``conflict`` (one per conflict a pipeline settled and committed, docs/conflicts.md); `table`, `cause`,
`first_position` and `changes` for ``quarantined`` (a table whose changes the target refuses is
quarantined, docs/quarantine.md; the live figures ``quarantined_tables`` and ``quarantine_changes``
take thresholds too).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from setl.config import AlertConfig, parse_alert_event

log = logging.getLogger(__name__)

#: Alerts waiting for one webhook; more are dropped (logged) rather than held in memory.
QUEUE_SIZE = 1000


class _Webhook:
    def __init__(self, config: AlertConfig) -> None:
        self.config = config
        self.events = {parse_alert_event(text)[0] for text in config.events if parse_alert_event(text)[1] is None}
        self.thresholds = [parse_alert_event(text) for text in config.events if parse_alert_event(text)[1] is not None]
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_SIZE)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="setl-alerts", daemon=True)
        self.thread.start()

    def wants(self, pipeline: str) -> bool:
        return not self.config.pipelines or pipeline in self.config.pipelines

    def put(self, body: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(body)
        except queue.Full:
            log.error("pipeline=%s alert %s to %s dropped: %d alerts are waiting already", body["pipeline"],
                      body["event"], self.config.webhook, QUEUE_SIZE)

    def _run(self) -> None:
        while True:
            body = self.queue.get()
            if body is None:
                return
            self._send(body)

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode()
        deadline = time.monotonic() + self.config.max_elapsed_ms / 1000.0
        delay = 0.5
        while True:
            request = urllib.request.Request(self.config.webhook, data=data, method="POST",
                                             headers={"Content-Type": "application/json", "User-Agent": "setl"})
            try:
                with urllib.request.urlopen(request, timeout=self.config.timeout_ms / 1000.0) as answer:
                    answer.read()
                log.info("pipeline=%s alert %s sent to %s", body["pipeline"], body["event"], self.config.webhook)
                return
            except (urllib.error.URLError, OSError, ValueError) as exc:
                if time.monotonic() + delay > deadline or self.stop.is_set():
                    log.error("pipeline=%s alert %s to %s dropped after retrying: %s", body["pipeline"],
                              body["event"], self.config.webhook, exc)
                    return
                log.warning("pipeline=%s alert %s to %s failed, next try in %.1fs: %s", body["pipeline"],
                            body["event"], self.config.webhook, delay, exc)
                if self.stop.wait(delay):
                    delay = 0.0  # closing: one last try, then give up
                delay = min(delay * 2, 30.0)


class Alerts:
    """The node's alerts: `emit` an event, `observe` live figures against thresholds, `close` to flush."""

    def __init__(self, configs: tuple[AlertConfig, ...] | list[AlertConfig], node: str | None,
                 *, clock: Callable[[], float] = time.time) -> None:
        self.node, self._clock = node, clock
        self._hooks = [_Webhook(config) for config in configs]
        self._above: set[tuple[int, str, str]] = set()  # (webhook, pipeline, threshold) currently crossed
        self._lock = threading.Lock()

    def emit(self, pipeline: str, event: str, **details: Any) -> None:
        """Send `event` about `pipeline` to every webhook that wants it; returns at once."""
        body = {"pipeline": pipeline, "event": event, "node": self.node, "time": self._clock(), **details}
        for hook in self._hooks:
            if event in hook.events and hook.wants(pipeline):
                hook.put(dict(body))

    def observe(self, pipeline: str, figures: Mapping[str, Any]) -> None:
        """Check `pipeline`'s live figures against every threshold; alert on an upward crossing."""
        for index, hook in enumerate(self._hooks):
            if not hook.wants(pipeline):
                continue
            for figure, op, limit in hook.thresholds:
                value = figures.get(figure)
                if not isinstance(value, (int, float)) or limit is None:
                    continue
                crossed = value > limit if op == ">" else value >= limit
                key = (index, pipeline, f"{figure} {op} {limit:g}")
                with self._lock:
                    was = key in self._above
                    if crossed:
                        self._above.add(key)
                    else:
                        self._above.discard(key)
                if crossed != was:  # firing on the way up, resolved on the way back
                    hook.put({"pipeline": pipeline, "event": key[2], "node": self.node, "time": self._clock(),
                              "status": "firing" if crossed else "resolved", "figure": figure, "value": value,
                              "threshold": limit})

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued for at most `timeout` seconds in all, then stop the senders (an alert
        still queued or being retried then is dropped; the sender threads never hold up an exit)."""
        deadline = time.monotonic() + timeout
        for hook in self._hooks:
            try:
                hook.queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                pass  # the sender is stopped below; it is a daemon thread
        for hook in self._hooks:
            hook.thread.join(max(0.0, deadline - time.monotonic()))
            hook.stop.set()
