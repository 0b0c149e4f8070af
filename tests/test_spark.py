"""setl.spark: one lazily built session per process, its settings, and a clear error without Java."""

from __future__ import annotations

import logging
import threading

import pytest

from setl.config import SparkConfig
from setl.errors import SetlError
from setl.spark import JavaNotFound, SessionHolder, find_java, get_session, session_conf, session_started
from setl.testing.spark import LOCAL_SETTINGS, local_spark


class FakeSession:
    def __init__(self):
        self.stopped = 0

    def stop(self):
        self.stopped += 1


def test_concurrent_first_calls_build_one_session():
    """Threads racing for the first session all get the one session, built once."""
    built, gate = [], threading.Event()

    def factory(settings):
        gate.wait(5)
        built.append(settings)
        return FakeSession()

    holder = SessionHolder(factory)
    results = []
    threads = [threading.Thread(target=lambda: results.append(holder.get(SparkConfig())), name=f"get-{i}")
               for i in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(built) == 1
    assert len(results) == 4 and all(r is results[0] for r in results)


def test_stop_is_idempotent_and_allows_a_new_session():
    """stop() stops the session once; the next get() builds a new one."""
    holder = SessionHolder(lambda settings: FakeSession())
    first = holder.get()
    holder.stop()
    holder.stop()
    assert first.stopped == 1 and not holder.started
    assert holder.get() is not first


def test_different_settings_after_start_are_ignored_with_a_warning(caplog):
    """A second caller with other settings gets the running session and a warning."""
    holder = SessionHolder(lambda settings: FakeSession())
    first = holder.get(SparkConfig(master="local[1]"))
    with caplog.at_level(logging.WARNING, logger="setl.spark"):
        assert holder.get(SparkConfig(master="local[4]")) is first
    assert "already running" in caplog.text


def test_session_conf_defaults_and_overrides():
    """Arrow is on, the UI and adaptive execution off, logs quiet by default; config values override, stringified."""
    conf = session_conf(SparkConfig(conf={"spark.ui.enabled": True, "spark.sql.shuffle.partitions": 16}))
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert conf["spark.ui.showConsoleProgress"] == "false"
    assert conf["spark.ui.enabled"] == "true"
    assert conf["spark.sql.shuffle.partitions"] == "16"
    defaults = session_conf(SparkConfig())
    assert defaults["spark.ui.enabled"] == "false"
    # Per-batch queries: no adaptive re-planning, and a batch's shuffle gets a few partitions.
    assert defaults["spark.sql.adaptive.enabled"] == "false"
    assert defaults["spark.sql.shuffle.partitions"] == "4"


def test_missing_java_is_a_clear_error(monkeypatch, tmp_path):
    """Without JAVA_HOME and without java on PATH, starting Spark raises JavaNotFound, not a traceback."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFound, match="no 'java' is on PATH") as info:
        SessionHolder().get(SparkConfig(master="local[1]"))
    assert isinstance(info.value, SetlError) and info.value.exit_code == 2


def test_bad_java_home_is_named():
    """A JAVA_HOME without bin/java is reported with its path."""
    with pytest.raises(JavaNotFound, match="JAVA_HOME is '/nowhere'"):
        find_java({"JAVA_HOME": "/nowhere", "PATH": "/usr/bin"})


def test_java_found_on_path(tmp_path):
    """find_java returns the java on PATH when JAVA_HOME is unset."""
    java = tmp_path / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    assert find_java({"PATH": str(tmp_path)}) == str(java)


def test_real_session_is_shared_and_configured():
    """The real session is built once per process with Arrow on, the UI off and the configured conf."""
    spark = local_spark()
    assert session_started()
    assert get_session() is spark
    assert get_session(LOCAL_SETTINGS) is spark
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.sparkContext.uiWebUrl is None


def test_a_large_batch_does_not_log_spark_task_size_warnings(capfd):
    """Batches travel inside Spark tasks; Spark's "task of very large size" warning is not logged per batch."""
    from setl.testing.spark import run_transform

    local_spark()
    rows = [{"id": i, "note": "x" * 100} for i in range(20_000)]  # well over Spark's 1000 KiB task warning
    out = run_transform("add_column", rows, {"name": "n2", "expr": "id * 2"}, primary_key=["id"])
    assert len(out) == len(rows) and out[-1]["n2"] == 2 * rows[-1]["id"]
    assert "very large size" not in capfd.readouterr().err


def test_spark_start_prints_no_jvm_banner_or_info_lines(tmp_path):
    """The driver JVM logs through setl's log4j2 file: no default-profile banner, no INFO lines and
    no "Set SPARK_LOCAL_IP" warning before setl lowers the level; an operator's own log4j2 file wins."""
    import subprocess
    import sys

    script = ("from setl.config import SparkConfig\nfrom setl.spark import _build\n"
              "s = _build(SparkConfig())\nprint(s.range(3).count())\ns.stop()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and result.stdout.strip() == "3", result.stderr
    for noise in ("Using Spark's default log4j profile", "setLogLevel", "SPARK_LOCAL_IP", " INFO "):
        assert noise not in result.stderr, result.stderr
    own = session_conf(SparkConfig(conf={"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=mine.xml"}))
    assert own["spark.driver.extraJavaOptions"] == "-Dlog4j2.configurationFile=mine.xml"
    assert "log4j2.properties" in session_conf(SparkConfig())["spark.driver.extraJavaOptions"]
