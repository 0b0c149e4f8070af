"""Batch DDL tasks (after XDT): an upstream job declares, through a signal row in the source, a
pre-write action on its target slice that runs exactly once, with overwrite and deprecation.

See docs/batch-ddl-tasks.md. `with_ddl_tasks` wraps a pipeline's Select and Load when
``pipeline.ddl_tasks.signal_table`` is set.
"""

from __future__ import annotations

from setl.config import NodeSettings, PipelineConfig
from setl.ddltask.actions import Actions, MysqlActions
from setl.ddltask.load import ACTION_FAILED, DdlTaskLoad, DdlTaskPartLoad
from setl.ddltask.select import DdlTaskSelect
from setl.ddltask.signal import OP_TYPES, Signal
from setl.ddltask.tasks import DdlTasks
from setl.errors import ConfigError
from setl.meta.base import MetaStore
from setl.routing import RoutingPlan
from setl.stages import Load, Select

__all__ = ["ACTION_FAILED", "OP_TYPES", "Actions", "DdlTaskLoad", "DdlTaskPartLoad",
           "DdlTaskSelect", "DdlTasks", "MysqlActions", "Signal", "with_ddl_tasks"]


def with_ddl_tasks(node: NodeSettings, config: PipelineConfig, select: Select, load: Load,
                   meta: MetaStore, actions: Actions, plan: RoutingPlan | None = None) -> tuple[Select, Load]:
    """`select` and `load` wrapped for the pipeline's batch DDL tasks (they must be enabled), whose
    pre-write actions on the target are `actions` (`setl.pipeline.build_actions`).

    A task's target table is its source table's route in `plan` (the pipeline's routing plan,
    compiled from `config.tables` when not given)."""
    settings = config.pipeline.ddl_tasks
    assert settings.signal_table is not None
    schema, dot, table = settings.signal_table.rpartition(".")
    if not dot or not schema or not table:
        raise ConfigError(f"pipeline.ddl_tasks.signal_table: expected schema.table, got "
                          f"{settings.signal_table!r}", file=config.file, pipeline=config.name)
    routing = plan if plan is not None else RoutingPlan.compile(config.tables, pipeline=config.name)

    def target_of(source_schema: str, source_table: str) -> tuple[str, str] | None:
        route = routing.route(source_schema, source_table)
        return None if route is None else (route.target.schema, route.target.table)

    tasks = DdlTasks(meta, config.name, op_system=actions.system, target_of=target_of,
                     task_column=settings.task_column)
    # Per-table loading is offered only when the wrapped Load offers it.
    wrapper = DdlTaskPartLoad if load.capabilities.per_table else DdlTaskLoad
    return (DdlTaskSelect(select, tasks, settings.signal_table, pipeline=config.name),
            wrapper(load, tasks, actions, node_id=node.node.id))
