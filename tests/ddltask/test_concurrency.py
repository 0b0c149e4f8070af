"""The seed's bug: batches of two tasks of one table, read from the real binlog, loaded on many
threads at once and in shuffled order, into the real target. A one-slot cache keyed by table
re-runs a task's action whenever the other task came in between, wiping rows already loaded;
with the meta store deciding, each action runs once and the target ends as in source order."""

from __future__ import annotations

import random
import threading

import pytest

from setl.meta.base import DdlTaskStatus
from setl.model import Batch
from setl.testing.servers import wait_until
from tests.ddltask.rig import Rig
from tests.ddltask.test_pipeline import D19, D20, FACT_SOURCE, FACT_TARGET, expected, rows

pytestmark = pytest.mark.timeout(120)

THREADS = 8
ROUNDS = 8


def read_batches(rig: Rig) -> tuple[list[Batch], object]:
    """Every transaction since the rig's start as one extracted batch; and the stages."""
    stages = rig.stages()
    head = rig.source_head()
    stages.select.open(None)
    batches: list[Batch] = []
    start = stages.select.tell()

    def more() -> bool:
        nonlocal start
        tx = stages.select.poll(0.2)
        if tx is not None:
            batch = Batch(rig.name, len(batches) + 1, 1, start, tx.end, tx.changes)
            batches.append(stages.extract.extract(batch))
            start = tx.end
        return start is not None and start >= head

    try:
        wait_until(more, timeout=30, interval=0, message="the source's transactions")
    finally:
        stages.select.close()
    return batches, stages


def load_concurrently(stages, batches: list[Batch], seed: int) -> None:
    order = list(batches)
    random.Random(seed).shuffle(order)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not order:
                    return
                batch = order.pop()
            try:
                stages.load.load(batch)
            except BaseException as exc:
                errors.append(exc)

    stages.load.open()
    try:
        threads = [threading.Thread(target=worker, name=f"load-{n}") for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
    finally:
        stages.load.close()
    assert not errors, errors


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("case", ["two partitions", "same partition, overwrite", "same partition, no overwrite"])
def test_interleaved_batches_of_one_table_on_many_threads(tmp_path, mariadb_source, mariadb_target,
                                                          source_db, mysql_db, case, seed):
    """Two tasks' interleaved batches of one table, loaded on 8 threads shuffled, end as in source order."""
    rig = Rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, source_ddl=[FACT_SOURCE],
              target_ddl=[FACT_TARGET], task_column="job")
    a_day = D19 if case == "two partitions" else D20
    a_part = "p20261119" if case == "two partitions" else "p20261120"
    rig.execute_target("INSERT INTO fact VALUES (999, '2026-11-19', 0, NULL), (999, '2026-11-20', 0, NULL)")
    rig.execute_source(rig.signal("a", "truncate_partition", "fact", a_part))
    rig.execute_source(rig.signal("b", "truncate_partition", "fact", "p20261120", case.endswith(", overwrite")))
    for i in range(ROUNDS):
        rig.execute_source(*rows(a_day, range(10 * i, 10 * i + 3), 1, "a"))
        rig.execute_source(*rows(D20, range(100 + 10 * i, 100 + 10 * i + 3), 2, "b"))
    batches, stages = read_batches(rig)
    assert 2 * ROUNDS <= len(batches) <= 2 + 2 * ROUNDS  # signal-only transactions may be merged
    load_concurrently(stages, batches, seed)

    b_rows = expected(D20, [100 + 10 * i + k for i in range(ROUNDS) for k in range(3)], 2, "b")
    actions = rig.load.actions_run
    assert actions["b"] == 1 and actions["a"] <= 1
    a_rows = expected(a_day, [10 * i + k for i in range(ROUNDS) for k in range(3)], 1, "a")
    if case == "two partitions":
        assert rig.rows("fact") == sorted(a_rows + b_rows)
        assert actions["a"] == 1
    elif case.endswith(", overwrite"):
        # b overwrites a: a's rows are dropped wherever they fall, even after b's signal
        assert rig.rows("fact") == sorted(b_rows + [(999, D19, 0, None)])
        assert rig.statuses() == {"a": DdlTaskStatus.DEPRECATED, "b": DdlTaskStatus.SUCCEEDED}
        return
    else:
        # b's action came before every row of a and b in source order: all of them stay
        assert rig.rows("fact") == sorted(a_rows + b_rows + [(999, D19, 0, None)])
    assert rig.statuses() == {"a": DdlTaskStatus.SUCCEEDED, "b": DdlTaskStatus.SUCCEEDED}
