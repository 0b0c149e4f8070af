"""The node's memory counts its Spark JVM (issue 23 item 9): `/metrics` gives the Python process
and the JVM apart, and the status document carries both (the page shows their sum)."""

from __future__ import annotations

import os

from prometheus_client import generate_latest

from setl import spark as setl_spark
from setl.observe.memory import jvm_rss_bytes, rss_bytes
from setl.observe.metrics import NodeMetrics


def test_the_spark_jvm_is_measured_apart_from_the_node(spark):
    pid = setl_spark.jvm_pid()
    assert pid is not None and pid != os.getpid()
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        assert b"java" in cmdline.read()
    jvm = jvm_rss_bytes()
    assert jvm is not None and jvm > 50 * 2**20  # a JVM with Spark loaded
    text = generate_latest(NodeMetrics("n1", lambda: {}).registry).decode()
    samples = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("setl_process_resident_memory_bytes{")}
    assert set(samples) == {'process="python"', 'process="jvm"'}
    assert samples['process="jvm"'] > 50 * 2**20 and samples['process="python"'] > 10 * 2**20
    assert rss_bytes() is not None
