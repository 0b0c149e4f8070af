"""`Operations`: ids at once, progress and results recorded, failures as one line, one running
operation of a kind per pipeline; and the API's token lines."""

from __future__ import annotations

import threading

import pytest

from setl.control.operations import OperationRunning, Operations
from setl.errors import ConfigError, SetlError
from setl.observe.api import parse_tokens

pytestmark = pytest.mark.timeout(30)


def test_an_operation_records_progress_and_result() -> None:
    """A started operation is running at once; its events and result are there once it ends."""
    ops = Operations()
    gate = threading.Event()

    def work(progress):
        progress({"rows": 1})
        gate.wait(5)
        progress({"rows": 2})
        return {"equal": True}

    op = ops.start("verify", "p1", work, who="alice")
    assert op.running and ops.get(op.id) is not None
    with pytest.raises(OperationRunning, match=f"already running: operation {op.id}"):
        ops.start("verify", "p1", work)
    gate.set()
    ops.join()
    done = ops.get(op.id)
    assert done is not None and done.state == "done" and done.result == {"equal": True}
    assert [e["rows"] for e in done.events] == [1, 2] and done.to_dict()["progress"]["rows"] == 2
    assert done.who == "alice" and done.finished is not None


def test_a_failed_operation_keeps_its_one_line() -> None:
    """A SetlError in the work ends the operation failed with the error's line, not a traceback."""
    ops = Operations()

    def work(progress):
        raise SetlError("the target is away", pipeline="p1", stage="verify")

    op = ops.start("verify", "p1", work)
    ops.join()
    failed = ops.get(op.id)
    assert failed is not None and failed.state == "failed"
    assert failed.error == "pipeline=p1 stage=verify: the target is away"
    assert failed.result is None


def test_wait_change_returns_on_new_events_or_the_end() -> None:
    """`wait_change` wakes for a new event and for the end, and gives up after its timeout."""
    ops = Operations()
    step = threading.Event()

    def work(progress):
        step.wait(5)
        progress({"n": 1})
        return {}

    op = ops.start("snapshot", "p1", work)
    assert ops.wait_change(op.id, 0, 0.05).events == ()  # nothing yet: the timeout
    step.set()
    seen = ops.wait_change(op.id, 0, 5)
    assert seen is not None and (len(seen.events) == 1 or not seen.running)
    ops.join()
    assert ops.wait_change(op.id, 1, 5).state == "done"


def test_finished_operations_are_trimmed_to_keep() -> None:
    """Only the last `keep` finished operations are kept."""
    ops = Operations(keep=2)
    ids = []
    for n in range(4):
        ids.append(ops.start("reload", f"p{n}", lambda progress: {}).id)
        ops.join()
    assert [op.id for op in ops.list()][-2:] == ids[-2:] and len(ops.list()) <= 3


def test_token_lines() -> None:
    """Token lines are NAME ROLE TOKEN; a bad role or a short token is a ConfigError, and a
    token's repr never shows its secret."""
    tokens = parse_tokens("# c\nalice operator aaaaaaaaaaaaaaaa\n\nbob viewer bbbbbbbbbbbbbbbbbb; carl viewer "
                          "cccccccccccccccc", "test")
    assert [(t.name, t.role) for t in tokens] == [("alice", "operator"), ("bob", "viewer"), ("carl", "viewer")]
    assert "aaaa" not in repr(tokens[0])
    with pytest.raises(ConfigError, match="NAME ROLE TOKEN"):
        parse_tokens("alice admin aaaaaaaaaaaaaaaa", "test")
    with pytest.raises(ConfigError, match="shorter than 16"):
        parse_tokens("alice viewer short", "test")
