"""setl.pipeline.chain: stage wrappers are composed in one place, in one order, and described."""

from __future__ import annotations

from setl.failpoints import FaultPlan, FaultyLoad
from setl.pipeline.chain import Stages, compose, layers
from setl.stages import Extract, LoadWrapper, SelectWrapper, Transform
from setl.stages.load import supports_per_table
from setl.testing.harness import MemorySink, ScriptedSource


class TaskSelect(SelectWrapper):
    """Stands in for the batch DDL tasks' Select."""


class TaskLoad(LoadWrapper):
    """Stands in for the batch DDL tasks' Load (it cannot load per table)."""


def base() -> Stages:
    return Stages(ScriptedSource(), Extract(), Transform(), MemorySink())


def test_without_wrappers_the_stages_are_the_base_ones():
    """No DDL tasks, an empty fault plan and no lease compose to the base stages themselves."""
    stages = base()
    assert compose(stages, faults=FaultPlan()) == stages
    assert stages.describe() == "select: ScriptedSource; extract: Extract; transform: Transform; load: MemorySink"


def test_ddl_tasks_are_inside_the_failpoints():
    """Batch DDL tasks wrap the base stages, failpoints wrap them, and describe() lists each chain outermost first."""
    stages = compose(base(), ddl_tasks=lambda s, ld: (TaskSelect(s), TaskLoad(ld)), faults=FaultPlan().fail_load(3))
    assert layers(stages.select) == "FaultySelect > TaskSelect > ScriptedSource"
    assert layers(stages.load) == "FaultyLoad > TaskLoad > MemorySink"
    assert "extract: FaultyExtract > Extract" in stages.describe()
    assert isinstance(stages.load, FaultyLoad) and not supports_per_table(stages.load)


def test_failpoints_keep_the_per_table_ability_of_the_load_they_wrap():
    """Failpoints around a Load that can load per table can too (a FaultyPartLoad)."""
    stages = compose(base(), faults=FaultPlan().fail_load(3))
    assert layers(stages.load) == "FaultyPartLoad > MemorySink"
    assert supports_per_table(stages.load)
