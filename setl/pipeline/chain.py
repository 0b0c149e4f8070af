"""The one place a pipeline's stage wrappers are composed, and can be described (`setl.pipeline`).

A pipeline's stages are its source, Extract, Transform and target, wrapped (innermost first) by:

0. table copies (`setl.snapshot.select.SnapshotSelect`): a source declaring the snapshots
   capability (`setl.stages.snapshot.SnapshotCapable`), whose stream it merges chunk reads into
   (``source.start: snapshot``, `setl snapshot`); target table creation
   (`setl.schema.CreateTablesLoad`): Load, when ``pipeline.create_tables`` is on and the target
   can create tables;
1. batch DDL tasks (`setl.ddltask`): Select and Load, when ``pipeline.ddl_tasks`` is on;
2. failpoints (`setl.failpoints`): every stage, when ``SETL_FAULTS`` is set;
3. fencing (`setl.ha`): Select and Load, outermost, when the node runs the pipeline under a
   ZooKeeper lease, so that nothing inside reads or writes once leadership is lost.

`compose` builds that chain once, before the scheduler is made: a `Scheduler` takes the
composed stages in its constructor and nothing swaps them afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from setl.failpoints import (
    FaultPlan,
    FaultyExtract,
    FaultyLoad,
    FaultySelect,
    FaultyTransform,
)
from setl.stages import Extract, Load, Select, Transform
from setl.stages.layers import layers

#: Wraps Select and Load for batch DDL tasks (see `setl.ddltask.with_ddl_tasks`).
DdlTaskWrap = Callable[[Select, Load], "tuple[Select, Load]"]
#: Wraps Load to create missing target tables (see `setl.schema.CreateTablesLoad`).
LoadWrap = Callable[[Load], Load]


@attrs.frozen
class Stages:
    """A pipeline's four stages, as the scheduler runs them."""

    select: Select
    extract: Extract
    transform: Transform
    load: Load

    def describe(self) -> str:
        """Each stage's chain, outermost first: ``load: FencedLoad > FaultyLoad > MysqlLoad``."""
        roles = ("select", "extract", "transform", "load")
        return "; ".join(f"{role}: {layers(getattr(self, role))}" for role in roles)


def compose(base: Stages, *, ddl_tasks: DdlTaskWrap | None = None, faults: FaultPlan | None = None,
            lease: Any | None = None, create_tables: LoadWrap | None = None) -> Stages:
    """`base` wrapped for target table creation, batch DDL tasks, failpoints (a non-empty plan) and
    fencing by `lease` (a `setl.ha.Lease`), in that order from the inside out."""
    select, extract, transform, load = base.select, base.extract, base.transform, base.load
    if create_tables is not None:
        load = create_tables(load)
    if ddl_tasks is not None:
        select, load = ddl_tasks(select, load)
    if faults:
        select, extract, transform, load = (FaultySelect(faults, select), FaultyExtract(faults, extract),
                                            FaultyTransform(faults, transform), FaultyLoad(faults, load))
    if lease is not None:
        from setl.ha import (  # the only importer of kazoo: only under HA
            FencedLoad,
            FencedSelect,
        )

        select, load = FencedSelect(lease, select), FencedLoad(lease, load)
    return Stages(select, extract, transform, load)


def fenced(stages: Stages, lease: Any) -> Stages:
    """Already composed `stages`, fenced by `lease` (the outermost layer)."""
    return compose(stages, lease=lease)


__all__ = ["DdlTaskWrap", "LoadWrap", "Stages", "compose", "fenced", "layers"]
