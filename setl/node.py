"""A node: builds each configured pipeline's stages (`setl.pipeline`) and supervises their schedulers.

It restarts nothing silently: a pipeline that paused waits for `setl resume`
(watched in the meta store), and an operator's `setl pause` stops it gracefully.
"""

from __future__ import annotations

import collections
import functools
import gc
import logging
import operator
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from setl.alerts import Alerts
from setl.config import NodeSettings, PipelineConfig, RuntimeConfig
from setl.errors import ConfigError, LeadershipLost, SetlError
from setl.liveness import Heartbeat
from setl.meta.base import Liveness, MetaStore, Status
from setl.model import Ack, Batch
from setl.node_reload import Reloads
from setl.node_status import NodeStatus
from setl.pipeline import Stages, analyse_steps, build_stages, describe_tables, fenced, identity
from setl.pipeline.checks import check_rules, check_source, rules_fingerprint
from setl.pipeline.reload import Reload
from setl.retry import Backoff, Failure, record_retrying
from setl.runtime import SerialExecutorService, TaskExecutionService
from setl.scheduler import BatchCap, Fanout, Forwarding, Listener, Outcome, Scheduler, supports_per_table
from setl.schema import check_tables
from setl.snapshot.select import find_snapshot
from setl.tablecopy import TableProgress
from setl.verify.schedule import ScheduledChecks

if TYPE_CHECKING:
    from setl.ha import Elections, Lease
    from setl.observe import NodeObserver

log = logging.getLogger("setl.node")


_TABLE = operator.attrgetter("schema", "table")


class ProgressLog(Listener):
    """Logs a pipeline's progress every `every` seconds of acks; keeps the changes acked per
    table and the last ack (`setl start --until-caught-up`'s summary)."""

    def __init__(self, pipeline: str, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.pipeline, self.every, self.clock = pipeline, every, clock
        self._since = clock()
        self._rows = 0
        self._batches = 0
        #: changes acked per (schema, table) as loaded (table None for a schema's DDL)
        self.tables: collections.Counter[tuple[str, str | None]] = collections.Counter()
        self.last: Ack | None = None

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        self._rows += len(batch)
        self._batches += 1
        now = self.clock()
        self.tables.update(map(_TABLE, batch.changes))  # counted in C, no name formatted per change
        self.last = ack
        if now - self._since >= self.every:
            rate = self._rows / (now - self._since)
            log.info("pipeline=%s stage=termin batch=%d acked %d batches, %d changes (%.0f/s), at %s",
                     self.pipeline, ack.batch_id, self._batches, self._rows, rate, ack.position)
            self._since, self._rows, self._batches = now, 0, 0


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


def shared_services(settings: NodeSettings) -> tuple[TaskExecutionService, SerialExecutorService]:
    """The task service and the per-table load executor every pipeline of a node runs on."""
    runtime = settings.runtime
    tasks = TaskExecutionService(
        runtime.workers, runtime.max_workers,
        overrun_threshold=runtime.overrun_threshold_ms / 1000.0, max_overruns=runtime.max_overruns,
        idle_backoff=runtime.idle_backoff_ms / 1000.0, name="setl-task",
    )
    return tasks, SerialExecutorService(runtime.load_slots, runtime.load_workers, name="setl-load")


def tune_gc(runtime: RuntimeConfig) -> None:
    """Make Python's cyclic garbage collector cheap for a long-running node (`runtime.gc_threshold`).

    Row changes are freed by reference counting; the cyclic collector only
    finds work in reference cycles, yet with Python's defaults it runs every
    700 allocations and, every so often, walks every live object: the
    modules, Spark's and the drivers' objects and the batches in flight.
    `gc.freeze()` takes what is alive after startup out of its sight for good,
    and a higher first-generation threshold makes collections rarer.
    `tools/bench/bench_transform_e2e.py --gc-threshold 0` measures the
    difference. Only `setl start` calls this: it changes the whole process.
    """
    if not runtime.gc_threshold:
        return
    gc.collect()
    gc.freeze()
    _first, second, third = gc.get_threshold()
    gc.set_threshold(runtime.gc_threshold, second, third)


def node_batch_cap(settings: NodeSettings) -> BatchCap | None:
    """The cap on batches in flight that every pipeline of a node shares (`runtime.max_batches_in_flight`)."""
    limit = settings.runtime.batch_cap
    return BatchCap(limit) if limit else None


@attrs.define(eq=False)
class _Supervised:
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


def refused_start(meta: MetaStore, name: str, exc: SetlError, node_id: str | None) -> None:
    """A start the checks before any read refused (a purged position, a source setting, a target
    table that does not fit): `setl status` shows its error on the stopped pipeline, unless the
    pipeline is paused or another process runs it."""
    try:
        if meta.state(name).status not in (Status.PAUSED, Status.RUNNING):
            meta.set_state(name, Status.STOPPED, error=str(exc), node=node_id)
    except Exception as error:  # noqa: BLE001 - the meta store may be what failed; the start's error is logged
        log.error("pipeline=%s cannot record the refused start: %s", name, error)


def start_retry(run: _Supervised, exc: BaseException, meta: MetaStore, node_id: str | None, *,
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


def _settings_deferred(name: str, exc: BaseException) -> None:
    """The source could not be asked at start: its reader judges the settings when it opens (the
    cause is said once, by the start that fails or retries)."""
    log.info("pipeline=%s source settings not judged at start (the reader judges them when it opens)", name)


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


class Node:
    """Runs pipelines until they stop; `stop()` (from a signal handler) drains them gracefully.

    Every pipeline's work runs on the node's shared services (`shared_services`), its batches under
    the node's cap on batches in flight (`node_batch_cap`). In single-node mode the thread that
    calls `run` supervises every pipeline (starts its scheduler, notices its end, decides what
    comes next), so a node's thread count does not grow with its pipelines.
    Under HA each pipeline has a supervisor thread, which waits as a standby in its election.
    One pipeline pausing or failing leaves the others running.
    """

    #: How often the supervising loop looks for schedulers that ended.
    tick = 0.05

    def __init__(self, settings: NodeSettings, pipelines: list[PipelineConfig], meta: MetaStore,
                 *, poll_interval: float = 1.0,
                 reload_config: Callable[[str], PipelineConfig] | None = None) -> None:
        self.settings = settings
        self.pipelines = pipelines
        self.meta = meta
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, Scheduler] = {}
        self.elections: Elections | None = None  # when the meta store is ZooKeeper
        self.tasks: TaskExecutionService | None = None
        self.serial: SerialExecutorService | None = None
        self.batch_cap: BatchCap | None = None
        self.progress = {config.name: ProgressLog(config.name) for config in pipelines}
        self._lost: dict[str, SetlError] = {}
        self.alerts = Alerts(settings.alerts, settings.node.id)
        #: lag figures, metrics and the status page (`NodeStatus.figures` go with the liveness beats)
        self.status = NodeStatus(settings, meta, self.alerts, self.live)
        self.heartbeat = Heartbeat(meta, settings.node.id, figures=self.figures, on_lost=self._lost_record)
        self._runs: list[_Supervised] = []
        self._starting = False  # checking the pipelines at start (the status endpoint says "starting")
        self.status.rules.update({config.name: rules_fingerprint(config) for config in pipelines})
        #: new table rules on request (`request_reload`), swapped in between two schedulers (`_swap_in`)
        self.reloads = Reloads(settings, meta, self.alerts, reload_config, self._scheduler_of, self.status.reloads)
        self._elected = ElectedSupervision(self)

    @property
    def observer(self) -> NodeObserver | None:
        """Each pipeline's lag figures (`figures()`), and with `http.listen` its metrics and history."""
        return self.status.observer

    def figures(self, name: str) -> dict[str, Any]:
        """A pipeline's live figures, stored with its liveness beats (`NodeStatus.figures`)."""
        return self.status.figures(name)

    def _scheduler_of(self, name: str) -> Scheduler | None:
        with self._lock:
            return self._running.get(name)

    def request_reload(self) -> None:
        """Re-read every pipeline's file and apply new table rules at the next batch boundary
        (SIGHUP, `setl reload`): only sets a flag, so a signal handler may call it."""
        self.reloads.request()

    def _swap_in(self, run: _Supervised) -> None:
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
        snapshot = find_snapshot(reload.stages.select)
        if snapshot is not None:
            snapshot.on_done = functools.partial(self._snapshot_done, name)
        for table in reload.added:
            self.meta.request_snapshot(name, table)
        self.status.rules[name] = reload.fingerprint
        log.info("pipeline=%s stage=reload applied: %s", name, reload.describe())
        request = self.reloads.outcomes.get(name, {}).get("request")  # the `setl reload` it answers, if any
        self.reloads.outcomes[name] = {"at": time.time(), "result": "applied", "message": reload.describe(),
                                       **({"request": request} if request else {})}

    def _snapshot_done(self, name: str, progress: TableProgress) -> None:
        self.alerts.emit(name, "snapshot_done", table=str(progress.name), rows=progress.rows, chunks=progress.chunks)
        for run in self._runs:
            if run.config.name == name:
                try:  # the target's identity record then says the copy finished (`setl.pipeline.identity`)
                    identity.copy_finished(run.config, run.stages, self.meta)
                except Exception as exc:  # noqa: BLE001 - a note on the target only; the copy itself is acked
                    log.warning("pipeline=%s cannot record the finished copy on the target: %s", name, exc)

    def _rebalanced(self, name: str, details: dict[str, Any]) -> None:
        self.alerts.emit(name, "rebalanced", **details)  # this node coordinates the cluster (docs/cluster.md)

    def _lost_record(self, name: str, holder: Liveness | None) -> None:
        """Another process took this pipeline's liveness record: stop it here, for good.

        Under HA the election decides who runs a pipeline (a deposed leader is fenced and stops by
        itself); a record taken by the new leader is no reason to stop anything more here.
        """
        if self.settings.meta.store == "zookeeper":
            return
        where = f"pid {holder.pid} on {holder.host} (node {holder.node})" if holder else "another process"
        self._lost[name] = SetlError(f"{where} took over this pipeline while this process was not beating"
                                     " (frozen or cut off); stopped here", pipeline=name, stage="node")
        with self._lock:
            scheduler = self._running.get(name)
        if scheduler is not None:
            scheduler.stop()

    def live(self) -> dict[str, dict[str, Any]]:
        """What this node knows of each of its pipelines beyond the meta store: whether it runs it
        now, and whether (and how) it ended here."""
        with self._lock:
            running = set(self._running)
        found: dict[str, dict[str, Any]] = {
            config.name: {"running_here": config.name in running, "ended": False, "outcome": None, "error": None,
                          "starting": self._starting}
            for config in self.pipelines}
        for run in self._runs:
            result = run.result
            found[run.config.name].update(
                ended=run.done, outcome=result.outcome.value if result.outcome else None,
                error=str(result.error) if result.error is not None and run.done else None)
        return found

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            schedulers = list(self._running.values())
        for scheduler in schedulers:
            scheduler.stop()

    def run(self, *, until_caught_up: bool = False) -> list[PipelineResult]:
        """Run every pipeline to its end; returns how each ended.

        In single-node mode every pipeline's liveness record is claimed first: UsageError (exit 2)
        if a live process runs one of them. Under HA the election decides and the leader claims it.
        """
        try:
            if self.settings.meta.store != "zookeeper":
                for config in self.pipelines:
                    self.heartbeat.claim(config.name)
            return self._run(until_caught_up)
        finally:
            self.heartbeat.close()
            self.alerts.close()

    def _run(self, until_caught_up: bool) -> list[PipelineResult]:
        stages = {config.name: build_stages(self.settings, config, self.meta) for config in self.pipelines}
        for name, built in stages.items():
            snapshot = find_snapshot(built.select)
            if snapshot is not None:  # each table copy acked to its end: the snapshot_done alert
                snapshot.on_done = functools.partial(self._snapshot_done, name)
        for config in self.pipelines:
            if config.pipeline.load.mode == "per_table" and not supports_per_table(stages[config.name].load):
                raise ConfigError(f"pipeline.load.mode: target.type {config.target.type} cannot load per table "
                                  f"(use ordered)", file=config.file, pipeline=config.name)
        # The status endpoint first: the checks below may start Spark (10-20 s), and a node being
        # started should answer /api/status ("starting") rather than look stopped.
        self._starting = True
        self.status.start([c.name for c in self.pipelines])
        try:
            self._check_at_start(stages)
        except BaseException as exc:
            self.status.stop()
            if isinstance(exc, SetlError) and exc.context.get("pipeline") in {c.name for c in self.pipelines}:
                refused_start(self.meta, str(exc.context["pipeline"]), exc, self.settings.node.id)
            raise
        if self.settings.meta.store == "zookeeper":  # HA: run only what this node holds
            from setl.ha import Elections

            self.elections = Elections.for_node(self.settings, self.meta, self.pipelines,
                                                on_rebalanced=self._rebalanced)
            if self.elections is not None and self.observer is not None:
                self.observer.watch_cluster(self.elections.cluster_view)  # any node shows the whole cluster
        runs = [_Supervised(config, stages[config.name], PipelineResult(config.name)) for config in self.pipelines]
        self._runs = runs
        self.reloads.prime(runs)  # a reload asked for before this start: this start read the file already
        self.tasks, self.serial = shared_services(self.settings)
        self.batch_cap = node_batch_cap(self.settings)
        self._starting = False
        checks = self._start_scheduled_checks()
        try:
            if self.elections is None:
                self._supervise_all(runs, until_caught_up)
            else:
                self._elected.supervise(runs, until_caught_up)
        finally:
            checks.stop()
            if self.elections is not None:
                self.elections.close()
            self.status.stop()
            self.tasks.shutdown(timeout=10.0)
            self.serial.shutdown_now()
            self.serial.await_termination(10.0)
        return [run.result for run in runs]

    def _check_at_start(self, stages: dict[str, Stages]) -> None:
        """Before leadership or any read: the source server's settings (every refused one in one
        `SourceError` line, exit 1), the rules against the source's tables, the transform steps
        analysed, existing target tables checked; a misfit is a configuration error (exit 2)."""
        for config in self.pipelines:
            ack = self.meta.position(config.name)  # the server's settings first: nothing moves when one is refused
            check_source(config, stages[config.name].select, ack.position if ack else None,
                         functools.partial(log.warning, "pipeline=%s source setting %s", config.name),
                         functools.partial(_settings_deferred, config.name))
            tables = describe_tables(config, stages[config.name], always=True)
            if tables is not None:  # a rule matching nothing warns; a filter reading a missing column stops
                for line in check_rules(config, tables):
                    log.warning("pipeline=%s %s", config.name, line)
            analyse_steps(config, stages[config.name], tables)
            try:  # before anything is written: an existing target table that does not fit is one too
                check_tables(stages[config.name].load, tables, first_start=self.meta.position(config.name) is None)
            except SetlError as exc:
                exc.with_context(file=config.file or None, pipeline=config.name)
                raise

    def _supervise_all(self, runs: list[_Supervised], until_caught_up: bool) -> None:
        """Single-node mode: this thread starts, watches and restarts every pipeline."""
        next_watch = 0.0
        while not all(run.done for run in runs):
            now = time.monotonic()
            for run in runs:
                if run.done or (run.scheduler is None and now < run.recheck_at):
                    continue
                try:
                    if run.scheduler is not None:
                        outcome = run.scheduler.wait(0)
                        if outcome is None:
                            continue
                        self._ended(run, outcome, until_caught_up)
                        if run.done:
                            continue
                    scheduler = self._next_scheduler(run, until_caught_up)
                    if scheduler is None:
                        run.recheck_at = now + self.poll_interval
                        continue
                    scheduler.start(until_caught_up=until_caught_up)
                    run.start_attempts = 0
                except BaseException as exc:  # noqa: BLE001 - a failed start is retried or recorded as the pipeline's end
                    delay = self._retry_start(run, exc)
                    if delay is None:
                        self._failed(run, exc)
                    else:
                        run.recheck_at = now + delay
            self.reloads.if_asked(runs)
            if now >= next_watch:
                self._watch_operator_pauses()
                next_watch = now + self.poll_interval
            if self._stop.wait(self.tick):  # stopping: the schedulers drain; keep the same pace
                time.sleep(self.tick)

    def _retry_start(self, run: _Supervised, exc: BaseException) -> float | None:
        """After a failed start: the seconds to wait before the next try, or None to give up
        (`start_retry`)."""
        with self._lock:
            self._running.pop(run.config.name, None)
        run.scheduler = None
        return start_retry(run, exc, self.meta, self.settings.node.id, stopping=self._stop.is_set())

    def _next_scheduler(self, run: _Supervised, until_caught_up: bool, *,
                        lease: Lease | None = None) -> Scheduler | None:
        """The pipeline's next scheduler, registered for `stop()`; None while paused or when it has ended.

        Under HA `lease` is this node's hold on the pipeline: the scheduler gets fenced stages.
        """
        name = run.config.name
        if self._stop.is_set():
            self._close(run)
            return None
        if run.reload is not None:
            self._swap_in(run)
        if not run.opened:
            run.stages.load.open()
            run.opened = True
        if self._held_by_pause(run, until_caught_up):
            return None
        # a target position another source server wrote is refused; one only the target knows is
        # taken when its stored identity matches (a wiped meta store), refused otherwise
        identity.check(run.config, run.stages, self.meta)
        pin_latest_start(run.config, run.stages, self.meta)
        stages = run.stages if lease is None else fenced(run.stages, lease)  # the chain's outermost layer
        progress: Listener = self.progress[name]
        if self.observer is not None:
            progress = Fanout(progress, self.observer.listener(name, run.stages.select))
        listener: Listener = RetryingState(name, self.meta, self.settings.node.id, progress)
        scheduler = Scheduler(name, run.config.pipeline, stages.select, stages.extract, stages.transform, stages.load,
                              self.meta,
                              node_id=self.settings.node.id,
                              listener=listener,
                              tasks=self.tasks, serial=self.serial, batch_cap=self.batch_cap)
        with self._lock:
            self._running[name] = scheduler
        if self._stop.is_set():  # stop() may have missed it
            self._close(run)
            return None
        run.scheduler = scheduler
        return scheduler

    def _held_by_pause(self, run: _Supervised, until_caught_up: bool) -> bool:
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
            self._close(run)
        elif not run.announced:
            log.warning("pipeline=%s is paused%s; waiting for `setl resume --pipeline %s`", name, reason, name)
            run.announced = True
        return True

    def _ended(self, run: _Supervised, outcome: Outcome, until_caught_up: bool) -> None:
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
            self._close(run)
            return
        if (outcome is Outcome.CAUGHT_UP
                or (outcome is Outcome.PAUSED and until_caught_up)
                or (outcome is Outcome.STOPPED and scheduler.error is not None)):
            self._close(run)

    def _failed(self, run: _Supervised, exc: BaseException) -> None:
        log.debug("pipeline=%s supervisor failed", run.config.name, exc_info=True)
        run.result.outcome, run.result.error = None, exc
        self._close(run)

    def _close(self, run: _Supervised) -> None:
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

    def _watch_operator_pauses(self) -> None:
        with self._lock:
            running = dict(self._running)
        for name, scheduler in running.items():
            if self.meta.state(name).status is Status.PAUSED:
                log.info("pipeline=%s paused by an operator; stopping gracefully", name)
                scheduler.stop()

    # --- scheduled checks (setl.verify.schedule): the node only starts them and reports results ----

    def _start_scheduled_checks(self) -> ScheduledChecks:
        """The `verify:` checks of the pipelines this node runs, on a thread of their own."""
        checks = ScheduledChecks(self.settings, self.pipelines, self.meta, holds=self._holds,
                                 on_result=self._verified)
        checks.start()
        return checks

    def _holds(self, name: str) -> bool:
        with self._lock:
            return name in self._running

    def _verified(self, name: str, result: dict[str, Any]) -> None:
        """A scheduled check's result: metrics, and the verify_failed alert unless equal."""
        metrics = self.observer.metrics if self.observer is not None else None
        if metrics is not None:
            metrics.verified(name, int(result["rows"]), int(result["differences"]))
        if not result["equal"]:
            self.alerts.emit(name, "verify_failed", differences=result["differences"], error=result["error"],
                             tables=[t["table"] for t in result["tables"] if not t["equal"]])


class ElectedSupervision:
    """HA mode of a `Node` (a ZooKeeper meta store): one supervisor thread per pipeline, each
    standing by in the pipeline's election (`Elections.run`) and, while this node holds the
    pipeline's mainstem, running it on fenced stages (`_lead`). It holds no state of its own: the
    pipeline's life is in its `_Supervised`, the stop flag, the schedulers and the retries are the
    node's, which it calls.
    """

    def __init__(self, node: Node) -> None:
        self.node = node

    def supervise(self, runs: list[_Supervised], until_caught_up: bool) -> None:
        """HA mode: a supervisor thread per pipeline, each waiting in its election while a standby."""
        node = self.node
        threads = [threading.Thread(target=self._supervise, args=(run, until_caught_up),
                                    name=f"setl-{run.config.name}-supervisor") for run in runs]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            node.reloads.if_asked(runs)
            node._watch_operator_pauses()
            for thread in threads:
                thread.join(timeout=node.poll_interval / max(1, len(threads)))

    def _supervise(self, run: _Supervised, until_caught_up: bool) -> None:
        """HA: stand by in the pipeline's election; while this node holds it, `_lead` runs it."""
        node = self.node
        assert node.elections is not None
        name = run.config.name
        while not run.done:
            try:
                if node._stop.is_set():
                    node._close(run)
                    return
                if node._held_by_pause(run, until_caught_up):  # a paused pipeline does not contend
                    if not run.done:
                        node._stop.wait(node.poll_interval)
                    continue
                outcome = node.elections.run(name, lambda lease: self._lead(run, lease, until_caught_up),
                                             stop=node._stop)
                if outcome is None or (outcome is Outcome.STOPPED and run.result.outcome is Outcome.LOST):
                    # stopped while standing by, or before a new scheduler ran: a leadership lost earlier is no error
                    run.result.outcome, run.result.error = Outcome.STOPPED, None
            except BaseException as exc:  # noqa: BLE001 - a failed start is retried or recorded as the pipeline's end
                delay = node._retry_start(run, exc)
                if delay is None:
                    node._failed(run, exc)
                    return
                node._stop.wait(delay)

    def _lead(self, run: _Supervised, lease: Lease, until_caught_up: bool) -> Outcome:
        """The leadership of one pipeline (HA): a Scheduler on fenced stages, run to its end.

        Called by `Elections.run` while this node holds the pipeline's mainstem. An operator's
        switch stops the scheduler; a lost lease ends it as LOST. A scheduler stopped for a rule
        reload is followed by one on the reloaded stages under the same lease (giving the mainstem
        up would hand the pipeline to a standby that knows nothing of the tables to copy).
        """
        first = True
        while True:
            outcome = self._lead_once(run, lease, until_caught_up, announce=first)
            first = False
            if (outcome is not Outcome.STOPPED or run.reload is None or run.done or lease.lost
                    or lease.switch_requested.is_set() or self.node._stop.is_set()):
                return outcome

    def _lead_once(self, run: _Supervised, lease: Lease, until_caught_up: bool, *, announce: bool) -> Outcome:
        node = self.node
        scheduler = node._next_scheduler(run, until_caught_up, lease=lease)
        if scheduler is None:
            return Outcome.STOPPED
        lease.on_switch(scheduler.stop)
        try:
            node.heartbeat.claim(run.config.name, force=True)  # the election made this node the only writer
            if announce:
                node.alerts.emit(run.config.name, "leader_changed")
            outcome = scheduler.run(until_caught_up=until_caught_up)
        except LeadershipLost as exc:
            scheduler.error, outcome = exc, Outcome.LOST
        finally:
            node.heartbeat.release(run.config.name)
        if lease.lost and outcome is not Outcome.LOST:
            outcome = Outcome.LOST
        if outcome is Outcome.LOST:
            lease.lose(str(scheduler.error or "leadership lost"))
        node._ended(run, outcome, until_caught_up)
        return outcome
