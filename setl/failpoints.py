"""Failpoints: named places where a pipeline can be made to fail, stall or crash on purpose.

Tests use them, and so can an operator rehearsing a failure on a staging node. They are off
unless the environment variable ``SETL_FAULTS`` holds a JSON list of markers, for example::

    SETL_FAULTS='[{"stage": "termin", "action": "crash", "batch": 4},
                  {"stage": "load", "times": 2},
                  {"stage": "ddl_action", "action": "crash", "task": "run2"}]'

Each marker names a failpoint (`stage`), what it does there (`action`: ``fail`` raises
`InjectedFault`, ``slow`` sleeps `seconds`, ``crash`` SIGKILLs the process), which batch it
strikes (`batch`; absent: every batch), how often (`times`; default 1, null: always), and for
``ddl_action`` which task (`task`; for the ``snapshot_*`` failpoints: which table, ``schema.table``).

The failpoints (`FAILPOINTS`):

* ``select``: a transaction is polled from the source (`batch` counts transactions: for
  `ScriptedSource` its index in the log, for any other source those polled since the last
  open or seek, from 0).
* ``extract``, ``transform``: before the stage runs on a batch.
* ``load``: before a batch (or one table's part of it, per_table) is written to the target.
* ``termin``: between a batch's load (or, per_table, its `mark_loaded`) and its ack: the
  target holds the batch and the meta store does not.
* ``ddl_action``: after a batch DDL task's action ran, before its record is written.
* ``snapshot_read``: a snapshot chunk read knows its binlog position (its consistent snapshot
  began) and has not run its SELECT yet (`task`: the table).
* ``snapshot_ended``: a DDL that removed a table being copied (DROP, RENAME) is being handed on
  and its copy has ended; the DDL is not acked yet (`task`: the table).
* ``snapshot_acked``: an ack wrote snapshot progress; the copies it finished are not let go yet
  (`batch`: the batch).
* ``snapshot_boundary``: a reader claimed a keyed table's next chunk and is about to ask the server
  for its upper boundary (`task`: the table).
* ``verify_chunk``: `setl verify` (or a scheduled check) has opened a chunk's consistent snapshot on
  the source and has not run its hash query yet (`batch`: the chunks of the table so far, from 0;
  `task`: the table). Strikes in the verifying process, not in the pipeline.
* ``quarantine_kept``: a quarantined table's changes of a batch are kept on the target, in the batch's
  open transaction (`task`: the target table; docs/quarantine.md).
* ``quarantine_replay``: a replay transaction (`setl resume --table`) applied kept changes and has not
  committed (`batch`: the transaction's number from 0; `task`: the target table).
* ``loop_mark_commit``: a loader transaction under a channel's marker loop guard holds its mark row
  and its writes, its COMMIT not sent yet (`task`: the mark, ``channel:east-to-west``).
* ``loop_mark_ddl``: such a loader committed the marked transaction that names its session before a
  DDL, and has not sent the DDL yet (`task`: the mark and the DDL's verb, ``channel:east-to-west DROP``).
* ``repair_acked``: the batch holding a repair's rows (`setl repair`) is acked and its request is
  not dropped from the meta store yet (`batch`: the batch; `task`: the table). A repair read
  (before its SELECT) hits ``snapshot_read`` with its table.

No test hook is read from an environment variable of its own: the HA tests expire a node's
ZooKeeper session by cutting its connection (tests/ha/proxy.py). A crash after a batch DDL
task's action is a ``ddl_action`` marker with its `task`.

Stage wrappers (`FaultySelect`, `FaultyExtract`, `FaultyTransform`, `FaultyLoad`) put a `FaultPlan` around
stages; `setl.pipeline.chain` adds them to a pipeline when ``SETL_FAULTS`` is set.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable

import attrs

from setl.model import Batch, Position, Transaction
from setl.stages import Extract, Load, LoadWrapper, Select, SelectWrapper, Transform
from setl.stages.load import supports_per_table

log = logging.getLogger("setl.failpoints")

#: The environment variable holding the fault markers, as JSON.
FAULTS_ENV = "SETL_FAULTS"
#: Retired hook, never read: setl.ha still names it (issue 25 step 6 removes it there).

#: Every failpoint and where it strikes.
FAILPOINTS: dict[str, str] = {
    "select": "a transaction is polled from the source (batch = transactions polled since open or seek, from 0)",
    "extract": "before Extract runs on a batch",
    "transform": "before Transform runs on a batch",
    "load": "before a batch, or one table's part of it, is written to the target",
    "termin": "between a batch's load (per_table: its mark_loaded) and its ack",
    "ddl_action": "after a batch DDL task's action ran, before its record is written (task = its id)",
    "snapshot_read": "a snapshot chunk read knows its binlog position and has not run its SELECT yet (task = table)",
    "snapshot_ended": "a DDL ending a table's copy is being handed on, not acked yet (task = table)",
    "snapshot_acked": "an ack wrote snapshot progress, the copies it finished are not let go yet",
    "snapshot_boundary": "a keyed table's next snapshot chunk was claimed, its boundary not asked yet (task = table)",
    "verify_chunk": "a verify chunk's source snapshot is open, its hash not read yet (batch = chunk, task = table)",
    "loop_mark_commit": "a marker-guarded loader transaction holds its mark and rows, not committed (task = mark)",
    "loop_mark_ddl": "a marker-guarded loader committed the mark naming its session, no DDL sent (task = mark verb)",
    "repair_acked": "the batch holding a repair (setl repair) is acked, its request not dropped yet (task = table)",
    "quarantine_kept": "a quarantined table's changes of a batch are kept, not committed yet (task = table)",
    "quarantine_replay": "a replay transaction applied kept changes, not committed yet (batch = its number from 0, "
                         "task = table)",
}
ACTIONS = ("fail", "slow", "crash")


class InjectedFault(RuntimeError):
    """Raised by a ``fail`` marker."""


@attrs.define
class Fault:
    """One marker: at failpoint `stage`, for batch `batch` (None: every batch) or task `task`, do `action`.

    `action` is "fail" (raise `InjectedFault`), "slow" (sleep `seconds`) or "crash" (SIGKILL
    this process). `times` is how often it fires (None: always).
    """

    stage: str
    action: str = "fail"
    batch: int | None = None
    times: int | None = 1
    seconds: float = 0.0
    fired: int = 0
    task: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.stage not in FAILPOINTS:
            raise ValueError(f"unknown stage {self.stage!r} in fault marker (known: {', '.join(FAILPOINTS)})")
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r} in fault marker")

    def matches(self, stage: str, batch: int | None, task: str | None) -> bool:
        if self.stage != stage or (self.times is not None and self.fired >= self.times):
            return False
        if self.batch is not None and self.batch != batch:
            return False
        return self.task is None or self.task == task


class FaultPlan:
    """A set of fault markers, checked at the failpoints; thread-safe."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self.faults = list(faults)
        self._lock = threading.Lock()

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        """Markers as a JSON list of objects: ``[{"stage": "load", "batch": 3, "times": 2}]``."""
        items = json.loads(text)
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ValueError(f"{FAULTS_ENV} must be a JSON list of objects, got {text!r}")
        return cls(Fault(**item) for item in items)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def fail(self, stage: str, batch: int | None = None, times: int | None = 1) -> FaultPlan:
        self.faults.append(Fault(stage, "fail", batch, times))
        return self

    def fail_load(self, batch: int | None = None, times: int | None = 1) -> FaultPlan:
        return self.fail("load", batch, times)

    def slow(self, stage: str, seconds: float, batch: int | None = None, times: int | None = None) -> FaultPlan:
        self.faults.append(Fault(stage, "slow", batch, times, seconds))
        return self

    def crash(self, stage: str, batch: int | None = None) -> FaultPlan:
        self.faults.append(Fault(stage, "crash", batch, 1))
        return self

    def check(self, stage: str, batch: int | None = None, *, task: str | None = None) -> None:
        """Fire the markers for `stage` and `batch` (or `task`), if any are left."""
        sleep = 0.0
        with self._lock:
            for fault in self.faults:
                if not fault.matches(stage, batch, task):
                    continue
                fault.fired += 1
                if fault.action == "crash":
                    log.warning("failpoint %s: crashing at batch %s task %s", stage, batch, task)
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault.action == "fail":
                    where = f"task {task}" if task is not None else f"batch {batch}"
                    raise InjectedFault(f"injected {stage} failure at {where} (#{fault.fired})")
                sleep += fault.seconds
        if sleep:
            log.info("failpoint %s: sleeping %.1fs at batch %s", stage, sleep, batch)
            time.sleep(sleep)


def from_env(environ: dict[str, str] | None = None) -> FaultPlan:
    """The process's markers, from ``SETL_FAULTS``."""
    env = os.environ if environ is None else environ
    text = env.get(FAULTS_ENV)
    return FaultPlan.from_json(text) if text else FaultPlan()


_process_plan: tuple[str | None, FaultPlan] | None = None
_process_lock = threading.Lock()


def process_plan() -> FaultPlan:
    """The markers of this process, read from the environment (again only when it changed)."""
    global _process_plan
    key = os.environ.get(FAULTS_ENV)
    with _process_lock:
        if _process_plan is None or _process_plan[0] != key:
            _process_plan = (key, from_env())
        return _process_plan[1]


def hit(stage: str, batch: int | None = None, *, task: str | None = None) -> None:
    """Failpoint `stage` is reached: fire this process's markers for it (nothing when there are none)."""
    plan = process_plan()
    if plan:
        plan.check(stage, batch, task=task)


# --- stage wrappers -------------------------------------------------------------------------


class FaultySelect(SelectWrapper):
    """Wraps a Select: fires the plan's "select" markers when a transaction is polled, `batch`
    counting the transactions (pieces included) polled since the last `open` or `seek`, from 0.

    A ``fail`` marker raises after the transaction was read and before it is handed on, as a
    source failing mid-stream would; the scheduler rewinds to the ack and reads it again.
    """

    def __init__(self, plan: FaultPlan, inner: Select) -> None:
        super().__init__(inner)
        self.plan = plan
        self._polled = 0

    def open(self, start: Position | None) -> None:
        self._polled = 0
        self.inner.open(start)

    def seek(self, position: Position | None) -> None:
        self._polled = 0
        self.inner.seek(position)

    def poll(self, timeout: float) -> Transaction | None:
        tx = self.inner.poll(timeout)
        if tx is not None:
            index, self._polled = self._polled, self._polled + 1
            self.plan.check("select", index)
        return tx


class FaultyExtract(Extract):
    """Wraps an Extract and fires the plan's "extract" markers first."""

    def __init__(self, plan: FaultPlan, inner: Extract | None = None) -> None:
        self.plan, self.inner = plan, inner or Extract()

    def extract(self, batch: Batch) -> Batch:
        self.plan.check("extract", batch.id)
        return self.inner.extract(batch)


class FaultyTransform(Transform):
    """Wraps a Transform and fires the plan's "transform" markers first."""

    def __init__(self, plan: FaultPlan, inner: Transform | None = None) -> None:
        self.plan, self.inner = plan, inner or Transform()

    def transform(self, batch: Batch) -> Batch:
        self.plan.check("transform", batch.id)
        return self.inner.transform(batch)


class FaultyLoad(LoadWrapper):
    """Wraps a Load: fires "load" markers before it and "termin" markers after it.

    A "termin" marker therefore strikes between a batch's load and its ack. Constructing
    one around a Load that can load per table gives a `FaultyPartLoad`, which can too; around
    one that cannot, the wrapper cannot either (the start-up check refuses ``per_table``).
    """

    def __new__(cls, plan: FaultPlan, inner: Load) -> FaultyLoad:
        chosen = FaultyPartLoad if cls is FaultyLoad and supports_per_table(inner) else cls
        return super().__new__(chosen)

    def __init__(self, plan: FaultPlan, inner: Load) -> None:
        super().__init__(inner)
        self.plan = plan

    def load(self, batch: Batch) -> None:
        self.plan.check("load", batch.id)
        self.inner.load(batch)
        self.plan.check("termin", batch.id)


class FaultyPartLoad(FaultyLoad):
    """A `FaultyLoad` over a Load that can load per table: "termin" strikes after `mark_loaded`."""

    parts = True

    def load_part(self, batch: Batch) -> None:
        self.plan.check("load", batch.id)
        self.inner.load_part(batch)

    def mark_loaded(self, batch: Batch) -> None:
        self.inner.mark_loaded(batch)
        self.plan.check("termin", batch.id)


__all__ = [
    "ACTIONS", "FAILPOINTS", "FAULTS_ENV", "Fault", "FaultPlan",
    "FaultyExtract", "FaultyLoad", "FaultyPartLoad", "FaultySelect", "FaultyTransform", "InjectedFault", "from_env",
    "hit", "process_plan",
]
