"""Which later action clears which rows, and how rows are bound to tasks (no servers needed)."""

from __future__ import annotations

import pytest

from setl.ddltask.tasks import DdlTasks, covers, latest_clearing
from setl.meta.base import OVERWRITTEN_BY, DdlTask, DdlTaskStatus
from setl.meta.sqlite import SqliteMetaStore
from setl.model import Op, Position, RowChange

pytestmark = pytest.mark.timeout(30)


def task(task_id: str, op_type: str, partition: str = "", offset: int = 10, **fields) -> DdlTask:
    return DdlTask("p", task_id, op_type, "db", "t", Position("bin.000001", offset), op_partition=partition,
                   **fields)


@pytest.mark.parametrize("later, earlier, expected", [
    (task("b", "truncate_table"), None, True),
    (task("b", "truncate_table"), task("a", "delete_where", "day=1"), True),
    (task("b", "truncate_partition", "P1"), task("a", "add_range_partition", "p1:10"), True),
    (task("b", "drop_partition", "p1"), task("a", "truncate_partition", "p2"), False),
    (task("b", "delete_where", "day = 1"), task("a", "none", "day=1"), True),
    (task("b", "delete_where", "day=1"), task("a", "truncate_partition", "p1"), False),
    (task("b", "delete_where", "day=1"), None, False),
    (task("b", "add_range_partition", "p1:10"), task("a", "truncate_partition", "p1"), False),
    (task("b", "none", "p1"), task("a", "none", "p1"), False),
])
def test_which_actions_clear_which_rows(later, earlier, expected):
    """truncate_table clears every row; other clearing ops clear rows of the same slice only."""
    assert covers(later, earlier) is expected


def test_only_later_actions_that_ran_clear_rows():
    """The latest clearing task counts if its action ran: RUNNING, SUCCEEDED or overwritten."""
    a = task("a", "truncate_partition", "p1", 10, status=DdlTaskStatus.SUCCEEDED)
    declared = task("b", "truncate_partition", "p1", 20)
    failed = task("c", "truncate_partition", "p1", 30, status=DdlTaskStatus.DEPRECATED, reason="action failed: x")
    assert latest_clearing([a, declared, failed], ("db", "t"), a) is None
    ran = task("d", "truncate_partition", "p1", 40, status=DdlTaskStatus.DEPRECATED,
               reason=OVERWRITTEN_BY + "e")
    running = task("e", "truncate_partition", "p1", 35, status=DdlTaskStatus.RUNNING, owner="o")
    assert latest_clearing([a, declared, failed, ran, running], ("db", "t"), a).task_id == "d"
    assert latest_clearing([a, running], ("db", "other"), a) is None


def test_rows_bind_to_the_latest_declaration_at_or_before_them(tmp_path):
    """Position binding: a row belongs to the last task declared for its table at or before it."""
    meta = SqliteMetaStore(tmp_path / "meta.db")
    tasks = DdlTasks(meta, "p", op_system="mysql", target_of=lambda s, t: (s, t), task_column="job")
    for task_id, offset in (("a", 100), ("b", 300)):
        meta.declare_ddl_task(task(task_id, "none", "", offset))
    tasks.refresh()

    def row(offset: int, table: str = "t", **extra) -> RowChange:
        return RowChange(Op.INSERT, "db", table, ("id",), None, {"id": 1, **extra},
                         Position("bin.000001", offset, gtid=f"0-1-{offset}"))

    binding = tasks.bind([row(50), row(100), row(200), row(300), row(400), row(400, "u"), row(200, job="b"),
                          row(200, job=None)])
    assert binding.tasks == (None, "a", "a", "b", "b", None, "b", None)
    assert binding.watched == (True,) * 5 + (False, True, True)
    assert binding.tables == {("db", "t")}
    assert (binding.first[("db", "t")].offset, binding.last[("db", "t")].offset) == (50, 400)
    meta.close()
