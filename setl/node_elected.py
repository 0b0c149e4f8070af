"""A node's HA supervision (a ZooKeeper meta store): one supervisor thread per pipeline, standing by
in the pipeline's election and, while this node holds its mainstem, running it on fenced stages.

`ElectedSupervision` keeps each pipeline's supervision in an `ElectedState`, a state machine whose
transitions a unit test drives without threads, and reaches the node only through `PipelineLife`
(`setl.node_runs.PipelineRuns` implements it).
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING, Protocol

import attrs

from setl.errors import LeadershipLost
from setl.node_runs import Supervised
from setl.scheduler import Outcome, Scheduler

if TYPE_CHECKING:
    from setl.ha import Elections, Lease


class PipelineLife(Protocol):
    """What the HA supervision needs of a node: its stop flag and each step of a pipeline's life."""

    poll_interval: float

    @property
    def stopping(self) -> threading.Event:
        """Set once the node stops."""
        ...

    def between_rounds(self) -> None:
        """Serve reload requests and operators' pauses (the supervising thread, between its looks)."""
        ...

    def held_by_pause(self, run: Supervised, until_caught_up: bool) -> bool:
        """Whether the pipeline is paused (with `until_caught_up` that ends it)."""
        ...

    def next_scheduler(self, run: Supervised, until_caught_up: bool, *,
                       lease: Lease | None = None) -> Scheduler | None:
        """The pipeline's next scheduler on stages fenced by `lease`; None when it is not to run now."""
        ...

    def leading(self, name: str, *, announce: bool) -> None:
        """A scheduler of `name` is about to run under this node's lease."""
        ...

    def not_leading(self, name: str) -> None:
        """That scheduler has ended."""
        ...

    def ended(self, run: Supervised, outcome: Outcome, until_caught_up: bool) -> None:
        """Record how the scheduler ended; close the pipeline if it is not to run again."""
        ...

    def retry_start(self, run: Supervised, exc: BaseException) -> float | None:
        """After a failed start: the seconds before the next try, or None to give up."""
        ...

    def failed(self, run: Supervised, exc: BaseException) -> None:
        """The pipeline ends here with `exc`."""
        ...

    def close(self, run: Supervised) -> None:
        """The pipeline ends here (stopping)."""
        ...


class Phase(enum.Enum):
    STANDING_BY = "standing by"  # in the election, as a hot standby
    PAUSED = "paused"  # paused by an operator: not contending
    LEADING = "leading"  # holds the mainstem: runs schedulers under the lease
    RETRYING = "retrying"  # a start failed: waiting before the next
    DONE = "done"


@attrs.define
class ElectedState:
    """One pipeline's HA supervision: where it stands (`phase`), how many leaderships it took here and
    how many schedulers the current one started. Every decision of the supervisor thread between
    two calls into the node or the election is a transition here."""

    name: str
    phase: Phase = Phase.STANDING_BY
    leaderships: int = 0
    schedulers: int = 0

    def pause(self) -> None:
        self._move(Phase.PAUSED)

    def stand_by(self) -> None:
        self._move(Phase.STANDING_BY)

    def elected(self) -> None:
        """The election made this node the pipeline's holder."""
        self._move(Phase.LEADING)
        self.leaderships += 1
        self.schedulers = 0

    def scheduler_started(self) -> bool:
        """A scheduler starts under the current leadership; True for its first (announced)."""
        assert self.phase is Phase.LEADING, self.phase
        self.schedulers += 1
        return self.schedulers == 1

    @staticmethod
    def scheduler_ended(outcome: Outcome, *, lease_lost: bool) -> Outcome:
        """How a scheduler under a lease ended: LOST whenever the lease was lost meanwhile."""
        return Outcome.LOST if lease_lost else outcome

    def lead_again(self, outcome: Outcome, *, reload_pending: bool, done: bool, lease_lost: bool,
                   switch_requested: bool, stopping: bool) -> bool:
        """After a scheduler under the lease ended: whether another starts under the same lease.
        Only one stopped for a rule reload, while nothing else asks the leadership to end (giving
        the mainstem up would hand the pipeline to a standby that knows nothing of the tables to copy)."""
        again = (outcome is Outcome.STOPPED and reload_pending and not done and not lease_lost
                 and not switch_requested and not stopping)
        if not again:
            self._move(Phase.STANDING_BY)
        return again

    def election_over(self, outcome: Outcome | None, previous: Outcome | None) -> bool:
        """The election returned `outcome` (None: stopped while standing by); `previous` is how the
        pipeline ended before. True: the pipeline's result is a plain stop, no error (stopped while
        standing by, or before a new scheduler ran after a leadership lost earlier)."""
        if self.phase is Phase.LEADING:
            self._move(Phase.STANDING_BY)
        return outcome is None or (outcome is Outcome.STOPPED and previous is Outcome.LOST)

    def start_failed(self, delay: float | None) -> bool:
        """A start failed: True to try again after `delay`, False when the pipeline ends here."""
        self._move(Phase.DONE if delay is None else Phase.RETRYING)
        return delay is not None

    def finish(self) -> None:
        self.phase = Phase.DONE

    def _move(self, to: Phase) -> None:
        if self.phase is Phase.DONE:
            raise RuntimeError(f"pipeline={self.name} supervision has ended; cannot go {to.value}")
        self.phase = to


class ElectedSupervision:
    """HA mode of a node: a supervisor thread per pipeline, each standing by in the pipeline's
    election (`Elections.run`) and, while this node holds the pipeline's mainstem, running it on
    fenced stages (`_lead`). Its state is its own (`states`); the node is reached through `life`."""

    def __init__(self, life: PipelineLife, elections: Elections) -> None:
        self.life = life
        self.elections = elections
        self.states: dict[str, ElectedState] = {}

    def supervise(self, runs: list[Supervised], until_caught_up: bool) -> None:
        """A supervisor thread per pipeline; this thread serves reloads and pauses until all end."""
        self.states = {run.config.name: ElectedState(run.config.name) for run in runs}
        threads = [threading.Thread(target=self._supervise, args=(run, until_caught_up),
                                    name=f"setl-{run.config.name}-supervisor") for run in runs]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            self.life.between_rounds()
            for thread in threads:
                thread.join(timeout=self.life.poll_interval / max(1, len(threads)))

    def _supervise(self, run: Supervised, until_caught_up: bool) -> None:
        """Stand by in the pipeline's election; while this node holds it, `_lead` runs it."""
        life, name = self.life, run.config.name
        state = self.states[name]
        try:
            while not run.done:
                try:
                    if life.stopping.is_set():
                        life.close(run)
                        return
                    if life.held_by_pause(run, until_caught_up):  # a paused pipeline does not contend
                        state.pause()
                        if not run.done:
                            life.stopping.wait(life.poll_interval)
                        continue
                    state.stand_by()
                    outcome = self.elections.run(name, lambda lease: self._lead(run, state, lease, until_caught_up),
                                                 stop=life.stopping)
                    if state.election_over(outcome, run.result.outcome):
                        run.result.outcome, run.result.error = Outcome.STOPPED, None
                except BaseException as exc:  # noqa: BLE001 - a failed start is retried or recorded as the pipeline's end
                    delay = life.retry_start(run, exc)
                    if not state.start_failed(delay):
                        life.failed(run, exc)
                        return
                    assert delay is not None
                    life.stopping.wait(delay)
        finally:
            state.finish()

    def _lead(self, run: Supervised, state: ElectedState, lease: Lease, until_caught_up: bool) -> Outcome:
        """The leadership of one pipeline: a Scheduler on fenced stages, run to its end.

        Called by `Elections.run` while this node holds the pipeline's mainstem. An operator's
        switch stops the scheduler; a lost lease ends it as LOST. A scheduler stopped for a rule
        reload is followed by one on the reloaded stages under the same lease (`ElectedState.lead_again`).
        """
        state.elected()
        while True:
            outcome = self._lead_once(run, state, lease, until_caught_up)
            if not state.lead_again(outcome, reload_pending=run.reload is not None, done=run.done,
                                    lease_lost=lease.lost, switch_requested=lease.switch_requested.is_set(),
                                    stopping=self.life.stopping.is_set()):
                return outcome

    def _lead_once(self, run: Supervised, state: ElectedState, lease: Lease, until_caught_up: bool) -> Outcome:
        life, name = self.life, run.config.name
        scheduler = life.next_scheduler(run, until_caught_up, lease=lease)
        if scheduler is None:
            return Outcome.STOPPED
        lease.on_switch(scheduler.stop)
        try:
            life.leading(name, announce=state.scheduler_started())
            outcome = scheduler.run(until_caught_up=until_caught_up)
        except LeadershipLost as exc:
            scheduler.error, outcome = exc, Outcome.LOST
        finally:
            life.not_leading(name)
        outcome = state.scheduler_ended(outcome, lease_lost=lease.lost)
        if outcome is Outcome.LOST:
            lease.lose(str(scheduler.error or "leadership lost"))
        life.ended(run, outcome, until_caught_up)
        return outcome
