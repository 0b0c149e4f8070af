"""Settled conflicts as operators see them: the setl_conflicts_total metric, `setl status` and the conflict alert."""

from __future__ import annotations

from pathlib import Path

import yaml
from prometheus_client import generate_latest

from setl.alerts import Alerts
from setl.config import AlertConfig, NodeSettings, load_pipeline
from setl.connectors import registry
from setl.meta.sqlite import SqliteMetaStore
from setl.node import Node
from setl.node_status import conflicts_of
from setl.observe.metrics import NodeMetrics
from setl.sinks import conflicts
from setl.sinks.conflicts import ABSENT, SOURCE_WON, TARGET_WON, Conflict
from setl.status import conflicts_line
from tests.helpers.receiver import Receiver
from tests.helpers.wait import wait_until


def conflict(pipeline: str, decision: str, table: str = "db.t") -> Conflict:
    return Conflict(pipeline, table, (7,), "last_writer_wins", decision, "updated_at is later on the target", "a",
                    "b", {"id": 7, "v": 1}, {"id": 7, "v": 2}, ABSENT, "mysql-bin.000003:1234")


def test_conflicts_are_counted_by_table_and_decision_for_this_nodes_pipelines() -> None:
    """`setl_conflicts_total` counts settled conflicts per pipeline, table and decision, for the scraped node's
    pipelines only; the status figures sum them by decision."""
    conflicts.publish([conflict("conf_p", SOURCE_WON), conflict("conf_p", SOURCE_WON), conflict("conf_p", TARGET_WON),
                       conflict("conf_p", TARGET_WON, "db.u"), conflict("conf_other", SOURCE_WON)])
    text = generate_latest(NodeMetrics("n1", lambda: {"conf_p": (None, True)}).registry).decode()
    assert 'setl_conflicts_total{decision="source_won",pipeline="conf_p",table="db.t"} 2.0' in text
    assert 'setl_conflicts_total{decision="target_won",pipeline="conf_p",table="db.u"} 1.0' in text
    assert "conf_other" not in text
    assert conflicts_of("conf_p") == {SOURCE_WON: 2, TARGET_WON: 2}
    assert conflicts_line("conf_p", conflicts_of("conf_p")) == (
        "conf_p: 4 conflicts settled since it started (source_won 2, target_won 2); both versions of each are in "
        "the target's setl_conflicts table (docs/conflicts.md)")


def test_the_node_alerts_each_conflict_of_its_own_pipelines(tmp_path: Path) -> None:
    """A conflict one of the node's pipelines settled is a `conflict` alert naming table, key, decision and
    position; another node's pipeline's is not."""
    receiver = Receiver()
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "pipelines" / "mine.yaml").write_text(yaml.safe_dump({
        "source": {"type": "file", "path": "in.jsonl"}, "target": {"type": "sqlite", "path": "out.db"}}))
    meta = SqliteMetaStore(tmp_path / "meta.db")
    node = Node(NodeSettings(conf_dir=str(conf)), [load_pipeline(conf, "mine", registry())], meta)
    node.alerts = Alerts([AlertConfig(webhook=receiver.url, events=("conflict",))], "n1")
    try:
        node._conflict(conflict("elsewhere", SOURCE_WON))
        node._conflict(conflict("mine", TARGET_WON))
        wait_until(lambda: receiver.bodies, timeout=30, message="the conflict alert")
    finally:
        node.alerts.close()
        receiver.close()
        meta.close()
    (body,) = receiver.bodies
    assert {k: body[k] for k in ("pipeline", "event", "table", "key", "decision", "position")} == {
        "pipeline": "mine", "event": "conflict", "table": "db.t", "key": [7], "decision": TARGET_WON,
        "position": "mysql-bin.000003:1234"}
