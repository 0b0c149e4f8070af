"""setl.failpoints: markers from SETL_FAULTS, the named failpoints, and the wrappers' per-table claim."""

from __future__ import annotations

import json

import pytest

from setl import failpoints
from setl.config import BatchSettings, LoadSettings, PipelineSettings
from setl.errors import ConfigError
from setl.meta import SqliteMetaStore
from setl.scheduler import Outcome, Scheduler, supports_per_table
from setl.sinks.parquet import ParquetLoad
from setl.stages import Extract, Transform
from setl.testing import harness
from setl.testing.harness import MemorySink, ScriptedSource


def test_the_harness_re_exports_the_product_failpoints():
    """setl.testing.harness hands out the very classes of setl.failpoints, so old tests keep working."""
    assert harness.FaultPlan is failpoints.FaultPlan
    assert harness.FaultyLoad is failpoints.FaultyLoad
    assert harness.InjectedFault is failpoints.InjectedFault


def test_faults_json_keeps_its_format_and_names_the_failpoints():
    """SETL_FAULTS markers parse as before; an unknown failpoint is refused with the known ones listed."""
    plan = failpoints.from_env({"SETL_FAULTS": json.dumps([{"stage": "load", "batch": 3, "times": 2}])})
    assert [(f.stage, f.batch, f.times, f.action) for f in plan.faults] == [("load", 3, 2, "fail")]
    with pytest.raises(ValueError, match="termin"):
        failpoints.from_env({"SETL_FAULTS": json.dumps([{"stage": "loader"}])})
    with pytest.raises(ValueError, match="JSON list"):
        failpoints.from_env({"SETL_FAULTS": json.dumps({"stage": "load"})})
    assert set(failpoints.FAILPOINTS) == {"select", "extract", "transform", "load", "termin", "ddl_action",
                                          "snapshot_read", "snapshot_boundary", "snapshot_ended", "snapshot_acked",
                                          "repair_acked", "verify_chunk", "quarantine_kept",
                                          "quarantine_replay", "loop_mark_commit", "loop_mark_ddl"}


def test_a_ddl_action_crash_marker_strikes_its_task_only():
    """A ``ddl_action`` crash marker for task run2 (what the removed SETL_DDLTASK_CRASH_AFTER_ACTION
    hook did) matches run2 only."""
    plan = failpoints.from_env({"SETL_FAULTS": json.dumps([{"stage": "ddl_action", "action": "crash",
                                                            "task": "run2"}])})
    (fault,) = plan.faults
    assert (fault.stage, fault.action, fault.task) == ("ddl_action", "crash", "run2")
    assert not fault.matches("ddl_action", 1, "run1")
    assert fault.matches("ddl_action", 1, "run2")


def test_hit_fires_the_process_markers_as_many_times_as_asked(monkeypatch):
    """failpoints.hit raises at a marked failpoint `times` times, then lets it pass; unmarked ones never fire."""
    monkeypatch.setenv("SETL_FAULTS", json.dumps([{"stage": "ddl_action", "task": "t1", "times": 2}]))
    failpoints.hit("ddl_action", 5, task="t0")
    for _ in range(2):
        with pytest.raises(failpoints.InjectedFault, match="ddl_action failure at task t1"):
            failpoints.hit("ddl_action", 5, task="t1")
    failpoints.hit("ddl_action", 5, task="t1")
    monkeypatch.delenv("SETL_FAULTS")
    failpoints.hit("load", 1)


def test_faulty_load_claims_per_table_only_when_its_inner_load_can(tmp_path):
    """Faults around a Parquet target cannot load per table, so per_table is refused at start, not later."""
    plan = failpoints.FaultPlan()
    parquet = failpoints.FaultyLoad(plan, ParquetLoad(tmp_path / "out", pipeline="p"))
    memory = failpoints.FaultyLoad(plan, MemorySink())
    assert not supports_per_table(ParquetLoad(tmp_path / "out", pipeline="p"))
    assert not supports_per_table(parquet) and type(parquet) is failpoints.FaultyLoad
    assert supports_per_table(memory) and isinstance(memory, failpoints.FaultyPartLoad)
    settings = PipelineSettings(batch=BatchSettings(max_rows=5), load=LoadSettings(mode="per_table"))
    with pytest.raises(ConfigError, match="cannot load per table"):
        Scheduler("p", settings, ScriptedSource(), Extract(), Transform(), parquet, SqliteMetaStore(":memory:"))


def test_a_select_marker_fails_a_real_pipeline_once_and_it_recovers():
    """A "select" marker (as in SETL_FAULTS) strikes the third transaction polled; the rewind replays it, none lost."""
    from setl.pipeline import Stages, compose
    from setl.testing.harness import (
        InvariantListener,
        insert,
        reference_state,
        run_pipeline,
    )

    txs = [[insert("t", {"id": n, "v": n})] for n in range(8)]
    plan = failpoints.FaultPlan.from_json(json.dumps([{"stage": "select", "batch": 2}]))
    sink = MemorySink()
    stages = compose(Stages(ScriptedSource(txs), Extract(), Transform(), sink), faults=plan)
    listener = InvariantListener(2, sink)
    result = run_pipeline(stages.select, stages.load, extract=stages.extract, transform=stages.transform,
                          settings=PipelineSettings(parallelism=2, batch=BatchSettings(max_rows=2, max_wait_ms=2)),
                          listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert plan.faults[0].fired == 1
    assert listener.violations == []
    assert sink.tables == reference_state(txs)
