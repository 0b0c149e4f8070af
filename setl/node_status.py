"""What a node shows of itself: each pipeline's live figures, and the metrics and status page on
``http.listen`` (`NodeStatus`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from setl.alerts import Alerts
from setl.config import HttpTlsConfig, NodeSettings
from setl.meta.base import MetaStore
from setl.model import Quarantined
from setl.sinks import conflicts

if TYPE_CHECKING:
    from setl.observe import NodeObserver
    from setl.observe.server import StatusServer


class NodeStatus:
    """A node's lag figures (`NodeObserver`, from `start` to `stop`) and, with ``http.listen``,
    its metrics and HTTP status page (`StatusServer`).

    `figures(name)` is what the node's liveness beats store for a pipeline (`setl status` shows
    them): its lag figures, checked against the alerts' thresholds on each call, with the
    pipeline's table-rules fingerprint (`rules`) and its last reload (`reloads`), which the node
    keeps up to date. `live` is the node's own view of its pipelines, which the status page shows.
    Before `start` and after `stop` there are no lag figures; `figures` may be called from any
    thread.
    """

    def __init__(self, settings: NodeSettings, meta: MetaStore, alerts: Alerts,
                 live: Callable[[], dict[str, dict[str, Any]]],
                 quarantine: Callable[[str], list[Quarantined] | None] = lambda name: None) -> None:
        """`quarantine(name)`: the pipeline's quarantined tables as its running Load last saw them
        (None: it runs no Load here now; the last ones seen are kept)."""
        self.settings = settings
        self._quarantine = quarantine
        self._quarantined: dict[str, list[dict[str, Any]]] = {}  # per pipeline, as last seen
        self.meta = meta
        self.alerts = alerts
        self._live = live
        self.observer: NodeObserver | None = None
        self.http: StatusServer | None = None
        #: each pipeline's table-rules fingerprint, published with its liveness beats (`setl snapshot` checks it)
        self.rules: dict[str, str] = {}
        #: each pipeline's last reload: when, and what came of it
        self.reloads: dict[str, dict[str, Any]] = {}

    def figures(self, name: str) -> dict[str, Any]:
        """A pipeline's live figures (`setl.observe.lag.Figures`: lag, bytes behind, rows/s, ...),
        stored with its liveness beats and checked against the alerts' thresholds."""
        found = self.observer.figures_of(name) if self.observer is not None else None
        figures = {k: v for k, v in found.to_dict().items() if k != "position"} if found is not None else {}
        figures.update(self._quarantine_figures(name))
        self.alerts.observe(name, figures)
        rules = self.rules.get(name)
        settled = conflicts_of(name)
        if settled:
            figures = {**figures, "conflicts": settled}
        if name in self.reloads:
            figures = {**figures, "reload": self.reloads[name]}
        return {**figures, "rules": rules} if rules is not None else figures

    def _quarantine_figures(self, name: str) -> dict[str, Any]:
        """The pipeline's quarantined tables (``quarantined``: each one's state, cause, first position,
        changes kept and their bytes) and their totals, for the figures, the metrics and the
        ``quarantined`` alert (sent once per table quarantined)."""
        seen = self._quarantine(name)
        before = {t["table"] for t in self._quarantined.get(name, [])}
        if seen is not None:
            self._quarantined[name] = [q.to_dict() for q in seen]
        tables = self._quarantined.get(name, [])
        for table in tables:
            if table["table"] not in before:
                self.alerts.emit(name, "quarantined", table=table["table"], cause=table["cause"],
                                 first_position=table["first_position"], changes=table["changes"])
        metrics = self.observer.metrics if self.observer is not None else None
        if metrics is not None:
            metrics.quarantine(name, tables)
        return {"quarantined": tables, "quarantined_tables": len(tables),
                "quarantine_changes": sum(t["changes"] for t in tables),
                "quarantine_bytes": sum(t["bytes"] for t in tables)}

    def start(self, pipelines: list[str]) -> None:
        """Lag figures for every pipeline; metrics and the status page on `http.listen` when it is set."""
        from setl.observe import NodeObserver

        listen = self.settings.http.listen
        self.observer = NodeObserver(self.settings.node.id, pipelines, self.meta, self._live, metrics=bool(listen))
        if listen:
            from setl.observe.server import StatusServer

            api = None
            if self.settings.http.api is not None:
                from setl.observe.api import Api

                api = Api(self.settings, self.meta, self.observer.status, self.observer.cluster_view)
            timeout = self.settings.http.api.timeout_s if self.settings.http.api is not None else 30.0
            tls = self.settings.http.tls
            if tls is not None:  # its files are named relative to the conf directory
                tls = HttpTlsConfig(str(self.settings.resolve(tls.cert)), str(self.settings.resolve(tls.key)))
            self.http = StatusServer(self.observer, listen, api=api, tls=tls, timeout=timeout)
            self.http.start()
        self.observer.start()

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
            if self.http.api is not None:  # a verify or copy follower still reading: not past the meta store's close
                self.http.api.operations.join(5.0)
            self.http = None
        if self.observer is not None:
            self.observer.stop()


def conflicts_of(pipeline: str) -> dict[str, int]:
    """The conflicts `pipeline` settled in this process, by decision (`setl.sinks.conflicts.counts`)."""
    found: dict[str, int] = {}
    for (name, _table, decision), n in conflicts.counts().items():
        if name == pipeline:
            found[decision] = found.get(decision, 0) + n
    return found
