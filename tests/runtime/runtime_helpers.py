"""Polling, a fake clock and thread lookups shared by the runtime tests."""

from __future__ import annotations

import threading
from collections.abc import Callable

from setl.testing.servers import wait_until as _wait_until


def wait_until(cond: Callable[[], object], timeout: float = 10.0, interval: float = 0.002) -> object:
    """Poll `cond` until it is truthy; fail the test if `timeout` seconds pass first."""
    return _wait_until(cond, timeout, interval, message=getattr(cond, "__name__", "condition"))


class FakeClock:
    """A monotonic clock that moves only when a test says so; safe to read from any thread."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def live_threads(prefix: str) -> list[str]:
    """Names of live threads whose name starts with `prefix`."""
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
