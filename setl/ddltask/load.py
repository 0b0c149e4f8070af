"""The Load wrapper of batch DDL tasks: run each task's pre-write action once, then load only the
data of tasks that survive (docs/batch-ddl-tasks.md has the state machine)."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping

from setl import failpoints
from setl.ddltask.actions import Actions
from setl.ddltask.tasks import Binding, DdlTasks, latest_clearing
from setl.errors import LoadError, MetaStoreError, SetlError, TransientLoadError
from setl.meta.base import DdlTask, DdlTaskStatus
from setl.model import Batch, Change, Position, RowChange
from setl.stages.load import Load, LoadWrapper

log = logging.getLogger("setl.ddltask")

#: The reason a task whose action failed carries, followed by the error.
ACTION_FAILED = "action failed: "


class DdlTaskLoad(LoadWrapper):
    """Wraps the pipeline's Load (see the module docstring).

    For each call, which may come from any thread and concurrently with other calls:

    1. The batch's tasks are its changes' tasks plus the tasks declared inside its position
       range (a task without data still clears its slice). Calls touching a table that has tasks
       are serialised per target table in this process (locks taken in sorted order), so an
       action never runs while rows of its table are being loaded here.
    2. Each task, in position order, is settled through the meta store: DECLARED → claim; the
       winner runs the action, then records SUCCEEDED. A RUNNING task seen while holding its
       table's lock has no live owner in this process (and the mainstem says no other node
       writes), so it is taken over and its action redone. A task whose slice a later task
       already cleared (loads out of source order) succeeds without running its action.
    3. Changes are kept unless their task is DEPRECATED, or a later task's action already
       cleared their slice (a replay, or out-of-order loads); dropped changes are counted in
       `dropped` and logged.
    4. The filtered batch goes to the wrapped Load, with the same id, epoch and positions.

    An action the target refuses deprecates its task and raises `LoadError` naming the task, the
    op and the target, which fails the batch through Termin; the replay then drops the task's
    data. An action that cannot reach the target (`TransientLoadError` after in-place retries)
    leaves the task claimed: the replay takes it over and redoes the action.
    """

    def __init__(self, inner: Load, tasks: DdlTasks, actions: Actions, *, node_id: str = "node") -> None:
        super().__init__(inner)
        self.tasks = tasks
        self.actions = actions
        self.pipeline = tasks.pipeline
        self._owner_prefix = f"{node_id}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._locks: dict[tuple[str, str], threading.RLock] = collections.defaultdict(threading.RLock)
        self._locks_guard = threading.Lock()
        self._count_lock = threading.Lock()
        #: Changes dropped per task id (None: changes of no task cleared by a later truncate).
        self.dropped: collections.Counter[str | None] = collections.Counter()
        #: Actions this process ran, per task id.
        self.actions_run: collections.Counter[str] = collections.Counter()

    # -- the Load contract

    def close_own(self) -> None:
        self.actions.close()

    def load(self, batch: Batch) -> None:
        self._apply(batch, self.inner.load)

    def mark_loaded(self, batch: Batch) -> None:
        """Per_table: settle the batch's tasks that no part touched (tasks without data), then
        let the wrapped Load record the batch."""
        self._apply(batch.replace(()), lambda _: None)
        self.inner.mark_loaded(batch)

    def _apply(self, batch: Batch, write: Callable[[Batch], None]) -> None:
        declared_here = self.tasks.declared_between(batch.start, batch.end)
        binding = self.tasks.bind(batch.changes)
        tables = set(binding.tables)
        for task_id in {*declared_here, *(t for t in binding.tasks if t is not None)}:
            task = self.tasks.declared(task_id)
            if task is not None:  # else `_settle` refuses the batch
                tables.add((task.op_db, task.op_table))
        if not tables:
            write(batch)
            return
        with self._table_locks(sorted(tables)):
            write(self._settle(batch, declared_here, binding))

    # -- settling tasks and filtering data

    def _settle(self, batch: Batch, declared_here: list[str], binding: Binding) -> Batch:
        bound, first, last = binding.tasks, binding.first, binding.last
        wanted = dict.fromkeys(declared_here)
        wanted.update(dict.fromkeys(t for t in bound if t is not None))
        stored = self._read(self._relevant(wanted, first, last))
        for task_id in wanted:
            if task_id not in stored:
                raise LoadError(f"rows name task {task_id}, which no signal row declared",
                                **self._context(batch))
        # Every unsettled task declared on a table before a row of it comes first in source
        # order: its action must precede the row even when batches load out of order.
        for task in stored.values():
            table = (task.op_db, task.op_table)
            if (task.status in (DdlTaskStatus.DECLARED, DdlTaskStatus.RUNNING) and table in last
                    and task.position <= last[table]):
                wanted[task.task_id] = None
        order = sorted(wanted, key=lambda t: (stored[t].position, t))
        for task_id in order:
            if stored[task_id].status in (DdlTaskStatus.DECLARED, DdlTaskStatus.RUNNING):
                self._settle_task(task_id, batch)
        if not batch.changes:
            return batch
        if order:
            stored = self._read(stored)
        keep: list[Change] = []
        dropped: collections.Counter[tuple[str | None, str]] = collections.Counter()
        clearing: dict[tuple[str, str, str | None], DdlTask | None] = {}
        previous: tuple[tuple[str, str], str | None, Position | None, str | None] | None = None
        for change, bound_id, watched in zip(batch.changes, bound, binding.watched):
            if not watched:
                keep.append(change)
                continue
            assert isinstance(change, RowChange)  # Binding watches row changes only
            row_table = (change.schema, change.table)
            # The rows of a transaction share its position object: decide once for them.
            if (previous is None or previous[0] != row_table or previous[1] != bound_id
                    or previous[2] is not change.position):
                previous = (row_table, bound_id, change.position,
                            self._why_dropped(stored, clearing, row_table, bound_id, change.position))
            why = previous[3]
            if why is None:
                keep.append(change)
            else:
                dropped[(bound_id, why)] += 1
        for (dropped_id, why), count in dropped.items():
            log.warning("pipeline=%s stage=load batch=%d dropped %d changes of %s (%s)", self.pipeline,
                        batch.id, count, f"task {dropped_id}" if dropped_id else "no task", why)
            with self._count_lock:
                self.dropped[dropped_id] += count
        return batch.replace(tuple(keep)) if len(keep) != len(batch.changes) else batch

    @staticmethod
    def _why_dropped(stored: dict[str, DdlTask], clearing: dict[tuple[str, str, str | None], DdlTask | None],
                     table: tuple[str, str], task_id: str | None, position: Position | None) -> str | None:
        """Why a change of `table` bound to `task_id` at `position` must not be loaded, or None."""
        task = stored.get(task_id) if task_id is not None else None
        if task is not None and task.status is DdlTaskStatus.DEPRECATED:
            return f"deprecated: {task.reason}"
        key = (*table, task_id)
        if key not in clearing:
            clearing[key] = latest_clearing(stored.values(), table, task)
        later = clearing[key]
        if later is not None and position is not None and later.position > position:
            return f"cleared by the later {later.describe()}"
        return None

    def _settle_task(self, task_id: str, batch: Batch) -> None:
        """Bring a task to SUCCEEDED or DEPRECATED, running its action if this call wins it."""
        meta = self.tasks.meta
        for _ in range(10):  # each round is lost only to a concurrent change of the task
            task = self._stored(task_id)
            assert task is not None
            if task.status in (DdlTaskStatus.SUCCEEDED, DdlTaskStatus.DEPRECATED):
                return
            owner = f"{self._owner_prefix}/{uuid.uuid4().hex[:8]}"
            if task.status is DdlTaskStatus.RUNNING:
                log.warning("pipeline=%s stage=load batch=%d %s was claimed by %s, which did not record "
                            "its outcome; taking it over and redoing its action", self.pipeline,
                            batch.id, task.describe(), task.owner)
                claim = meta.claim_ddl_task(self.pipeline, task_id, owner, expected_owner=task.owner)
            else:
                claim = meta.claim_ddl_task(self.pipeline, task_id, owner)
            if not claim.won:
                continue
            self._run(claim.task, owner, batch)
            return
        raise MetaStoreError(f"task {task_id} kept changing while being settled", **self._context(batch))

    def _run(self, task: DdlTask, owner: str, batch: Batch) -> None:
        meta = self.tasks.meta
        table = (task.op_db, task.op_table)
        after = [t for position, t in self.tasks.declared_on(table) if position > task.position]
        later = latest_clearing(self._read(after).values(), table, task)
        if later is not None and later.position > task.position:
            # In source order this action came first and the later one cleared the slice again:
            # skipping it is the same, and running it now would clear the later task's rows.
            final = meta.finish_ddl_task(self.pipeline, task.task_id, owner, DdlTaskStatus.SUCCEEDED)
            log.warning("pipeline=%s stage=load batch=%d %s arrived after the later %s had cleared its "
                        "slice; its action is skipped (task now %s)", self.pipeline, batch.id,
                        task.describe(), later.describe(), final.status.value)
            return
        try:
            self.actions.run(task)
        except TransientLoadError as exc:
            # The target could not be reached: the task stays claimed, and the retry of the
            # batch takes the claim over and redoes the action, as after a crash.
            raise TransientLoadError(f"{task.describe()}: pre-write action could not complete on target "
                                     f"{task.target}: {exc.message}; the retry redoes it",
                                     **self._context(batch, task.target)) from exc
        except Exception as exc:
            detail = exc.message if isinstance(exc, SetlError) else f"{type(exc).__name__}: {exc}"
            meta.finish_ddl_task(self.pipeline, task.task_id, owner, DdlTaskStatus.DEPRECATED,
                                 ACTION_FAILED + detail)
            raise LoadError(f"{task.describe()}: pre-write action failed on target {task.target}: {detail}; "
                            f"the task is deprecated and its data will be dropped",
                            **self._context(batch, task.target)) from exc
        with self._count_lock:
            self.actions_run[task.task_id] += 1
        failpoints.hit("ddl_action", batch.id, task=task.task_id)
        final = meta.finish_ddl_task(self.pipeline, task.task_id, owner, DdlTaskStatus.SUCCEEDED)
        if final.status is DdlTaskStatus.SUCCEEDED:
            log.info("pipeline=%s stage=load batch=%d %s: action done", self.pipeline, batch.id,
                     task.describe())
        else:
            log.warning("pipeline=%s stage=load batch=%d %s: action done, but the task is now %s (%s)",
                        self.pipeline, batch.id, task.describe(), final.status.value, final.reason)

    # -- helpers

    def _stored(self, task_id: str) -> DdlTask | None:
        task = self.tasks.meta.ddl_task(self.pipeline, task_id)
        if task is not None and task.status in (DdlTaskStatus.SUCCEEDED, DdlTaskStatus.DEPRECATED):
            self.tasks.settled(task_id)
        return task

    def _read(self, task_ids: Iterable[str]) -> dict[str, DdlTask]:
        """The stored tasks of `task_ids` (unknown ids left out), read now."""
        found = {task_id: self._stored(task_id) for task_id in task_ids}
        return {task_id: task for task_id, task in found.items() if task is not None}

    def _relevant(self, wanted: Iterable[str], first: Mapping[tuple[str, str], Position],
                  last: Mapping[tuple[str, str], Position]) -> list[str]:
        """Ids of the tasks whose status decides a batch: `wanted`, and per table with rows from
        `first` to `last`, every task declared after `first` (it may clear rows) and every
        earlier task not yet seen settled (its action may have to come first)."""
        ids = dict.fromkeys(wanted)
        for table, start in first.items():
            for position, task_id in self.tasks.declared_on(table):
                if position > start or (position <= last[table] and not self.tasks.is_settled(task_id)):
                    ids[task_id] = None
        return list(ids)

    @contextlib.contextmanager
    def _table_locks(self, tables: list[tuple[str, str]]) -> Iterator[None]:
        with self._locks_guard:
            locks = [self._locks[t] for t in tables]
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    def _context(self, batch: Batch, table: str | None = None) -> dict[str, object]:
        return {"pipeline": self.pipeline, "stage": "load", "table": table, "batch": batch.id,
                "position": batch.start}


class DdlTaskPartLoad(DdlTaskLoad):
    """A `DdlTaskLoad` over a Load that can load per table (`pipeline.load.mode: per_table`).

    A part is settled like a batch: its table's tasks, and every task declared inside the
    batch's positions, whatever its table (parts of other tables wait on those tables' locks).
    """

    parts = True

    def load_part(self, batch: Batch) -> None:
        self._apply(batch, self.inner.load_part)


__all__ = ["DdlTaskLoad", "DdlTaskPartLoad", "ACTION_FAILED"]
