"""How a pipeline's run ends (`RunEnd`): the outcome asked for, the drain and halt deadlines, and
the result once torn down, as a state machine the scheduler drives under its lock."""

from __future__ import annotations

import enum
import threading

from setl.scheduler.events import Outcome


class Phase(enum.Enum):
    """Where the end of a run stands."""

    RUNNING = "running"  # no end asked for
    STOPPING = "stopping"  # an end was asked for: no new batch; those in flight may drain
    HALTING = "halting"  # the ledger is halted: the tasks get until the halt deadline to stop
    FINISHED = "finished"  # torn down: `result` is the outcome


class RunEnd:
    """The end of one run, driven by the scheduler under its lock and by a test without threads:
    ``RUNNING -ask-> STOPPING -halt-> HALTING -finished-> FINISHED`` (`ask` and `finished` from
    any phase before it: a start that is already caught up, or a service gone, ends at once).

    A pause or a lost leadership outranks a stop asked for before (`outcome`); `error` is the last
    error asked with. While
    stopping, in-flight batches drain until `drain_timeout` after the closer began (`draining`);
    once halted, tasks get `drain_timeout` more (`halt_over`). `stopping` is an event the Select
    side polls without the lock; `wait` blocks until the run is torn down."""

    def __init__(self, drain_timeout: float) -> None:
        self.drain_timeout = drain_timeout
        self.stopping = threading.Event()
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None
        self.result: Outcome | None = None
        self._phase = Phase.RUNNING
        self._drain_deadline: float | None = None
        self._halt_deadline: float | None = None
        self._finished = threading.Event()

    @property
    def phase(self) -> Phase:
        return self._phase

    def ask(self, outcome: Outcome, error: BaseException | None = None) -> None:
        """End the run with `outcome` (recording `error`), unless an outcome that outranks it was asked for."""
        if error is not None:
            self.error = error
        if self.outcome is None or outcome in (Outcome.PAUSED, Outcome.LOST):
            self.outcome = outcome
        if self._phase is Phase.RUNNING:
            self._phase = Phase.STOPPING
        self.stopping.set()

    def drain_from(self, now: float) -> None:
        """The closer begins at `now`: batches in flight may drain until `drain_timeout` after it."""
        self._drain_deadline = now + self.drain_timeout

    def draining(self, now: float, in_flight: int, rolling_back: bool) -> bool:
        """Whether the stop keeps waiting at `now` for the `in_flight` batches to be acked: never for
        a pause or a lost leadership, nor once a batch failed while draining (`rolling_back`:
        nothing after the ack survives)."""
        if self.outcome in (Outcome.PAUSED, Outcome.LOST) or not in_flight or rolling_back:
            return False
        return now < (self._drain_deadline or 0.0)

    def halt(self, now: float) -> None:
        """The ledger was halted at `now`: the tasks have until `drain_timeout` after it to stop."""
        self._halt_deadline = now + self.drain_timeout
        if self._phase is not Phase.FINISHED:
            self._phase = Phase.HALTING

    def halt_over(self, now: float) -> bool:
        """The tasks' time to stop after the halt has run out at `now`."""
        return now >= (self._halt_deadline or 0.0)

    def finished(self, result: Outcome) -> None:
        """The run is torn down with `result`."""
        self.result = result
        self._phase = Phase.FINISHED
        self._finished.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run is torn down; False if `timeout` seconds pass first."""
        return self._finished.wait(timeout)
