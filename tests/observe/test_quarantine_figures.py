"""A quarantined table is seen everywhere a node shows itself (docs/quarantine.md): the live figures
stored with the liveness beats (hence `setl status` and /api/status), the metrics
``setl_table_quarantined`` and ``setl_quarantine_changes``, the ``quarantined`` alert, and
`setl status`'s lines."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from setl.cli import quarantine_lines
from setl.config import NodeSettings
from setl.model import Position, Quarantined
from setl.node_status import NodeStatus
from setl.observe import NodeObserver


class Recorded:
    """Alerts that only record what they were given."""

    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, dict[str, Any]]] = []
        self.observed: list[dict[str, Any]] = []

    def emit(self, pipeline: str, event: str, **details: Any) -> None:
        self.emitted.append((pipeline, event, details))

    def observe(self, pipeline: str, figures: dict[str, Any]) -> None:
        self.observed.append(dict(figures))


def test_quarantined_tables_reach_figures_metrics_alert_and_status_lines() -> None:
    """The tables a running Load saw quarantined are in the figures with their totals, labelled in the
    metrics, alerted once per table, kept while no Load runs, and unlabelled once the replay ended."""
    seen: dict[str, list[Quarantined] | None] = {"p": [Quarantined("db.bad", "Data too long (MySQL error 1406)",
                                                                   Position("bin.000001", 420), 12, 3400)]}
    alerts = Recorded()
    status = NodeStatus(NodeSettings(), meta=None, alerts=alerts, live=lambda: {},  # type: ignore[arg-type]
                        quarantine=lambda name: seen[name])
    status.observer = NodeObserver("n1", ["p"], meta=None, live=lambda: {}, metrics=True)  # type: ignore[arg-type]
    figures = status.figures("p")
    assert figures["quarantined"] == [{"table": "db.bad", "state": "quarantined", "first_position": "bin.000001:420",
                                       "cause": "Data too long (MySQL error 1406)", "changes": 12, "bytes": 3400}]
    assert (figures["quarantined_tables"], figures["quarantine_changes"], figures["quarantine_bytes"]) == (1, 12, 3400)
    assert alerts.observed[-1]["quarantined_tables"] == 1  # thresholds such as 'quarantined_tables > 0' see it
    assert alerts.emitted == [("p", "quarantined", {"table": "db.bad", "cause": "Data too long (MySQL error 1406)",
                                                    "first_position": "bin.000001:420", "changes": 12})]
    metrics = status.observer.metrics
    assert metrics is not None
    text = generate_latest(metrics.registry).decode()
    assert 'setl_table_quarantined{pipeline="p",table="db.bad"} 1.0' in text, text
    assert 'setl_quarantine_changes{pipeline="p",table="db.bad"} 12.0' in text, text

    seen["p"] = None  # its scheduler stopped (a pause): the last seen stay, no second alert
    assert status.figures("p")["quarantined_tables"] == 1 and len(alerts.emitted) == 1
    [line] = quarantine_lines([{"pipeline": "p", "quarantined": figures["quarantined"]}])
    assert "db.bad quarantined since bin.000001:420, 12 changes" in line
    assert "`setl resume --pipeline p --table db.bad`" in line

    seen["p"] = []  # replayed: it follows the stream again
    assert status.figures("p")["quarantined_tables"] == 0
    text = generate_latest(metrics.registry).decode()
    assert 'table="db.bad"' not in text, text
