"""The cluster's settings (`node.capacity`, `ha.reassign_after_ms`, `ha.join_grace_ms`,
`ha.expected_nodes`, `pipeline.weight`, `pipeline.nodes`): defaults, and one-line errors naming
the file and key."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from setl.config import load_node, load_pipeline
from setl.connectors import registry
from setl.errors import ConfigError

SOURCE = {"type": "mysql", "host": "127.0.0.1", "user": "root", "server_id": 7}
TARGET = {"type": "parquet", "path": "out"}


def write(conf, node=None, pipeline=None):
    (conf / "pipelines").mkdir(exist_ok=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump(node or {}))
    (conf / "pipelines" / "p.yaml").write_text(yaml.safe_dump({"source": SOURCE, "target": TARGET,
                                                               **({"pipeline": pipeline} if pipeline else {})}))


def test_defaults_and_values(tmp_path):
    """Weight 1, any node, no capacity, reassign after the session timeout + 3 s unless set, a 3 s
    start-up grace waiting for no named node."""
    write(tmp_path)
    node = load_node(tmp_path)
    assert node.node.capacity is None and node.ha.reassign_after == node.ha.session_timeout_ms / 1000 + 3
    assert node.ha.join_grace_ms == 3000 and node.ha.expected_nodes is None
    config = load_pipeline(tmp_path, "p", registry())
    assert config.pipeline.weight == 1 and config.pipeline.nodes is None
    write(tmp_path, {"node": {"id": "a", "capacity": 4},
                     "ha": {"reassign_after_ms": 2500, "join_grace_ms": 10000, "expected_nodes": ["a", "b"]}},
          {"weight": 3, "nodes": ["a", "b"]})
    node = load_node(tmp_path)
    assert node.node.capacity == 4 and node.ha.reassign_after == 2.5
    assert node.ha.join_grace_ms == 10000 and node.ha.expected_nodes == ("a", "b")
    config = load_pipeline(tmp_path, "p", registry())
    assert config.pipeline.weight == 3 and config.pipeline.nodes == ("a", "b")


@pytest.mark.parametrize("node, pipeline, message", [
    ({"node": {"capacity": 0}}, None, "node.capacity: must be at least 1, got 0"),
    ({"ha": {"reassign_after_ms": -1}}, None, "ha.reassign_after_ms: must not be negative"),
    ({"ha": {"join_grace_ms": -1}}, None, "ha.join_grace_ms: must not be negative"),
    ({"ha": {"expected_nodes": ["a", ""]}}, None, "ha.expected_nodes: node ids must not be empty"),
    ({"ha": {"expected_nodes": "a"}}, None, "ha.expected_nodes: expected a list"),
    (None, {"weight": 0}, "pipeline.weight: must be at least 1, got 0"),
    (None, {"nodes": []}, "pipeline.nodes: must name at least one node id"),
    (None, {"nodes": "a"}, "pipeline.nodes: expected a list"),
])
def test_bad_cluster_settings_are_one_line_errors(tmp_path, node, pipeline, message):
    """Each bad value is a ConfigError naming the file and the key."""
    write(tmp_path, node, pipeline)
    with pytest.raises(ConfigError) as caught:
        load_node(tmp_path)
        load_pipeline(tmp_path, "p", registry())
    assert message in str(caught.value)
    assert ("setl.yaml" if node else "p.yaml") in str(caught.value)


def test_cluster_command_without_ha_is_a_usage_error(tmp_path):
    """`setl cluster status` on a single-node config exits 2 with one line."""
    write(tmp_path)
    done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(tmp_path), "cluster", "status"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "setl: error: setl cluster needs HA: meta.store: zookeeper in setl.yaml"
