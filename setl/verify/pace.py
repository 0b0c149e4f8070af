"""How a check paces its reads (`Pace`): it waits for the pipeline's acked position to reach a
source read's position, pauses while the pipeline's lag is above a bound, and throttles the source
rows it reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import attrs

from setl.errors import SetlError
from setl.model import Position


class VerifyError(SetlError):
    """`setl verify` could not reach a verdict (exit 2)."""

    exit_code = 2


@attrs.define
class Pace:
    """The pacing of one check of `pipeline`; `acked()` reads the pipeline's acked position.

    `wait_timeout` bounds each wait for the acked position; `lag()` reads the pipeline's lag in
    seconds (None: not known): `wait_lag` waits while it is above `max_lag` (0: never), at most
    `lag_timeout` seconds over the whole check, calling `paused` with (table, lag) while it waits
    and (table, None) when it resumes; `charge` sleeps as long as the source rows read for the
    table since `begin` are ahead of `max_rows_per_second` (0: unbounded). `sleep` and `clock` are
    injectable for tests. It owns the throttle's account and the time paused for the lag."""

    pipeline: str
    acked: Callable[[], Position | None]
    max_rows_per_second: float = 0.0
    wait_timeout: float = 60.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    lag: Callable[[], float | None] | None = None
    max_lag: float = 0.0
    lag_timeout: float = 600.0
    paused: Callable[[str, float | None], None] | None = None
    _paused_for: float = attrs.field(default=0.0, init=False)
    #: source rows read for the table being compared, since `_since` (the throttle's account)
    _read: int = attrs.field(default=0, init=False)
    _since: float = attrs.field(default=0.0, init=False)

    def begin(self) -> float:
        """A table's check begins now (the throttle's account starts again): the clock's time."""
        self._since = self.clock()
        self._read = 0
        return self._since

    def wait_acked(self, position: Position | None, table: str, stop: threading.Event | None = None) -> None:
        """Return once the pipeline's acked position is at or past `position`; raise VerifyError
        after `wait_timeout` seconds, or as soon as `stop` is set."""
        if position is None:
            return
        deadline = self.clock() + self.wait_timeout
        while True:
            ack = self.acked()
            if ack is not None and ack >= position:
                return
            if stop is not None and stop.is_set():
                raise VerifyError("the check stopped", pipeline=self.pipeline, stage="verify", table=table)
            if self.clock() >= deadline:
                raise VerifyError(f"the acked position {ack or 'none'} has not reached the source's position "
                                  f"{position} within {self.wait_timeout:.0f}s: start the pipeline (or let it "
                                  "catch up) and verify again", pipeline=self.pipeline, stage="verify", table=table)
            self.sleep(0.02)

    def wait_lag(self, table: str) -> None:
        """Return once the pipeline's lag is at most `max_lag` (or not known); the time spent waiting
        over the whole check is bounded by `lag_timeout`."""
        if self.lag is None or self.max_lag <= 0:
            return
        lag = self.lag()
        if lag is None or lag <= self.max_lag:
            return
        began = self.clock()
        try:
            while lag is not None and lag > self.max_lag:
                if self.paused is not None:
                    self.paused(table, lag)
                if self._paused_for + self.clock() - began >= self.lag_timeout:
                    raise VerifyError(f"the pipeline's lag ({lag:.0f}s) stayed above the bound of {self.max_lag:g}s "
                                      f"for {self.lag_timeout:.0f}s: verify again once it has caught up (or raise "
                                      "--max-lag / --lag-timeout)", pipeline=self.pipeline, stage="verify",
                                      table=table, position=self.acked())
                self.sleep(min(1.0, max(0.05, self.lag_timeout / 20)))
                lag = self.lag()
        finally:
            self._paused_for += self.clock() - began
        if self.paused is not None:
            self.paused(table, None)

    def charge(self, rows: int) -> None:
        """Count `rows` more source rows read for this table, and sleep as long as the reads so far
        are ahead of `max_rows_per_second`."""
        self._read += rows
        if self.max_rows_per_second > 0:
            ahead = self._read / self.max_rows_per_second - (self.clock() - self._since)
            if ahead > 0:
                self.sleep(ahead)
