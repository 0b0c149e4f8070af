"""The JSON-lines change-log target: setl's connector kit contract, and its crash recovery."""

from __future__ import annotations

import pytest
from setl_jsonl_target import JsonlTargetConfig, read_log, table_rows, table_state

from setl.connectors import BuildContext, registry
from setl.testing.connectors import LoadContract, TableSpec, TargetProbe, make_batch, row


class JsonlProbe(TargetProbe):
    """A fresh log directory, through the connector the ``jsonl`` entry point registers."""

    def __init__(self, directory):
        self.directory = directory

    def make_load(self, pipeline="p"):
        connector = registry().target("jsonl")
        return connector.create(JsonlTargetConfig("jsonl", str(self.directory)), BuildContext(pipeline))

    def state(self, table):
        state = {}
        for log in sorted(self.directory.glob("*.jsonl")):
            state.update(table_state(log, table.qualified))
        return state

    def rows(self, table):
        return [row for log in sorted(self.directory.glob("*.jsonl")) for row in table_rows(log, table.qualified)]


class TestJsonlContract(LoadContract):
    """setl's Load contract suite, run against this target."""

    @pytest.fixture
    def probe(self, tmp_path):
        return JsonlProbe(tmp_path / "log")


def test_a_batch_cut_short_by_a_crash_is_dropped_on_open(tmp_path):
    """A tail without its commit line (a crash mid-batch) is cut off by the next open, and the
    replayed batch is written once."""
    probe = JsonlProbe(tmp_path)
    items = TableSpec("demo", "items")
    load = probe.make_load()
    load.open()
    load.load(make_batch([items.insert(**row(1))], id=1))
    load.close()
    second = make_batch([items.insert(**row(2)), items.update(row(1), qty=9)], id=2)
    log = tmp_path / "p.jsonl"
    with log.open("a", encoding="utf-8") as out:
        out.write('{"op": "insert", "schema": "demo", "table": "items", "key": ["id"], "before": null, '
                  '"after": {"id": 2, "name": "n", "qty": 1}}\n{"op": "upd')
    again = probe.make_load()
    again.open()
    assert again.committed() == make_batch([], id=1).end
    again.load(second)
    again.close()
    lines, last, size = read_log(log)
    assert size == log.stat().st_size and last["batch"] == 2
    assert [line["op"] for line in lines if "op" in line] == ["insert", "insert", "update"]
    assert probe.state(items) == {(1,): row(1, qty=9), (2,): row(2)}


def test_a_deposed_leaders_batch_is_refused(tmp_path):
    """A batch of an older epoch than the log's last one fails and writes nothing."""
    from setl.errors import LoadError

    probe = JsonlProbe(tmp_path)
    items = TableSpec("demo", "items")
    load = probe.make_load()
    load.open()
    load.load(make_batch([items.insert(**row(1))], id=1, epoch=3))
    with pytest.raises(LoadError, match="epoch 2 is older than epoch 3"):
        load.load(make_batch([items.insert(**row(2))], id=2, epoch=2))
    load.close()
    assert probe.state(items) == {(1,): row(1)} and load.committed_epoch() == 3


def test_snapshot_reads_are_logged_with_op_read(tmp_path):
    """A snapshot read is a line with op read and its after image; folding the log replaces the key's row."""
    probe = JsonlProbe(tmp_path)
    items = TableSpec("demo", "items")
    load = probe.make_load()
    load.open()
    load.load(make_batch([items.insert(**row(1)), items.read(**row(1, "snap", 5))], id=1))
    load.close()
    lines = [line for line in read_log(tmp_path / "p.jsonl")[0] if "op" in line]
    assert [(line["op"], line["before"], line["after"]["name"]) for line in lines] == [
        ("insert", None, "n"), ("read", None, "snap")]
    assert probe.state(items) == {(1,): row(1, "snap", 5)}
