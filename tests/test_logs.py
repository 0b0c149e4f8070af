"""`log:` in setl.yaml: the level is honoured, `format: json` gives one object per line with fields, DDL is logged."""

from __future__ import annotations

import json
import logging

from setl.logs import JsonFormatter
from setl.model import DdlChange
from tests.test_cli import Setup, make_stream


def test_json_records_lift_the_message_fields():
    record = logging.LogRecord("setl.node", logging.WARNING, __file__, 1,
                               "pipeline=%s stage=load batch=%d table=%s position=%s: slow", ("p1", 12, "s.t",
                                                                                             "mysql-bin.000003:4711"),
                               None)
    data = json.loads(JsonFormatter().format(record))
    assert data["pipeline"] == "p1" and data["stage"] == "load" and data["batch"] == 12
    assert data["table"] == "s.t" and data["position"] == "mysql-bin.000003:4711"
    assert data["level"] == "WARNING" and data["logger"] == "setl.node" and data["time"].endswith("Z")
    assert data["message"] == "pipeline=p1 stage=load batch=12 table=s.t position=mysql-bin.000003:4711: slow"


def _with_log(setup: Setup, text: str) -> None:
    conf = setup.conf / "setl.yaml"
    conf.write_text(conf.read_text() + text)


def _start(setup: Setup):
    env = setup.env()
    env.pop("SETL_LOG_LEVEL", None)
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(setup.conf), "start", "--pipeline", "p",
                           "--until-caught-up"], env=env, capture_output=True, text=True, timeout=180)


def test_log_level_warning_hides_info_lines(tmp_path):
    setup = Setup(tmp_path, make_stream(50))
    _with_log(setup, "log:\n  level: WARNING\n")
    result = _start(setup)
    assert result.returncode == 0, result.stderr
    assert " INFO " not in result.stderr, result.stderr
    setup.assert_target_equals_stream()


def test_json_format_gives_one_object_per_line_and_logs_skipped_ddl(tmp_path):
    """Applied DDL is logged too: tests/e2e/test_ddl.py (the SQLite target applies none)."""
    txs = make_stream(30)
    txs.insert(9, [DdlChange("other", "gone", "DROP TABLE other.gone")])
    setup = Setup(tmp_path, txs)
    (setup.conf / "pipelines" / "p.yaml").write_text((setup.conf / "pipelines" / "p.yaml").read_text()
                                                      + "tables:\n  - source: 'demo\\..*'\n")
    _with_log(setup, "log:\n  format: json\n")
    result = _start(setup)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert [r for r in records if r.get("pipeline") == "p" and "caught up" in r["message"]]
    skipped = [r for r in records if "DDL skipped" in r["message"]]
    assert len(skipped) == 1 and skipped[0]["table"] == "other.gone" and skipped[0]["stage"] == "extract"
    assert skipped[0]["position"].startswith("stream.jsonl:")


def test_until_caught_up_ends_with_a_summary_of_changes_per_table_and_the_duration(tmp_path):
    txs = make_stream(120)
    setup = Setup(tmp_path, txs)
    result = _start(setup)
    assert result.returncode == 0, result.stderr
    first, *tables = result.stdout.strip().splitlines()
    total = sum(len(tx) for tx in txs)
    assert first.startswith(f"p: caught up at {setup.stream.name}:") and f": {total:,} changes (" in first
    assert " in 1 table(s)" in first and "s: " in first
    assert tables == [f"  demo.items  {total:>12,}"]
