"""Long actions (verify, snapshot, reload) run as operations: each gets an id at once, runs on a
thread of its own, and records its progress events and its result, which the HTTP control API
serves (`GET /api/v1/operations/ID`, and ``/events`` as JSON lines while it runs).

`Operations` is the one owner of every operation's state; the threads only call its transitions
(`_progress`, `_finish`). A node keeps the last `keep` finished operations in memory: they do not
survive the node (the results that matter, a verify report, are also in the meta store).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from setl.errors import SetlError

log = logging.getLogger("setl.control")

#: The work of an operation: called with a `progress(event)` callback, returns the result.
Work = Callable[[Callable[[dict[str, Any]], None]], dict[str, Any]]


@attrs.frozen
class Operation:
    """One operation as it stands: `state` is ``running``, ``done`` or ``failed`` (then `error`
    is the one line that says why)."""

    id: str
    kind: str
    pipeline: str | None
    state: str
    started: float
    finished: float | None = None
    events: tuple[dict[str, Any], ...] = ()
    result: dict[str, Any] | None = None
    error: str | None = None
    who: str | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"

    def to_dict(self, events: bool = True) -> dict[str, Any]:
        found: dict[str, Any] = {"id": self.id, "kind": self.kind, "pipeline": self.pipeline, "state": self.state,
                 "started": round(self.started, 3),
                 "finished": round(self.finished, 3) if self.finished is not None else None,
                 "progress": self.events[-1] if self.events else None, "result": self.result, "error": self.error,
                 "who": self.who}
        if events:
            found["events"] = list(self.events)
        return found


class Operations:
    """The operations of one node: `start` runs one, `get` reads it, `wait_change` blocks until it
    records something new (for a stream). At most one operation of a kind runs per pipeline:
    another `start` is refused naming the running one."""

    def __init__(self, keep: int = 200, clock: Callable[[], float] = time.time, max_events: int = 1000) -> None:
        self.keep = keep
        self.max_events = max_events
        self.clock = clock
        self._ops: OrderedDict[str, Operation] = OrderedDict()
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []

    def start(self, kind: str, pipeline: str | None, work: Work, who: str | None = None) -> Operation:
        with self._changed:
            for op in self._ops.values():
                if op.running and op.kind == kind and op.pipeline == pipeline:
                    raise OperationRunning(op)
            op = Operation(uuid.uuid4().hex[:16], kind, pipeline, "running", self.clock(), who=who)
            self._ops[op.id] = op
            self._trim()
        thread = threading.Thread(target=self._run, args=(op.id, work), name=f"setl-op-{kind}-{op.id[:6]}",
                                  daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return op

    def get(self, op_id: str) -> Operation | None:
        with self._changed:
            return self._ops.get(op_id)

    def list(self) -> list[Operation]:
        with self._changed:
            return list(self._ops.values())

    def wait_change(self, op_id: str, seen: int, timeout: float) -> Operation | None:
        """The operation once it has more than `seen` events or has finished, or as it is after `timeout`."""
        with self._changed:
            self._changed.wait_for(lambda: (op := self._ops.get(op_id)) is None or not op.running
                                   or len(op.events) > seen, timeout)
            return self._ops.get(op_id)

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the running operations' threads (a stopping node)."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, op_id: str, work: Work) -> None:
        try:
            result = work(lambda event: self._progress(op_id, event))
        except SetlError as exc:
            self._finish(op_id, None, str(exc))
        except Exception as exc:  # one failed operation never takes the node down
            log.exception("operation %s failed", op_id)
            self._finish(op_id, None, f"{type(exc).__name__}: {exc}")
        else:
            self._finish(op_id, result, None)

    def _progress(self, op_id: str, event: dict[str, Any]) -> None:
        with self._changed:
            op = self._ops[op_id]
            events = (*op.events, {"time": round(self.clock(), 3), **event})[-self.max_events:]
            self._ops[op_id] = attrs.evolve(op, events=events)
            self._changed.notify_all()

    def _finish(self, op_id: str, result: dict[str, Any] | None, error: str | None) -> None:
        with self._changed:
            op = self._ops[op_id]
            self._ops[op_id] = attrs.evolve(op, state="failed" if error is not None else "done",
                                            finished=self.clock(), result=result, error=error)
            self._changed.notify_all()

    def _trim(self) -> None:
        finished = [op_id for op_id, op in self._ops.items() if not op.running]
        for op_id in finished[:max(0, len(self._ops) - self.keep)]:
            del self._ops[op_id]


class OperationRunning(SetlError):
    """An operation of the same kind already runs for the pipeline."""

    def __init__(self, op: Operation) -> None:
        super().__init__(f"a {op.kind} of {op.pipeline} is already running: operation {op.id}",
                         pipeline=op.pipeline)
        self.op = op
