"""A verify report as `setl verify` and `setl repair` print it: JSON with `--json`, else its lines."""

from __future__ import annotations

import json

from setl.verify.report import Report, TableReport


def _report() -> Report:
    same = TableReport(source="s.a", target="t.a", mode="keyed", rows=3, chunks=1)
    drift = TableReport(source="s.b", target="t.b", mode="keyed", rows=2, chunks=1,
                        missing=[{"key": {"id": "7"}}])
    return Report(pipeline="p", tables=[same, drift], seconds=0.5, skipped={"s.c": "a copy is under way"})


def test_text_as_json_is_the_report_data():
    """`text(as_json=True)` is the report's data as JSON (what `--json` prints)."""
    report = _report()
    assert json.loads(report.text(as_json=True)) == report.to_dict()


def test_text_is_the_report_lines():
    """`text()` is the report's lines, one a line, its summary naming the pipeline and the drift last."""
    report = _report()
    text = report.text()
    assert text.splitlines() == report.lines()
    assert text.splitlines()[-1].startswith("p: 2 table(s), 5 rows, 1 table(s) differ, 1 skipped")
