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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from setl.alerts import Alerts
from setl.config import NodeSettings, PipelineConfig, RuntimeConfig
from setl.errors import ConfigError, SetlError
from setl.liveness import Heartbeat
from setl.meta.base import Liveness, MetaStore, Status
from setl.model import Ack, Batch, Quarantined
from setl.node_elected import ElectedSupervision
from setl.node_reload import Reloads
from setl.node_runs import PipelineResult, PipelineRuns, Supervised
from setl.node_status import NodeStatus
from setl.pipeline import Stages, analyse_steps, build_stages, describe_tables
from setl.pipeline.checks import check_rules, check_source, rules_fingerprint
from setl.runtime import SerialExecutorService, TaskExecutionService
from setl.scheduler import BatchCap, Listener, supports_per_table
from setl.schema import check_tables
from setl.sinks import conflicts
from setl.verify.schedule import ScheduledChecks

if TYPE_CHECKING:
    from setl.ha import Elections
    from setl.observe import NodeObserver

__all__ = ["Node", "PipelineResult", "ProgressLog", "node_batch_cap", "shared_services", "tune_gc"]

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


def refused_start(meta: MetaStore, name: str, exc: SetlError, node_id: str | None) -> None:
    """A start the checks before any read refused (a purged position, a source setting, a target
    table that does not fit): `setl status` shows its error on the stopped pipeline, unless the
    pipeline is paused or another process runs it."""
    try:
        if meta.state(name).status not in (Status.PAUSED, Status.RUNNING):
            meta.set_state(name, Status.STOPPED, error=str(exc), node=node_id)
    except Exception as error:  # noqa: BLE001 - the meta store may be what failed; the start's error is logged
        log.error("pipeline=%s cannot record the refused start: %s", name, error)


def _settings_deferred(name: str, exc: BaseException) -> None:
    """The source could not be asked at start: its reader judges the settings when it opens (the
    cause is said once, by the start that fails or retries)."""
    log.info("pipeline=%s source settings not judged at start (the reader judges them when it opens)", name)


class Node:
    """Runs pipelines until they stop; `stop()` (from a signal handler) drains them gracefully.

    Every pipeline's work runs on the node's shared services (`shared_services`), its batches under
    the node's cap on batches in flight (`node_batch_cap`). Each pipeline's life between two
    schedulers is `runs`' (`setl.node_runs.PipelineRuns`). In single-node mode the thread that
    calls `run` supervises every pipeline (starts its scheduler, notices its end, decides what
    comes next), so a node's thread count does not grow with its pipelines.
    Under HA (`setl.node_elected.ElectedSupervision`) each pipeline has a supervisor thread, which
    waits as a standby in its election. One pipeline pausing or failing leaves the others running.
    """

    #: How often the supervising loop looks for schedulers that ended.
    tick = 0.05

    def __init__(self, settings: NodeSettings, pipelines: list[PipelineConfig], meta: MetaStore,
                 *, poll_interval: float = 1.0,
                 reload_config: Callable[[str], PipelineConfig] | None = None) -> None:
        self.settings = settings
        self.meta = meta
        self.poll_interval = poll_interval
        self.elections: Elections | None = None  # when the meta store is ZooKeeper
        self.tasks: TaskExecutionService | None = None
        self.serial: SerialExecutorService | None = None
        self.batch_cap: BatchCap | None = None
        self.progress = {config.name: ProgressLog(config.name) for config in pipelines}
        self.alerts = Alerts(settings.alerts, settings.node.id)
        #: lag figures, metrics and the status page (`NodeStatus.figures` go with the liveness beats)
        self.status = NodeStatus(settings, meta, self.alerts, self.live, quarantine=self._quarantine_view)
        self.heartbeat = Heartbeat(meta, settings.node.id, figures=self.figures, on_lost=self._lost_record)
        self._starting = False  # checking the pipelines at start (the status endpoint says "starting")
        self.status.rules.update({config.name: rules_fingerprint(config) for config in pipelines})
        #: the pipelines, their schedulers and each one's steps between two of them
        self.runs = PipelineRuns(settings, pipelines, meta, alerts=self.alerts, heartbeat=self.heartbeat,
                                 progress=dict(self.progress), observer=lambda: self.observer,
                                 rules=self.status.rules, poll_interval=poll_interval,
                                 reload_config=reload_config, reload_outcomes=self.status.reloads)
        self._runs: list[Supervised] = []  # the same list as `runs.supervised`, once started

    @property
    def pipelines(self) -> list[PipelineConfig]:
        """The pipelines' configurations as they stand now (a reload replaces one)."""
        return self.runs.pipelines

    @property
    def reloads(self) -> Reloads:
        return self.runs.reloads

    @property
    def observer(self) -> NodeObserver | None:
        """Each pipeline's lag figures (`figures()`), and with `http.listen` its metrics and history."""
        return self.status.observer

    def _quarantine_view(self, name: str) -> list[Quarantined] | None:
        """The quarantined tables `name`'s running Load last saw (None: it runs no scheduler here now)."""
        scheduler = self.runs.scheduler_of(name)
        return scheduler.load.quarantine_view() if scheduler is not None else None

    def figures(self, name: str) -> dict[str, Any]:
        """A pipeline's live figures, stored with its liveness beats (`NodeStatus.figures`), and
        ``streaming``: whether a scheduler runs it here now (`setl stop` waits for false)."""
        return {**self.status.figures(name), "streaming": name in self.runs.running()}

    def request_reload(self) -> None:
        """Re-read every pipeline's file and apply new table rules at the next batch boundary
        (SIGHUP, `setl reload`): only sets a flag, so a signal handler may call it."""
        self.runs.reloads.request()

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
        self.runs.lose(name, SetlError(f"{where} took over this pipeline while this process was not beating"
                                       " (frozen or cut off); stopped here", pipeline=name, stage="node"))

    def live(self) -> dict[str, dict[str, Any]]:
        """What this node knows of each of its pipelines beyond the meta store: whether it runs it
        now, and whether (and how) it ended here."""
        running = self.runs.running()
        found: dict[str, dict[str, Any]] = {
            config.name: {"running_here": config.name in running, "ended": False, "outcome": None, "error": None,
                          "starting": self._starting}
            for config in self.pipelines}
        for run in self.runs.supervised:
            result = run.result
            found[run.config.name].update(
                ended=run.done, outcome=result.outcome.value if result.outcome else None,
                error=str(result.error) if result.error is not None and run.done else None)
        return found

    def stop(self) -> None:
        self.runs.stop()

    def run(self, *, until_caught_up: bool = False) -> list[PipelineResult]:
        """Run every pipeline to its end; returns how each ended.

        In single-node mode every pipeline's liveness record is claimed first: UsageError (exit 2)
        if a live process runs one of them. Under HA the election decides and the leader claims it.
        """
        try:
            if self.settings.meta.store != "zookeeper":
                for config in self.pipelines:
                    self.heartbeat.claim(config.name)
            unsubscribe = conflicts.subscribe(self._conflict)  # each settled conflict: the conflict alert
            try:
                return self._run(until_caught_up)
            finally:
                unsubscribe()
        finally:
            self.heartbeat.close()
            self.alerts.close()

    def _conflict(self, found: conflicts.Conflict) -> None:
        """A conflict one of this node's pipelines settled (and committed): the ``conflict`` alert."""
        if any(config.name == found.pipeline for config in self.pipelines):
            self.alerts.emit(found.pipeline, "conflict", table=found.table, key=list(found.key),
                             decision=found.decision, policy=found.policy, reason=found.reason,
                             position=found.position)

    def _run(self, until_caught_up: bool) -> list[PipelineResult]:
        stages = {config.name: build_stages(self.settings, config, self.meta) for config in self.pipelines}
        for name, built in stages.items():
            self.runs.watch_copies(name, built)  # each table copy acked to its end: the snapshot_done alert
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

            http = self.status.http
            api_url = http.advertised_url if http is not None and http.api is not None else None
            self.elections = Elections.for_node(self.settings, self.meta, self.pipelines,
                                                on_rebalanced=self._rebalanced, api_url=api_url)
            if self.elections is not None and self.observer is not None:
                self.observer.watch_cluster(self.elections.cluster_view)  # any node shows the whole cluster
        self.tasks, self.serial = shared_services(self.settings)
        self.batch_cap = node_batch_cap(self.settings)
        runs = self._runs = self.runs.begin(stages, self.tasks, self.serial, self.batch_cap)
        self._starting = False
        checks = self._start_scheduled_checks()
        try:
            if self.elections is None:
                self._supervise_all(runs, until_caught_up)
            else:
                ElectedSupervision(self.runs, self.elections).supervise(runs, until_caught_up)
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

    def _supervise_all(self, runs: list[Supervised], until_caught_up: bool) -> None:
        """Single-node mode: this thread starts, watches and restarts every pipeline."""
        life = self.runs
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
                        life.ended(run, outcome, until_caught_up)
                        if run.done:
                            continue
                    scheduler = life.next_scheduler(run, until_caught_up)
                    if scheduler is None:
                        run.recheck_at = now + self.poll_interval
                        continue
                    scheduler.start(until_caught_up=until_caught_up)
                    run.start_attempts = 0
                except BaseException as exc:  # noqa: BLE001 - a failed start is retried or recorded as the pipeline's end
                    delay = life.retry_start(run, exc)
                    if delay is None:
                        life.failed(run, exc)
                    else:
                        run.recheck_at = now + delay
            life.reloads.if_asked(runs)
            if now >= next_watch:
                life.watch_operator_pauses()
                next_watch = now + self.poll_interval
            if life.stopping.wait(self.tick):  # stopping: the schedulers drain; keep the same pace
                time.sleep(self.tick)

    # --- scheduled checks (setl.verify.schedule): the node only starts them and reports results ----

    def _start_scheduled_checks(self) -> ScheduledChecks:
        """The `verify:` checks of the pipelines this node runs, on a thread of their own."""
        checks = ScheduledChecks(self.settings, self.pipelines, self.meta, holds=self.runs.holds,
                                 on_result=self._verified)
        checks.start()
        return checks

    def _verified(self, name: str, result: dict[str, Any]) -> None:
        """A scheduled check's result: metrics, and the verify_failed alert unless equal."""
        metrics = self.observer.metrics if self.observer is not None else None
        if metrics is not None:
            metrics.verified(name, int(result["rows"]), int(result["differences"]))
        if not result["equal"]:
            self.alerts.emit(name, "verify_failed", differences=result["differences"], error=result["error"],
                             tables=[t["table"] for t in result["tables"] if not t["equal"]])


