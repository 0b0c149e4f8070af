"""A pipeline's batch DDL tasks: declaring them, tying changes to them, and which data survives.

The meta store is the only record of a task's *status*. This module keeps in memory only what
never changes once written: which tasks were declared, for which target table, at which source
position. That index is rebuilt from the store whenever the Select opens.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from setl.meta.base import OVERWRITTEN_BY, DdlTask, DdlTaskStatus, MetaStore
from setl.model import Change, Position, RowChange

if TYPE_CHECKING:
    from setl.ddltask.signal import Signal

log = logging.getLogger("setl.ddltask")

#: Ops whose action removes rows from their slice of the target table.
CLEARING = frozenset({"truncate_table", "drop_partition", "truncate_partition", "delete_where"})

TargetOf = Callable[[str, str], "tuple[str, str] | None"]


def slice_of(task: DdlTask) -> str | None:
    """The slice of its table a task's data lies in: None for the whole table, else a normalised
    partition name (partition ops) or ``column=value`` (delete_where, none)."""
    if task.op_type == "truncate_table":
        return None
    if task.op_type in ("drop_partition", "truncate_partition", "add_range_partition"):
        return "partition " + task.op_partition.partition(":")[0].strip().lower()
    return re.sub(r"\s*=\s*", "=", task.op_partition.strip())


def covers(later: DdlTask, earlier: DdlTask | None) -> bool:
    """True if `later`'s action clears the rows of `earlier` (None: rows bound to no task)."""
    if later.op_type not in CLEARING:
        return False
    if later.op_type == "truncate_table":
        return True
    return earlier is not None and slice_of(earlier) == slice_of(later)


def action_ran(task: DdlTask) -> bool:
    """True if `task`'s action has (or may have) run on the target."""
    if task.status in (DdlTaskStatus.RUNNING, DdlTaskStatus.SUCCEEDED):
        return True
    return task.status is DdlTaskStatus.DEPRECATED and (task.reason or "").startswith(OVERWRITTEN_BY)


class DdlTasks:
    """The batch DDL tasks of one pipeline, shared by its `DdlTaskSelect` and `DdlTaskLoad`.

    * `target_of(schema, table)` maps a source table to its target table, or None if the
      pipeline does not replicate it (the pipeline's table rules).
    * A change of a target table belongs to the task named by its `task_column` value when the
      row has that column; otherwise to the task declared last for that table at or before the
      change's position (the signal's own transaction, then every later one, until the next
      declaration for the table). Changes before the first declaration belong to no task.
    * Thread-safe: the Select thread declares while load threads look up.

    Besides declarations it remembers one monotone fact: which tasks the store has shown
    settled (SUCCEEDED or DEPRECATED), so a batch need not re-read every old task of its table.
    """

    def __init__(self, meta: MetaStore, pipeline: str, *, op_system: str, target_of: TargetOf,
                 task_column: str | None = None) -> None:
        self.meta = meta
        self.pipeline = pipeline
        self.op_system = op_system
        self.target_of = target_of
        self.task_column = task_column
        self._lock = threading.Lock()
        self._by_table: dict[tuple[str, str], list[tuple[Position, str]]] = {}
        self._by_id: dict[str, DdlTask] = {}
        self._settled: set[str] = set()  # never DECLARED or RUNNING again (the states only advance)

    def refresh(self) -> None:
        """Rebuild the declaration index from the meta store."""
        tasks = self.meta.ddl_tasks(self.pipeline)
        with self._lock:
            self._by_table.clear()
            self._by_id.clear()
            for task in tasks:
                self._add(task)
                if task.status in (DdlTaskStatus.SUCCEEDED, DdlTaskStatus.DEPRECATED):
                    self._settled.add(task.task_id)

    def _add(self, task: DdlTask) -> None:
        if task.task_id in self._by_id:
            return
        self._by_id[task.task_id] = task
        entries = self._by_table.setdefault((task.op_db, task.op_table), [])
        bisect.insort(entries, (task.position, task.task_id))

    def declare(self, signal: Signal) -> DdlTask | None:
        """Declare the task of a `Signal`; None if its table is not replicated or its id is reused."""
        target = self.target_of(signal.op_db, signal.op_table)
        if target is None:
            log.warning("pipeline=%s stage=select position=%s signal for task %s names %s.%s, which "
                        "this pipeline does not replicate; ignored", self.pipeline, signal.position,
                        signal.task_id, signal.op_db, signal.op_table)
            return None
        position = Position(signal.position.log, signal.position.offset)  # GTIDs are not compared
        task = DdlTask(pipeline=self.pipeline, task_id=signal.task_id, op_type=signal.op_type,
                       op_db=target[0], op_table=target[1], position=position,
                       op_partition=signal.op_partition, op_system=self.op_system,
                       overwrite=signal.overwrite)
        stored = self.meta.declare_ddl_task(task)
        if stored.op_id != task.op_id or stored.position != task.position:
            log.warning("pipeline=%s stage=select position=%s task id %s was already declared at %s "
                        "as %s; this signal is ignored (use a new task id per run)", self.pipeline,
                        signal.position, signal.task_id, stored.position, stored.describe())
            with self._lock:
                self._add(stored)
            return None
        with self._lock:
            self._add(stored)
        return stored

    def declared_on(self, table: tuple[str, str]) -> list[tuple[Position, str]]:
        """(position, task id) of every task declared on target table `table`, in position order."""
        with self._lock:
            return list(self._by_table.get(table, ()))

    def settled(self, task_id: str) -> None:
        """Note that the store showed `task_id` SUCCEEDED or DEPRECATED: it is never claimed again."""
        with self._lock:
            self._settled.add(task_id)

    def is_settled(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._settled

    def declared(self, task_id: str) -> DdlTask | None:
        """The task as declared (its status here is stale: ask the store)."""
        with self._lock:
            return self._by_id.get(task_id)

    def declared_between(self, start: Position, end: Position) -> list[str]:
        """Ids of tasks declared after `start` and at or before `end`, in position order."""
        with self._lock:
            found = [t for t in self._by_id.values() if start < t.position <= end]
        return [t.task_id for t in sorted(found, key=lambda t: t.position)]

    def bind(self, changes: Sequence[Change]) -> Binding:
        """Which task each of `changes` belongs to (see the class docstring)."""
        with self._lock:
            index = {table: list(entries) for table, entries in self._by_table.items()}
        tasks: list[str | None] = []
        watched: list[bool] = []
        tables: set[tuple[str, str]] = set()
        first: dict[tuple[str, str], Position] = {}
        last: dict[tuple[str, str], Position] = {}
        column = self.task_column
        previous: tuple[tuple[str, str], Position | None, str | None] | None = None
        for change in changes:
            table = (change.schema, change.table or "")
            entries = index.get(table) if isinstance(change, RowChange) else None
            watched.append(entries is not None)
            if entries is None:
                tasks.append(None)
                continue
            assert isinstance(change, RowChange)
            position = change.position
            # The rows of a transaction share its position object: look each one up once.
            if previous is None or previous[0] != table or previous[1] is not position:
                tables.add(table)
                task_id = None
                if position is not None:
                    if table not in first or position < first[table]:
                        first[table] = position
                    if table not in last or position > last[table]:
                        last[table] = position
                    at = Position(position.log, position.offset)  # GTIDs are not compared
                    i = bisect.bisect_right(entries, (at, "\U0010ffff")) - 1
                    task_id = entries[i][1] if i >= 0 else None
                previous = (table, position, task_id)
            if column is not None and column in change.image:
                value = change.image[column]
                tasks.append(None if value is None else str(value))
            else:
                tasks.append(previous[2])
        return Binding(tuple(tasks), tuple(watched), frozenset(tables), first, last)


@attrs.frozen
class Binding:
    """How the changes of one batch map to tasks: per change its task id (or None) and whether
    its table has tasks at all; per such table the first and last change positions."""

    tasks: tuple[str | None, ...]
    watched: tuple[bool, ...]
    tables: frozenset[tuple[str, str]]
    first: Mapping[tuple[str, str], Position]
    last: Mapping[tuple[str, str], Position]


def latest_clearing(tasks: Iterable[DdlTask], table: tuple[str, str],
                    owner: DdlTask | None) -> DdlTask | None:
    """The latest task on `table`, other than `owner`, whose action ran and clears the rows of
    `owner` (None: rows of no task). A row of `owner` at a position before that task's must not
    be loaded: in source order that action came after the row and removed it."""
    latest = None
    for task in tasks:
        if ((task.op_db, task.op_table) == table
                and (owner is None or task.task_id != owner.task_id)
                and action_ran(task) and covers(task, owner)
                and (latest is None or task.position > latest.position)):
            latest = task
    return latest


__all__ = ["CLEARING", "Binding", "DdlTasks", "action_ran", "covers", "latest_clearing", "slice_of"]
