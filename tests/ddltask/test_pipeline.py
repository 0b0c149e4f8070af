"""Batch DDL tasks end to end: real MariaDB source and target, the binlog source, the scheduler
(in both load modes, ordered and per_table), and `setl start` killed with -9."""

from __future__ import annotations

import datetime
import json
import re

import pytest

from setl.ddltask import ACTION_FAILED
from setl.meta.base import OVERWRITTEN_BY, DdlTaskStatus
from setl.scheduler import Listener, Outcome
from tests.ddltask.rig import Rig

pytestmark = pytest.mark.timeout(120)

D19, D20, D21 = (datetime.date(2026, 11, d) for d in (19, 20, 21))
FACT_COLUMNS = "id INT NOT NULL, day DATE NOT NULL, v INT, job VARCHAR(32), PRIMARY KEY (id, day)"
FACT_SOURCE = f"CREATE TABLE fact ({FACT_COLUMNS})"
FACT_TARGET = (
    f"CREATE TABLE fact ({FACT_COLUMNS}) PARTITION BY RANGE COLUMNS (day) ("
    " PARTITION p20261119 VALUES LESS THAN ('2026-11-20'),"
    " PARTITION p20261120 VALUES LESS THAN ('2026-11-21'),"
    " PARTITION p20261121 VALUES LESS THAN ('2026-11-22'))"
)

#: the process SIGKILLs itself after task run2's action, before its record (the ddl_action failpoint)
CRASH_AFTER_RUN2 = {"SETL_FAULTS": json.dumps([{"stage": "ddl_action", "action": "crash", "task": "run2"}])}


def rows(day: datetime.date, ids, v: int, job: str | None = None) -> list[tuple]:
    """Upserts of fact rows (one statement each), for one source transaction."""
    return [("INSERT INTO fact VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE v = VALUES(v), job = VALUES(job)",
             (i, day, v, job)) for i in ids]


def expected(day: datetime.date, ids, v: int, job: str | None = None) -> list[tuple]:
    return [(i, day, v, job) for i in ids]


@pytest.fixture(params=["ordered", "per_table"])
def load_mode(request) -> str:
    """`pipeline.load.mode`, for the tests that run the scheduler in-process."""
    return request.param


@pytest.fixture
def make_rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    made: list[Rig] = []

    def make(**options) -> Rig:
        made.append(Rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db,
                        source_ddl=[FACT_SOURCE], target_ddl=[FACT_TARGET], **options))
        return made[-1]

    yield make
    for rig in made:
        rig.close()


class Rollbacks(Listener):
    def __init__(self) -> None:
        self.errors: list[str] = []

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        self.errors.append(str(error))


def test_rerun_with_overwrite_replaces_the_partition(make_rig, load_mode):
    """A reload re-run with overwrite leaves only the re-run's rows in its partition; each action ran once."""
    rig = make_rig(load_mode=load_mode)
    rig.execute_target("INSERT INTO fact VALUES (99, '2026-11-20', 0, 'old'), (1, '2026-11-19', 7, 'keep')")
    rig.execute_source(rig.signal("run1", "truncate_partition", "fact", "p20261120", True))
    rig.execute_source(*rows(D20, range(1, 6), 1))
    rig.execute_source(*rows(D20, range(6, 11), 1))
    rig.execute_source(rig.signal("run2", "truncate_partition", "fact", "p20261120", True),
                       *rows(D20, range(1, 4), 2))
    rig.execute_source(*rows(D20, range(4, 8), 2))
    rig.run()
    assert rig.rows("fact") == sorted([(1, D19, 7, "keep")] + expected(D20, range(1, 8), 2))
    assert rig.statuses() == {"run1": DdlTaskStatus.DEPRECATED, "run2": DdlTaskStatus.SUCCEEDED}
    assert rig.meta.ddl_task(rig.name, "run1").reason == OVERWRITTEN_BY + "run2"
    assert rig.load.actions_run == {"run1": 1, "run2": 1}


def test_rerun_with_overwrite_drops_the_first_run_s_rows_still_in_flight(make_rig, caplog, load_mode):
    """An overwritten run's rows still arriving are dropped, counted and logged; only the re-run's rows load."""
    caplog.set_level("WARNING", logger="setl.ddltask")
    rig = make_rig(task_column="job", load_mode=load_mode)
    rig.execute_source(rig.signal("run1", "truncate_partition", "fact", "p20261120", True),
                       *rows(D20, range(1, 6), 1, "run1"))
    rig.execute_source(rig.signal("run2", "truncate_partition", "fact", "p20261120", True))
    for late, new in ((range(6, 9), range(1, 3)), (range(9, 11), range(3, 5)), (range(11, 13), range(5, 6))):
        rig.execute_source(*rows(D20, late, 1, "run1"))
        rig.execute_source(*rows(D20, new, 2, "run2"))
    rig.run()
    assert rig.rows("fact") == expected(D20, range(1, 6), 2, "run2")
    assert rig.statuses() == {"run1": DdlTaskStatus.DEPRECATED, "run2": DdlTaskStatus.SUCCEEDED}
    assert rig.load.dropped["run1"] >= 7  # rows 6..12 at least; 1..5 too if they shared run2's batch
    logged = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert logged and all("changes of task run1 (deprecated: overwritten by task run2)" in m for m in logged)
    assert sum(int(m.split(" dropped ")[1].split()[0]) for m in logged) == rig.load.dropped["run1"]
    assert rig.load.actions_run == {"run1": 1, "run2": 1}


def test_runs_without_overwrite_of_one_table(make_rig, load_mode):
    """overwrite=false deprecates nothing; each run's action still clears its slice, even with no rows."""
    rig = make_rig(load_mode=load_mode)
    rig.execute_target("INSERT INTO fact VALUES (50, '2026-11-21', 0, 'old'), (51, '2026-11-21', 0, 'old')")
    rig.execute_source(rig.signal("app1", "none", "fact", "p20261120"), *rows(D20, range(1, 4), 1))
    rig.execute_source(rig.signal("app2", "none", "fact", "p20261120"), *rows(D20, range(4, 7), 1))
    rig.execute_source(rig.signal("reload1", "truncate_partition", "fact", "p20261119"),
                       *rows(D19, range(10, 13), 3))
    rig.execute_source(rig.signal("reload2", "truncate_partition", "fact", "p20261119"))
    rig.execute_source(*rows(D19, range(10, 12), 4))
    rig.execute_source(rig.signal("empty", "truncate_partition", "fact", "p20261121"))
    rig.run()
    assert rig.rows("fact") == sorted(expected(D20, range(1, 7), 1) + expected(D19, range(10, 12), 4))
    assert set(rig.statuses().values()) == {DdlTaskStatus.SUCCEEDED}
    assert rig.load.actions_run == {t: 1 for t in ("app1", "app2", "reload1", "reload2", "empty")}


def test_different_partitions_interleaved(make_rig, load_mode):
    """Interleaved jobs on three partitions, one re-run meanwhile: each keeps its surviving run's rows."""
    rig = make_rig(task_column="job", max_rows=3, load_mode=load_mode)
    rig.execute_source(rig.signal("d19", "truncate_partition", "fact", "p20261119", True),
                       rig.signal("d21", "delete_where", "fact", "day=2026-11-21", True))
    rig.execute_source(rig.signal("d20a", "truncate_partition", "fact", "p20261120", True))
    for i in range(6):
        rig.execute_source(*rows(D19, [i], 19, "d19"), *rows(D21, [i], 21, "d21"))
        rig.execute_source(*rows(D20, [i, i + 10], 1, "d20a"))
        if i == 2:
            rig.execute_source(rig.signal("d20b", "truncate_partition", "fact", "p20261120", True))
        if i >= 2:
            rig.execute_source(*rows(D20, [i + 100], 2, "d20b"))
    rig.run()
    assert rig.rows("fact") == sorted(expected(D19, range(6), 19, "d19") + expected(D21, range(6), 21, "d21")
                                      + expected(D20, range(102, 106), 2, "d20b"))
    assert rig.statuses() == {"d19": DdlTaskStatus.SUCCEEDED, "d21": DdlTaskStatus.SUCCEEDED,
                              "d20a": DdlTaskStatus.DEPRECATED, "d20b": DdlTaskStatus.SUCCEEDED}
    assert rig.load.actions_run == {"d19": 1, "d21": 1, "d20a": 1, "d20b": 1}


def test_a_failing_action_deprecates_its_task_and_rolls_the_batch_back(make_rig, load_mode):
    """A refused action deprecates its task and rolls back naming task, op and target; its rows are dropped."""
    rig = make_rig(retry_attempts=3, load_mode=load_mode)
    rig.execute_source(rig.signal("bad", "truncate_partition", "fact", "p_missing"), *rows(D20, range(1, 4), 1))
    rig.execute_source(*rows(D20, range(4, 6), 1))
    rig.execute_source(rig.signal("good", "truncate_partition", "fact", "p20261121"), *rows(D21, range(1, 3), 5))
    listener = Rollbacks()
    rig.run(listener=listener)
    assert len(listener.errors) == 1
    message = listener.errors[0]
    assert "task bad (truncate_partition on" in message and f"{rig.target_db}.fact" in message
    assert "pre-write action failed" in message and "stage=load" in message
    task = rig.meta.ddl_task(rig.name, "bad")
    assert task.status is DdlTaskStatus.DEPRECATED and task.reason.startswith(ACTION_FAILED)
    assert rig.rows("fact") == expected(D21, range(1, 3), 5)
    assert rig.load.dropped["bad"] == 5


def test_kill_9_between_action_and_record_redoes_the_action_once(make_rig):
    """`setl start` killed between action and record: the restart takes the claim over, redoes it, loads."""
    rig = make_rig()
    rig.execute_source(rig.signal("run1", "truncate_partition", "fact", "p20261120", True),
                       *rows(D20, range(1, 6), 1))
    rig.execute_source(rig.signal("run2", "truncate_partition", "fact", "p20261120", True))
    rig.execute_source(*rows(D20, range(1, 4), 2))
    proc = rig.start_process(CRASH_AFTER_RUN2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, err
    task = rig.meta.ddl_task(rig.name, "run2")
    assert task.status is DdlTaskStatus.RUNNING and task.owner
    assert rig.statuses()["run1"] is DdlTaskStatus.DEPRECATED
    assert rig.rows("fact") == []  # the action ran (run1's rows are gone); run2's rows wait for the record
    proc = rig.start_process()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "taking it over and redoing its action" in err
    assert rig.rows("fact") == expected(D20, range(1, 4), 2)
    assert rig.statuses() == {"run1": DdlTaskStatus.DEPRECATED, "run2": DdlTaskStatus.SUCCEEDED}


def test_the_worked_example_of_the_docs(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """docs/batch-ddl-tasks.md's daily reload: after the re-run the partition holds run 2's rows."""
    columns = "order_id BIGINT NOT NULL, day DATE NOT NULL, amount DECIMAL(12,2), PRIMARY KEY (order_id, day)"
    rig = Rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db,
              source_ddl=[f"CREATE TABLE orders_daily ({columns})"],
              target_ddl=[f"CREATE TABLE orders_daily ({columns}) PARTITION BY RANGE COLUMNS (day) ("
                          " PARTITION p20261119 VALUES LESS THAN ('2026-11-20'),"
                          " PARTITION p20261120 VALUES LESS THAN ('2026-11-21'),"
                          " PARTITION p20261121 VALUES LESS THAN ('2026-11-22'))"])
    rig.execute_target("INSERT INTO orders_daily VALUES (9, '2026-11-19', 90.00)")
    run1, run2 = "orders_daily/2026-11-20/run1", "orders_daily/2026-11-20/run2"
    rig.execute_source(rig.signal(run1, "truncate_partition", "orders_daily", "p20261120", True),
                       "INSERT INTO orders_daily VALUES (1, '2026-11-20', 10.00), (2, '2026-11-20', 20.00),"
                       " (3, '2026-11-20', 30.00)")
    rig.execute_source(rig.signal(run2, "truncate_partition", "orders_daily", "p20261120", True),
                       "DELETE FROM orders_daily WHERE day = '2026-11-20'",
                       "INSERT INTO orders_daily VALUES (1, '2026-11-20', 11.00), (4, '2026-11-20', 40.00)")
    rig.run()
    assert [(o, d, str(a)) for o, d, a in rig.rows("orders_daily")] == [
        (1, D20, "11.00"), (4, D20, "40.00"), (9, D19, "90.00")]
    assert rig.statuses() == {run1: DdlTaskStatus.DEPRECATED, run2: DdlTaskStatus.SUCCEEDED}


def test_rollbacks_after_loads_never_rerun_actions_nor_revive_deprecated_rows(make_rig, monkeypatch, load_mode):
    """Replays after failures between load and ack run no action twice and revive no overwritten rows."""
    monkeypatch.setenv("SETL_FAULTS", json.dumps([{"stage": "termin", "times": 6}]))
    rig = make_rig(retry_attempts=10, load_mode=load_mode)
    rig.execute_source(rig.signal("run1", "truncate_partition", "fact", "p20261120", True))
    rig.execute_source(*rows(D20, range(1, 6), 1))
    rig.execute_source(rig.signal("run2", "truncate_partition", "fact", "p20261120", True))
    rig.execute_source(*rows(D20, range(1, 4), 2))
    rig.execute_source(*rows(D20, range(4, 6), 2))
    listener = Rollbacks()
    rig.run(listener=listener)
    # A batch the target committed is acked at its position after the failure, not loaded again:
    # one failure per batch (3 or more: a big transaction may come in pieces), each after the
    # batch's action ran and its rows landed.
    failed = [re.search(r"injected termin failure at batch (\d+)", e) for e in listener.errors]
    assert all(failed) and len(failed) >= 3
    assert len({m.group(1) for m in failed if m}) == len(failed)
    assert rig.rows("fact") == expected(D20, range(1, 6), 2)
    assert rig.load.actions_run == {"run1": 1, "run2": 1}
    assert rig.statuses() == {"run1": DdlTaskStatus.DEPRECATED, "run2": DdlTaskStatus.SUCCEEDED}


def test_failover_after_a_kill_9_between_action_and_record(make_rig, zookeeper_server):
    """HA: node a killed between action and record; node b takes the pipeline and the claim over."""
    rig = make_rig(zookeeper=zookeeper_server.hosts)
    rig.execute_source(rig.signal("run1", "truncate_partition", "fact", "p20261120", True),
                       *rows(D20, range(1, 6), 1))
    rig.execute_source(rig.signal("run2", "truncate_partition", "fact", "p20261120", True),
                       *rows(D20, range(1, 4), 2))
    node_a = rig.start_process(CRASH_AFTER_RUN2, node="a")
    out, err = node_a.communicate(timeout=60)
    assert node_a.returncode == -9, err
    claimed = rig.meta.ddl_task(rig.name, "run2")
    assert claimed.status is DdlTaskStatus.RUNNING and claimed.owner.startswith("a/")
    node_b = rig.start_process(node="b")
    out, err = node_b.communicate(timeout=60)
    assert node_b.returncode == 0, err
    assert "taking it over and redoing its action" in err
    assert rig.rows("fact") == expected(D20, range(1, 4), 2)
    assert rig.statuses() == {"run1": DdlTaskStatus.DEPRECATED, "run2": DdlTaskStatus.SUCCEEDED}


def test_a_row_naming_an_undeclared_task_pauses_the_pipeline(make_rig):
    """With a task column, a row naming a task no signal declared fails its batch, then pauses."""
    rig = make_rig(task_column="job", retry_attempts=2, max_rows=1)
    rig.execute_source(rig.signal("run1", "none", "fact", "p20261120"), *rows(D20, [1], 1, "run1"))
    rig.execute_source(*rows(D20, [2], 1, "ghost"))
    scheduler = rig.run(expect=Outcome.PAUSED)
    assert "rows name task ghost, which no signal row declared" in str(scheduler.error)
    assert "stage=load" in str(scheduler.error)
    assert rig.rows("fact") == expected(D20, [1], 1, "run1")


def test_an_unreachable_target_leaves_the_task_claimed_for_the_retry(make_rig):
    """An unreachable target leaves the task claimed; the next load takes it over and loads the rows."""
    from setl.ddltask import MysqlActions
    from setl.errors import TransientLoadError
    from setl.model import Batch
    from setl.sinks.mysql import MysqlTargetConfig
    from setl.testing.servers import free_port
    from tests.ddltask.test_concurrency import read_batches

    rig = make_rig()
    rig.execute_target("INSERT INTO fact VALUES (99, '2026-11-20', 0, 'old')")
    rig.execute_source(rig.signal("run1", "truncate_partition", "fact", "p20261120"), *rows(D20, [1, 2], 1))
    batches, stages = read_batches(rig)
    batch = Batch(rig.name, 1, 1, batches[0].start, batches[-1].end,
                  tuple(c for b in batches for c in b.changes))
    real = stages.load.actions
    stages.load.actions = MysqlActions(MysqlTargetConfig("mysql", port=free_port()), pipeline=rig.name,
                                       attempts=2, sleep=lambda _: None)
    stages.load.open()
    try:
        with pytest.raises(TransientLoadError, match="task run1 .*could not complete.*the retry redoes it"):
            stages.load.load(batch)
        assert rig.statuses() == {"run1": DdlTaskStatus.RUNNING}
        assert rig.rows("fact") == [(99, D20, 0, "old")]
        stages.load.actions = real
        stages.load.load(batch)
    finally:
        stages.load.close()
    assert rig.statuses() == {"run1": DdlTaskStatus.SUCCEEDED}
    assert rig.rows("fact") == expected(D20, [1, 2], 1)


def test_two_tables_of_one_batch(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, load_mode):
    """Tasks on two tables written in the same transactions (parts on different threads) each end right."""
    dim = "CREATE TABLE dim (id INT PRIMARY KEY, job VARCHAR(32))"
    rig = Rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, source_ddl=[FACT_SOURCE, dim],
              target_ddl=[FACT_TARGET, dim], task_column="job", max_rows=5, load_mode=load_mode)
    try:
        rig.execute_target("INSERT INTO dim VALUES (500, 'old')")
        rig.execute_source(rig.signal("f", "truncate_partition", "fact", "p20261120", True),
                           rig.signal("d1", "truncate_table", "dim", "", True))
        for i in range(8):
            if i == 3:
                rig.execute_source(rig.signal("d2", "truncate_table", "dim", "", True))
            dim_rows = [("INSERT INTO dim VALUES (%s, %s)", (i, "d1"))]
            if i >= 3:
                dim_rows.append(("INSERT INTO dim VALUES (%s, %s)", (100 + i, "d2")))
            rig.execute_source(*rows(D20, [i, 10 + i], 1, "f"), *dim_rows)
        rig.run()
        assert rig.rows("fact") == expected(D20, [*range(8), *range(10, 18)], 1, "f")
        assert rig.rows("dim") == [(100 + i, "d2") for i in range(3, 8)]
        assert rig.statuses() == {"f": DdlTaskStatus.SUCCEEDED, "d1": DdlTaskStatus.DEPRECATED,
                                  "d2": DdlTaskStatus.SUCCEEDED}
        assert rig.load.actions_run == {"f": 1, "d1": 1, "d2": 1}
    finally:
        rig.close()
