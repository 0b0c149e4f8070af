"""The node's Prometheus metrics (prometheus-client, on a registry of the node's own): counters and
histograms fed by each pipeline's scheduler hooks (`PipelineMetrics`), and gauges read when scraped
(lag figures, leadership, threads). docs/metrics.md documents every metric."""

from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from setl.model import Ack, Batch, DdlChange, Op
from setl.observe.lag import Figures
from setl.observe.memory import jvm_rss_bytes, rss_bytes
from setl.scheduler.events import Listener
from setl.sinks import conflicts, rewrites

log = logging.getLogger("setl.observe")

_KEY = attrgetter("schema", "table", "op")
_DDL = "ddl"
STAGES = ("select", "extract", "transform", "load", "termin")
#: Stage latency buckets, in seconds: a batch takes from a millisecond (an ack) to many (a Spark job).
STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)


class NodeMetrics:
    """Every metric of one node, on `registry` (a fresh `CollectorRegistry` by default, never the global one).

    `live` is called at each scrape: ``{pipeline: (figures or None, leader: bool)}`` for the
    pipelines the node is configured with.
    """

    def __init__(self, node_id: str, live: Callable[[], dict[str, tuple[Figures | None, bool]]],
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rows = Counter("setl_rows_acked", "Row changes acked (applied to the target), by target table and op",
                            ["pipeline", "table", "op"], registry=r)
        self.batches = Counter("setl_batches_acked", "Batches acked", ["pipeline"], registry=r)
        self.stage = Histogram("setl_stage_seconds", "Time a batch spent in a stage", ["pipeline", "stage"],
                               buckets=STAGE_BUCKETS, registry=r)
        self.rollbacks = Counter("setl_rollbacks", "Rollbacks (a batch failed; later batches discarded)",
                                 ["pipeline"], registry=r)
        self.retries = Counter("setl_retries", "Rollbacks followed by a retry", ["pipeline"], registry=r)
        self.pauses = Counter("setl_pauses", "Pauses after retrying ran out or could not help", ["pipeline"],
                              registry=r)
        self.in_flight = Gauge("setl_batches_in_flight", "Batches between Select and Termin", ["pipeline"],
                               registry=r)
        self.permit_waits = Counter("setl_permit_waits", "Times Select waited for a permit", ["pipeline"],
                                    registry=r)
        self.permit_wait_seconds = Counter("setl_permit_wait_seconds", "Seconds Select waited for permits",
                                           ["pipeline"], registry=r)
        self.verify_rows = Counter("setl_verify_rows_checked", "Source rows compared by scheduled checks",
                                   ["pipeline"], registry=r)
        self.verify_differences = Gauge("setl_verify_differences", "Keys (or keyless rows) the last scheduled "
                                        "check found different, missing, extra or unsettled", ["pipeline"],
                                        registry=r)
        self.table_quarantined = Gauge("setl_table_quarantined", "1 for each target table quarantined "
                                       "(docs/quarantine.md)", ["pipeline", "table"], registry=r)
        self.quarantine_changes = Gauge("setl_quarantine_changes", "Changes kept on the target for a quarantined "
                                        "table", ["pipeline", "table"], registry=r)
        self._quarantined: dict[str, set[str]] = {}
        self.info = Gauge("setl_node_info", "This node (value 1)", ["node"], registry=r)
        self.info.labels(node_id).set(1)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        r.register(_LiveCollector(live))

    def watch_cluster(self, view: Callable[[], dict[str, Any]]) -> None:
        """`setl_cluster_nodes` and `setl_pipelines_assigned{node}` from the cluster's view."""
        self.registry.register(_ClusterCollector(view))

    def verified(self, pipeline: str, rows: int, differences: int) -> None:
        """A scheduled check ended (`setl.verify.schedule`): `rows` compared, `differences` found."""
        self.verify_rows.labels(pipeline).inc(rows)
        self.verify_differences.labels(pipeline).set(differences)

    def quarantine(self, pipeline: str, tables: list[dict[str, Any]]) -> None:
        """`pipeline`'s quarantined tables now (`setl.model.Quarantined.to_dict`); the ones gone are unlabelled."""
        now = {str(t["table"]): int(t["changes"]) for t in tables}
        for gone in self._quarantined.get(pipeline, set()) - set(now):
            self.table_quarantined.remove(pipeline, gone)
            self.quarantine_changes.remove(pipeline, gone)
        for table, changes in now.items():
            self.table_quarantined.labels(pipeline, table).set(1)
            self.quarantine_changes.labels(pipeline, table).set(changes)
        self._quarantined[pipeline] = set(now)

    def pipeline(self, name: str) -> PipelineMetrics:
        return PipelineMetrics(self, name)


class PipelineMetrics(Listener):
    """The hooks of one pipeline's scheduler, counting into `NodeMetrics` (label children bound once)."""

    def __init__(self, metrics: NodeMetrics, pipeline: str) -> None:
        self.metrics, self.pipeline = metrics, pipeline
        self._rows: dict[tuple[str, str], Any] = {}
        self._batches = metrics.batches.labels(pipeline)
        self._stages = {stage: metrics.stage.labels(pipeline, stage) for stage in STAGES}
        self._rollbacks = metrics.rollbacks.labels(pipeline)
        self._retries = metrics.retries.labels(pipeline)
        self._pauses = metrics.pauses.labels(pipeline)
        self._in_flight = metrics.in_flight.labels(pipeline)
        self._waits = metrics.permit_waits.labels(pipeline)
        self._waited = metrics.permit_wait_seconds.labels(pipeline)
        self._lock = threading.Lock()

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        self._in_flight.set(in_flight)

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        self._in_flight.set(in_flight)

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        self._batches.inc()
        try:  # counted in C: a tuple per row change, no Python frame
            tally = Tally(map(_KEY, batch.changes))
        except AttributeError:  # a DDL has no op
            tally = Tally((c.schema, c.table or "", _DDL if isinstance(c, DdlChange) else c.op) for c in batch.changes)
        for (schema, table, op), n in tally.items():
            key = (f"{schema}.{table}" if table else schema, op.value if isinstance(op, Op) else op)
            child = self._rows.get(key)
            if child is None:
                with self._lock:
                    child = self._rows.setdefault(key, self.metrics.rows.labels(self.pipeline, *key))
            child.inc(n)

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        self._rollbacks.inc()

    def on_retry(self, batch_id: int, attempt: int, delay: float) -> None:
        self._retries.inc()

    def on_pause(self, batch_id: int, error: BaseException) -> None:
        self._pauses.inc()

    def on_stage(self, stage: str, batch: Batch, seconds: float) -> None:
        child = self._stages.get(stage)
        if child is not None:
            child.observe(seconds)

    def on_permit_wait(self, seconds: float) -> None:
        self._waits.inc()
        self._waited.inc(seconds)


class _LiveCollector(Collector):
    """Gauges read at scrape time: lag figures, leadership, the node's threads."""

    def __init__(self, live: Callable[[], dict[str, tuple[Figures | None, bool]]]) -> None:
        self.live = live

    def describe(self) -> Iterable[Any]:
        return []  # computed at each scrape; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        lag = GaugeMetricFamily("setl_lag_seconds", "Seconds behind the source (0 when caught up)",
                                labels=["pipeline"])
        behind = GaugeMetricFamily("setl_behind_bytes", "Binlog bytes between the ack and the log's end",
                                   labels=["pipeline"])
        events = GaugeMetricFamily("setl_behind_events", "Row changes read and not acked yet", labels=["pipeline"])
        rate = GaugeMetricFamily("setl_rows_per_second", "Rows acked per second over the last 10 s",
                                 labels=["pipeline"])
        caught = GaugeMetricFamily("setl_caught_up", "1 while the ack is at the log's end", labels=["pipeline"])
        heard = GaugeMetricFamily("setl_source_heard_age_seconds",
                                  "Seconds since the binlog reader last heard from the server", labels=["pipeline"])
        leader = GaugeMetricFamily("setl_leader", "1 while this node runs the pipeline, 0 while it stands by",
                                   labels=["pipeline"])
        live = self.live()
        for name, (figures, leading) in sorted(live.items()):
            leader.add_metric([name], 1.0 if leading else 0.0)
            if figures is None:
                continue
            if figures.lag_seconds is not None:
                lag.add_metric([name], figures.lag_seconds)
            if figures.bytes_behind is not None:
                behind.add_metric([name], figures.bytes_behind)
            events.add_metric([name], figures.events_behind)
            rate.add_metric([name], figures.rows_per_second)
            caught.add_metric([name], 1.0 if figures.caught_up else 0.0)
            if figures.source_heard_ago is not None:
                heard.add_metric([name], figures.source_heard_ago)
        threads = GaugeMetricFamily("setl_node_threads", "Threads of the node's process",
                                    value=threading.active_count())
        memory = GaugeMetricFamily("setl_process_resident_memory_bytes", "Resident memory of the node's processes: "
                                   "python (the node) and jvm (its Spark JVM, while one runs)", labels=["process"])
        for process, found in (("python", rss_bytes()), ("jvm", jvm_rss_bytes())):
            if found is not None:
                memory.add_metric([process], found)
        rewritten = CounterMetricFamily("setl_values_rewritten", "Values a target's policy wrote differently "
                                        "instead of refusing them (invalid_dates: null, nul_in_text: strip|escape)",
                                        labels=["pipeline", "table", "kind"])
        for (pipeline, table, kind), n in sorted(rewrites.counts().items()):
            if pipeline in live:  # this node's pipelines only (tests run several nodes in one process)
                rewritten.add_metric([pipeline, table, kind], n)
        settled = CounterMetricFamily("setl_conflicts", "Conflicts (a row changed on both sides) detected and "
                                      "settled, by target table and decision: source_won, target_won",
                                      labels=["pipeline", "table", "decision"])
        for (pipeline, table, decision), n in sorted(conflicts.counts().items()):
            if pipeline in live:
                settled.add_metric([pipeline, table, decision], n)
        yield from (lag, behind, events, rate, caught, heard, leader, threads, memory, rewritten, settled)


class _ClusterCollector(Collector):
    """The cluster as ZooKeeper holds it, read at scrape time (`setl.ha.cluster.cluster_view`)."""

    def __init__(self, view: Callable[[], dict[str, Any]]) -> None:
        self.view = view

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            view = self.view()
        except Exception as exc:  # noqa: BLE001 - a scrape never fails on an unreadable cluster
            log.debug("cannot read the cluster for the metrics: %s", exc)
            return
        nodes = view.get("nodes", {})
        yield GaugeMetricFamily("setl_cluster_nodes", "Live nodes in the cluster",
                                value=sum(1 for n in nodes.values() if n.get("live")))
        assigned = GaugeMetricFamily("setl_pipelines_assigned", "Pipelines the cluster's coordinator assigns to a node",
                                     labels=["node"])
        for name, node in sorted(nodes.items()):
            assigned.add_metric([name], len(node.get("pipelines", [])))
        yield assigned

