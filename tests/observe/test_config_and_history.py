"""The `http` key of setl.yaml, and the hour of history the status page draws."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import generate_latest

from setl.config import load_node, parse_listen
from setl.errors import ConfigError
from setl.observe.history import History
from setl.observe.lag import Figures
from setl.observe.metrics import NodeMetrics
from setl.sinks import rewrites


def figures(lag: float | None, rate: float, behind: int | None = None) -> Figures:
    return Figures(time=0.0, lag_seconds=lag, bytes_behind=behind, events_behind=0, rows_per_second=rate,
                   caught_up=lag == 0, acked_rows=0, acked_batches=0, in_flight=0, source_heard_ago=None)


def test_http_listen_is_off_unless_set_and_checked(tmp_path):
    """No `http` key: no endpoint; HOST:PORT and [IPv6]:PORT parse; anything else is a ConfigError
    naming the file and the key, and `setl start` exits 2 with one line."""
    (tmp_path / "setl.yaml").write_text("node: {id: n1}\n")
    assert load_node(tmp_path).http.listen is None
    (tmp_path / "setl.yaml").write_text("http: {listen: '127.0.0.1:9325'}\n")
    assert load_node(tmp_path).http.listen == "127.0.0.1:9325"
    assert parse_listen("[::1]:80") == ("::1", 80) and parse_listen("0.0.0.0:0") == ("0.0.0.0", 0)
    for bad in ("9325", "localhost:", "127.0.0.1:http", "127.0.0.1:70000"):
        (tmp_path / "setl.yaml").write_text(f"http: {{listen: '{bad}'}}\n")
        with pytest.raises(ConfigError, match=r"http\.listen") as caught:
            load_node(tmp_path)
        assert "setl.yaml" in str(caught.value)
    (tmp_path / "pipelines").mkdir()
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(tmp_path), "start", "--all"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "http.listen" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_history_keeps_the_newest_samples_in_order():
    """Samples come back oldest first, only those after `since`, every `step`-th keeping the
    newest; the ring drops the oldest once full; a pipeline absent from a sample has a gap (None)."""
    history = History(size=5)
    for t in range(1, 8):
        sample = {"a": figures(lag=t / 10, rate=float(t))}
        if t >= 6:
            sample["b"] = figures(lag=0.0, rate=1.0, behind=100)
        history.record(float(t), sample)
    everything = history.since()
    assert everything["times"] == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert everything["pipelines"]["a"]["lag"] == [0.3, 0.4, 0.5, 0.6, 0.7]
    assert everything["pipelines"]["a"]["rate"] == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert everything["pipelines"]["b"]["behind"] == [None, None, None, 100.0, 100.0]
    assert history.since(5.0)["times"] == [6.0, 7.0]
    assert history.since(step=2)["times"] == [3.0, 5.0, 7.0]
    assert list(history.since(pipelines={"b"})["pipelines"]) == ["b"]
    assert history.since(7.0) == {"times": [], "pipelines": {"a": {"lag": [], "rate": [], "behind": []},
                                                              "b": {"lag": [], "rate": [], "behind": []}}}


def test_values_a_policy_rewrote_are_scraped_for_this_nodes_pipelines():
    """`setl_values_rewritten_total` counts what the sinks' policies rewrote, per pipeline, table and
    kind, for the pipelines of the node being scraped only."""
    rewrites.count("scraped_p", "s.t", "nul_stripped", 2)
    rewrites.count("scraped_p", "s.t", "nul_stripped", 3)
    rewrites.count("other_node_p", "s.t", "invalid_date_null", 1)
    text = generate_latest(NodeMetrics("n1", lambda: {"scraped_p": (None, True)}).registry).decode()
    assert 'setl_values_rewritten_total{kind="nul_stripped",pipeline="scraped_p",table="s.t"} 5.0' in text
    assert "other_node_p" not in text
