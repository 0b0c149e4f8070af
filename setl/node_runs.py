"""The pipelines of a node and their schedulers (`PipelineRuns`): each pipeline's life between two
schedulers (its next start, a pause, its end, its close), owned in one place that the node's
supervision, single-node (`setl.node.Node`) or elected (`setl.node_elected`), drives.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from setl.alerts import Alerts
from setl.config import NodeSettings, PipelineConfig
from setl.errors import SetlError
from setl.liveness import Heartbeat
from setl.meta.base import MetaStore, Status
from setl.model import Ack, Batch
from setl.node_reload import Reloads
from setl.pipeline import Stages, fenced, identity
from setl.pipeline.reload import Reload
from setl.retry import Backoff, Failure, record_retrying
from setl.runtime import SerialExecutorService, TaskExecutionService
from setl.scheduler import BatchCap, Fanout, Forwarding, Listener, Outcome, Scheduler
from setl.scheduler.opening import EarlyOpen
from setl.snapshot.select import find_snapshot
from setl.tablecopy import TableProgress

if TYPE_CHECKING:
    from setl.ha import Lease
    from setl.observe import NodeObserver

log = logging.getLogger("setl.node")


class RetryingState(Forwarding):
    """Clears the ``retrying`` mark a rollback left in the meta store at the next ack (then `inner`'s)."""

    def __init__(self, pipeline: str, meta: MetaStore, node_id: str | None, inner: Listener) -> None:
        super().__init__(inner)
        self.pipeline, self.meta, self.node_id = pipeline, meta, node_id
        self._retrying = False

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        self._retrying = True
        super().on_rollback(batch_id, epoch, error, attempt)

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        if self._retrying:
            self._retrying = False
            try:
                if self.meta.state(self.pipeline).status is Status.RUNNING:
                    self.meta.set_state(self.pipeline, Status.RUNNING, node=self.node_id)
                    log.info("pipeline=%s stage=termin batch=%d recovered: acked again", self.pipeline, ack.batch_id)
            except Exception as exc:  # noqa: BLE001 - a listener never fails an ack; the mark clears at the next one
                log.warning("pipeline=%s cannot clear the retrying mark: %s", self.pipeline, exc)
        self.inner.on_ack(ack, batch)


@attrs.define
class PipelineResult:
    name: str
    outcome: Outcome | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class Supervised:
    """One pipeline's life in a node: its current scheduler, and whether it has ended for good."""

    config: PipelineConfig
    stages: Stages
    result: PipelineResult
    scheduler: Scheduler | None = None
    opened: bool = False
    done: bool = False
    announced: bool = False
    recheck_at: float = 0.0
    start_attempts: int = 0  # failed starts in a row (transient ones are retried)
    start_backoff: Backoff | None = None
    reload: Reload | None = None  # new rules to swap in before the next scheduler starts


def start_retry(run: Supervised, exc: BaseException, meta: MetaStore, node_id: str | None, *,
                stopping: bool) -> float | None:
    """After a failed start of `run`'s scheduler: the seconds to wait before the next try, or None
    to give up.

    A transient failure (the source, target or meta store is away) is retried with backoff for
    `retry.max_elapsed_ms`, shown by `setl status` as ``retrying``; any other failure, or a stop
    (`stopping`), gives up, and the failure is recorded as the pipeline's error (unless the
    pipeline is paused).
    """
    name = run.config.name
    if run.start_backoff is None:
        run.start_backoff = Backoff.from_settings(run.config.pipeline.retry)
    run.start_attempts += 1
    verdict = run.start_backoff.decide(exc, run.start_attempts)
    if verdict.pause or verdict.failure is not Failure.TRANSIENT or stopping:
        if not isinstance(exc, KeyboardInterrupt):
            try:
                if meta.state(name).status is not Status.PAUSED:
                    meta.set_state(name, Status.STOPPED, error=str(exc), node=node_id)
            except Exception as error:  # noqa: BLE001 - the meta store may be what failed; the start's error is logged
                log.error("pipeline=%s cannot record the failed start: %s", name, error)
        return None
    delay = run.start_backoff.delay(run.start_attempts)
    log.warning("pipeline=%s cannot start, %s, next try in %.1fs: %s", name, verdict.message, delay, exc)
    record_retrying(meta, name, exc, verdict.since, node_id)
    return delay


def pin_latest_start(config: PipelineConfig, stages: Stages, meta: MetaStore) -> None:
    """`start: latest` is the source's head at the pipeline's first start, resolved once.

    Persisted as the pipeline's position before anything is read, so a row written between
    this start and the next one (before any batch is acked) is not skipped by resolving
    "latest" again. Not when the pipeline has a position, or the target holds one (a rebuilt
    meta store), unless an operator reset it.
    """
    name = config.name
    # `start` is a field of every built-in source config; ConnectorConfig does not promise it.
    if getattr(config.source, "start", None) != "latest" or meta.position(name) is not None:
        return
    if not meta.position_was_reset(name) and stages.load.committed() is not None:
        return
    head = stages.select.head()
    if head is None:
        return
    meta.reset_position(name, head)
    log.info("pipeline=%s stage=select start: latest is %s, kept for the next starts", name, head)


class PipelineRuns:
    """A node's pipelines (`supervised`) and the schedulers running now: the one owner of which
    scheduler runs which pipeline, of the stop flag, and of each pipeline's steps between two
    schedulers. The supervising loops only call these steps; none writes a field of this class.

    `supervised` is set once by the node before its pipelines start (`begin`); `pipelines` are the
    configurations as they stand now (a reload replaces one, `swap_in`).
    """

    def __init__(self, settings: NodeSettings, pipelines: list[PipelineConfig], meta: MetaStore, *,
                 alerts: Alerts, heartbeat: Heartbeat, progress: dict[str, Listener],
                 observer: Callable[[], NodeObserver | None], rules: dict[str, str],
                 poll_interval: float = 1.0,
                 reload_config: Callable[[str], PipelineConfig] | None = None,
                 reload_outcomes: dict[str, dict[str, Any]] | None = None) -> None:
        self.settings = settings
        self.pipelines = list(pipelines)
        self.meta = meta
        self.alerts = alerts
        self.heartbeat = heartbeat
        self.progress = progress
        self.poll_interval = poll_interval
        self._observer = observer
        self._rules = rules
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, Scheduler] = {}
        self._lost: dict[str, SetlError] = {}
        self.supervised: list[Supervised] = []
        self.tasks: TaskExecutionService | None = None
        self.serial: SerialExecutorService | None = None
        self.batch_cap: BatchCap | None = None
        #: new table rules on request (`Node.request_reload`), swapped in between two schedulers (`swap_in`)
        self.reloads = Reloads(settings, meta, alerts, reload_config, self.scheduler_of,
                               {} if reload_outcomes is None else reload_outcomes)

    @property
    def node_id(self) -> str | None:
        return self.settings.node.id

    @property
    def stopping(self) -> threading.Event:
        """Set once the node stops: no scheduler starts after it."""
        return self._stop

    def begin(self, stages: dict[str, Stages], tasks: TaskExecutionService, serial: SerialExecutorService,
              batch_cap: BatchCap | None) -> list[Supervised]:
        """Before the first start: one `Supervised` per pipeline, and the shared services its
        schedulers run on."""
        self.supervised = [Supervised(config, stages[config.name], PipelineResult(config.name))
                           for config in self.pipelines]
        self.reloads.prime(self.supervised)  # a reload asked for before this start: this start read the file
        self.tasks, self.serial, self.batch_cap = tasks, serial, batch_cap
        return self.supervised

    def scheduler_of(self, name: str) -> Scheduler | None:
        with self._lock:
            return self._running.get(name)

    def holds(self, name: str) -> bool:
        """Whether a scheduler of `name` runs here now."""
        with self._lock:
            return name in self._running

    def running(self) -> set[str]:
        with self._lock:
            return set(self._running)

    def stop(self) -> None:
        """Stop every scheduler gracefully and start no other (from a signal handler too)."""
        self._stop.set()
        with self._lock:
            schedulers = list(self._running.values())
        for scheduler in schedulers:
            scheduler.stop()

    def lose(self, name: str, error: SetlError) -> None:
        """Another process runs `name` now: stop its scheduler here and never restart it (`ended`)."""
        self._lost[name] = error
        scheduler = self.scheduler_of(name)
        if scheduler is not None:
            scheduler.stop()

    # -- the steps of one pipeline's life

    def between_rounds(self) -> None:
        """What the supervising thread does between its looks: serve reload requests, and stop the
        schedulers of pipelines an operator paused."""
        self.reloads.if_asked(self.supervised)
        self.watch_operator_pauses()

    def watch_operator_pauses(self) -> None:
        with self._lock:
            running = dict(self._running)
        for name, scheduler in running.items():
            if self.meta.state(name).status is Status.PAUSED:
                log.info("pipeline=%s paused by an operator; stopping gracefully", name)
                scheduler.stop()

    def retry_start(self, run: Supervised, exc: BaseException) -> float | None:
        """After a failed start: the seconds to wait before the next try, or None to give up
        (`start_retry`)."""
        with self._lock:
            self._running.pop(run.config.name, None)
        run.scheduler = None
        return start_retry(run, exc, self.meta, self.node_id, stopping=self._stop.is_set())

    def next_scheduler(self, run: Supervised, until_caught_up: bool, *,
                       lease: Lease | None = None) -> Scheduler | None:
        """The pipeline's next scheduler, registered for `stop()`; None while paused or when it has ended.

        Under HA `lease` is this node's hold on the pipeline: the scheduler gets fenced stages.
        """
        name = run.config.name
        if self._stop.is_set():
            self.close(run)
            return None
        if run.reload is not None:
            self.swap_in(run)
        stages = run.stages if lease is None else fenced(run.stages, lease)  # the chain's outermost layer
        # A new leader opens its source at the ack while it opens, fences and checks the target.
        ack = self.meta.position(name) if lease is not None else None
        opening = EarlyOpen(name, stages.select, ack.position) if ack is not None else None
        try:
            if not run.opened:
                run.stages.load.open()
                run.opened = True
            if self.held_by_pause(run, until_caught_up):
                if opening is not None:
                    opening.abandon()
                return None
            # a target position another source server wrote is refused; one only the target knows is
            # taken when its stored identity matches (a wiped meta store), refused otherwise
            identity.check(run.config, run.stages, self.meta)
            pin_latest_start(run.config, run.stages, self.meta)
        except BaseException:
            if opening is not None:
                opening.abandon()
            raise
        progress: Listener = self.progress[name]
        observer = self._observer()
        if observer is not None:
            progress = Fanout(progress, observer.listener(name, run.stages.select))
        listener: Listener = RetryingState(name, self.meta, self.node_id, progress)
        scheduler = Scheduler(name, run.config.pipeline, stages.select, stages.extract, stages.transform, stages.load,
                              self.meta,
                              node_id=self.node_id,
                              listener=listener,
                              tasks=self.tasks, serial=self.serial, batch_cap=self.batch_cap, opening=opening)
        with self._lock:
            self._running[name] = scheduler
        if self._stop.is_set():  # stop() may have missed it
            if opening is not None:
                opening.abandon()
            self.close(run)
            return None
        run.scheduler = scheduler
        return scheduler

    def held_by_pause(self, run: Supervised, until_caught_up: bool) -> bool:
        """Whether the pipeline is paused (announced once); with `until_caught_up` that ends it."""
        name = run.config.name
        state = self.meta.state(name)
        if state.status is not Status.PAUSED:
            run.announced = False
            return False
        reason = f": {state.error}" if state.error else " by an operator"
        if until_caught_up:
            run.result.outcome = Outcome.PAUSED
            run.result.error = SetlError(f"pipeline is paused{reason}; run `setl resume --pipeline {name}`",
                                         pipeline=name)
            self.close(run)
        elif not run.announced:
            log.warning("pipeline=%s is paused%s; waiting for `setl resume --pipeline %s`", name, reason, name)
            run.announced = True
        return True

    def leading(self, name: str, *, announce: bool) -> None:
        """This node leads `name` now (HA): it is the only writer of its liveness record; `announce`
        the first scheduler of a leadership (the ``leader_changed`` alert)."""
        self.heartbeat.claim(name, force=True)  # the election made this node the only writer
        if announce:
            self.alerts.emit(name, "leader_changed")

    def not_leading(self, name: str) -> None:
        self.heartbeat.release(name)

    def ended(self, run: Supervised, outcome: Outcome, until_caught_up: bool) -> None:
        """Record how the pipeline's scheduler ended; close the pipeline if it is not to run again."""
        scheduler = run.scheduler
        assert scheduler is not None
        with self._lock:
            self._running.pop(run.config.name, None)
        run.scheduler = None
        run.start_attempts = 0
        run.result.outcome, run.result.error = outcome, scheduler.error
        if outcome is Outcome.PAUSED:
            self.alerts.emit(run.config.name, "paused",
                             error=str(scheduler.error) if scheduler.error is not None else "paused by an operator")
        elif outcome is Outcome.STOPPED and self.meta.state(run.config.name).status is Status.PAUSED:
            self.alerts.emit(run.config.name, "paused", error="paused by an operator")  # `setl pause` stopped it
        elif outcome is Outcome.CAUGHT_UP:
            self.alerts.emit(run.config.name, "caught_up")
        lost = self._lost.get(run.config.name)
        if lost is not None:  # another process runs it now: never restart it here
            run.result.outcome, run.result.error = Outcome.STOPPED, lost
            self.close(run)
            return
        if (outcome is Outcome.CAUGHT_UP
                or (outcome is Outcome.PAUSED and until_caught_up)
                or (outcome is Outcome.STOPPED and scheduler.error is not None)):
            self.close(run)

    def failed(self, run: Supervised, exc: BaseException) -> None:
        log.debug("pipeline=%s supervisor failed", run.config.name, exc_info=True)
        run.result.outcome, run.result.error = None, exc
        self.close(run)

    def close(self, run: Supervised) -> None:
        with self._lock:
            self._running.pop(run.config.name, None)
        run.scheduler = None
        run.done = True
        if run.opened:
            run.opened = False
            try:
                run.stages.load.close()
            except Exception as exc:  # noqa: BLE001 - the pipeline has ended; a failed close is only logged
                log.error("pipeline=%s closing the target failed: %s", run.config.name, exc)

    # -- reloads and table copies

    def swap_in(self, run: Supervised) -> None:
        """Between two schedulers: the reloaded stages replace the old ones, and every added table's
        copy is requested (served online by the new source, `setl snapshot`)."""
        reload, name = run.reload, run.config.name
        assert reload is not None
        run.reload = None
        if run.opened:
            run.opened = False
            try:
                run.stages.load.close()
            except Exception as exc:  # noqa: BLE001 - the old connection: the new stages have their own
                log.warning("pipeline=%s closing the old target connection failed: %s", name, exc)
        run.config, run.stages = reload.config, reload.stages
        self.pipelines = [reload.config if c.name == name else c for c in self.pipelines]
        self.watch_copies(name, reload.stages)
        for table in reload.added:
            self.meta.request_snapshot(name, table)
        self._rules[name] = reload.fingerprint
        log.info("pipeline=%s stage=reload applied: %s", name, reload.describe())
        outcomes = self.reloads.outcomes
        request = outcomes.get(name, {}).get("request")  # the `setl reload` it answers, if any
        outcomes[name] = {"at": time.time(), "result": "applied", "message": reload.describe(),
                          **({"request": request} if request else {})}

    def watch_copies(self, name: str, stages: Stages) -> None:
        """Each table copy of `stages`' source acked to its end: the snapshot_done alert."""
        snapshot = find_snapshot(stages.select)
        if snapshot is not None:
            snapshot.on_done = functools.partial(self._snapshot_done, name)

    def _snapshot_done(self, name: str, progress: TableProgress) -> None:
        self.alerts.emit(name, "snapshot_done", table=str(progress.name), rows=progress.rows, chunks=progress.chunks)
        for run in self.supervised:
            if run.config.name == name:
                try:  # the target's identity record then says the copy finished (`setl.pipeline.identity`)
                    identity.copy_finished(run.config, run.stages, self.meta)
                except Exception as exc:  # noqa: BLE001 - a note on the target only; the copy itself is acked
                    log.warning("pipeline=%s cannot record the finished copy on the target: %s", name, exc)
