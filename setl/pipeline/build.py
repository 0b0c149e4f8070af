"""Pipeline assembly: each configured pipeline's stages, built by their connectors, checked, and
wrapped in the one chain (`setl.pipeline.chain`), before anything connects anywhere.

`Node` builds every pipeline it runs with `build_stages`; the CLI (`setl schema`) uses the same
pieces. Everything here runs at startup, never on the data path.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from setl import connectors, failpoints
from setl.config import NodeSettings, PipelineConfig
from setl.connectors import TargetConnector, registry
from setl.ddltask import Actions, with_ddl_tasks
from setl.errors import ConfigError, PluginError, SetlError
from setl.meta import open_meta_store
from setl.meta.base import MetaStore
from setl.model import TableSchema
from setl.pipeline.chain import LoadWrap, Stages, compose
from setl.routing import RoutingPlan, build_plan
from setl.schema import CreateTablesLoad, SchemaPlanner, SchemaTarget, TableCreator, find_creator
from setl.snapshot.select import with_snapshots
from setl.stages import Load, Select, TableExtract, Transform

log = logging.getLogger("setl.pipeline")


def build_select(node: NodeSettings, config: PipelineConfig, plan: RoutingPlan | None = None) -> Select:
    """The pipeline's source, built by the connector its ``source.type`` names (`setl.connectors`).

    The source learns from the routing `plan` which tables the rules select (the binlog source
    refuses what it cannot replicate exactly only for those), and from the target connector's
    capabilities whether to hand on sequence state rows."""
    if plan is None:  # only which tables the rules select; transform steps are not needed here
        plan = RoutingPlan.compile(config.tables, pipeline=config.name, file=config.file or None)
    try:
        return connectors.build_select(config, node, selects=plan.selects, sequences=_applies_sequences(node, config),
                                       statement_markers=_marks_statements(node, config))
    except SetlError as exc:
        exc.with_context(file=config.file, pipeline=config.name)
        raise


def _takes_copy_end(node: NodeSettings, config: PipelineConfig) -> bool:
    """Whether the pipeline's target connector declares that it takes a copy's end marker
    (`setl.stages.load.LoadCapabilities.copy_end`: a re-copy switches tables there)."""
    try:
        return connectors.for_node(node).target(config.target.type).capabilities.copy_end
    except SetlError:
        return False


def _marks_statements(node: NodeSettings, config: PipelineConfig) -> bool:
    """Whether a row change logged as a statement is to quarantine its table rather than stop the
    pipeline: ``on_table_error: quarantine`` with a target connector that keeps a quarantine
    (`setl.stages.load.LoadCapabilities.quarantine`; docs/quarantine.md)."""
    if config.pipeline.on_table_error != "quarantine":
        return False
    try:
        return connectors.for_node(node).target(config.target.type).capabilities.quarantine
    except SetlError:
        return False


def _applies_sequences(node: NodeSettings, config: PipelineConfig) -> bool:
    """Whether the pipeline's target connector declares that it applies sequence state rows (an
    unknown target type is refused where its Load is built, not here)."""
    try:
        return connectors.for_node(node).target(config.target.type).capabilities.sequences
    except SetlError:
        return False


def build_load(node: NodeSettings, config: PipelineConfig) -> Load:
    """The pipeline's target, built by the connector its ``target.type`` names (`setl.connectors`)."""
    try:
        return connectors.build_load(config, node)
    except SetlError as exc:
        exc.with_context(file=config.file, pipeline=config.name)
        raise


def build_transform(node: NodeSettings, config: PipelineConfig, plan: RoutingPlan | None = None) -> Transform:
    """The pipeline's Spark Transform stage, or a pass-through `Transform` (no Spark at all) when
    no table rule has transform steps."""
    if not any(rule.transforms for rule in config.tables):
        return Transform()
    try:
        from setl.transforms.stage import build_transform as build_spark_transform
    except ImportError as exc:
        raise PluginError("transforms are configured but the Spark transform stage is not available",
                          file=config.file, pipeline=config.name) from exc
    return build_spark_transform(node, config, plan)


def build_stages(node: NodeSettings, config: PipelineConfig, meta: MetaStore | None = None) -> Stages:
    """Every stage of a pipeline, validated, before anything connects anywhere.

    `meta` is needed by batch DDL tasks (`pipeline.ddl_tasks`); without it they open their own.
    """
    routing = build_plan(node, config)  # the one routing decision every stage reads

    def snapshot_meta() -> MetaStore:
        return meta if meta is not None else open_meta_store(node)

    base = Stages(
        select=with_snapshots(build_select(node, config, routing), pipeline=config.name, meta=snapshot_meta,
                              parallelism=config.pipeline.parallelism, spark=node.spark,
                              copy_end=_takes_copy_end(node, config),
                              interleave="per_table" in (config.pipeline.load.mode, config.pipeline.load.chunks)),
        extract=TableExtract(pipeline=config.name, plan=routing),
        transform=build_transform(node, config, routing),
        load=build_load(node, config),
    )
    ddl_tasks = None
    if config.pipeline.ddl_tasks.signal_table:
        def ddl_tasks(select: Select, load: Load) -> tuple[Select, Load]:
            return with_ddl_tasks(node, config, select, load, meta if meta is not None else open_meta_store(node),
                                  build_actions(config), routing)

    plan = failpoints.from_env()
    if plan:
        log.warning("pipeline=%s fault injection is on: %s", config.name, os.environ.get(failpoints.FAULTS_ENV))
    create_tables = table_creation(node, config, routing, base.select, base.transform)
    stages = compose(base, ddl_tasks=ddl_tasks, faults=plan, create_tables=create_tables)
    log.debug("pipeline=%s stages: %s", config.name, stages.describe())
    return stages


def table_creation(node: NodeSettings, config: PipelineConfig, routing: RoutingPlan, select: Select,
                   transform: Transform) -> LoadWrap | None:
    """What wraps the pipeline's Load to create missing target tables (`setl.schema`), or None when
    ``pipeline.create_tables`` is off or the target's connector creates no tables."""
    if not config.pipeline.create_tables:
        return None
    try:
        target = connectors.build_schema(config, node)
    except SetlError as exc:
        exc.with_context(file=config.file, pipeline=config.name)
        raise
    if target is None:
        if not connectors.creates_tables(config, node):
            log.warning("pipeline=%s %s", config.name, connectors.NO_TABLES.format(type=config.target.type))
        return None
    creator = table_creator(config, routing, select, transform, target)
    ddl_creates = config.pipeline.ddl == "apply"
    return lambda load: CreateTablesLoad(load, creator, ddl_creates=ddl_creates)


def table_creator(config: PipelineConfig, routing: RoutingPlan, select: Select, transform: Transform,
                  target: SchemaTarget) -> TableCreator:
    """The pipeline's target tables, planned from the source's columns (through the transform
    steps) and created or checked on `target`: what `table_creation` runs and `setl schema` prints."""
    planner = SchemaPlanner(config.name, routing, select.describe, getattr(transform, "output_columns", None))
    return TableCreator(config.name, planner, target)


def describe_tables(config: PipelineConfig, stages: Stages, *, always: bool = False) -> tuple[TableSchema, ...] | None:
    """The selected source tables' columns at startup (`Select.describe`), when the transform steps
    or target table creation need them (or `always`: the rule checks of `setl.pipeline.checks`);
    None when nothing needs them or the source cannot tell now (then each table's first batch does
    the work)."""
    if not always and _analysable(stages) is None and find_creator(stages.load) is None:
        return None
    try:
        tables = stages.select.describe()
    except SetlError as exc:
        log.warning("pipeline=%s source tables not described at startup (first batches will be): %s",
                    config.name, exc)
        return None
    return tuple(tables) if tables is not None else None


def _analysable(stages: Stages) -> Any:
    transform: Any = stages.transform
    while not hasattr(transform, "analyse") and hasattr(transform, "inner"):
        transform = transform.inner
    return transform if hasattr(transform, "analyse") else None


_DESCRIBE: Any = object()


def analyse_steps(config: PipelineConfig, stages: Stages, tables: Any = _DESCRIBE) -> int:
    """Analyse the pipeline's transform steps against the selected source tables' columns, at startup.

    The source describes its tables (`Select.describe`) on a short-lived connection, unless the
    caller gives them (`tables`, from `describe_tables`); each table whose route has transform
    steps gets one empty DataFrame run through its chain. A step Spark SQL rejects raises
    `setl.transforms.stage.StartupAnalysisError` (exit 2). A source that cannot describe, or
    cannot be reached now, leaves the analysis to each table's first batch: it never blocks a start.
    Returns the number of (table, chain) pairs analysed.
    """
    transform = _analysable(stages)
    if transform is None:
        return 0  # no transforms: nothing to analyse, and no Spark
    if tables is _DESCRIBE:
        try:
            tables = stages.select.describe()
        except SetlError as exc:
            log.warning("pipeline=%s transform steps not analysed at startup (first batches will be): %s",
                        config.name, exc)
            return 0
    if tables is None:
        return 0
    from setl.transforms.stage import StartupAnalysisError

    try:
        analysed = int(transform.analyse(tables))
    except StartupAnalysisError as exc:
        raise exc.with_context(file=config.file or None, pipeline=config.name) from exc.__cause__
    except Exception as exc:  # noqa: BLE001 - Spark cannot start now, say: the first batch will tell, and retry
        log.warning("pipeline=%s transform steps not analysed at startup (first batches will be): %s",
                    config.name, exc)
        return 0
    log.info("pipeline=%s transform steps analysed at startup for %d table(s)", config.name, analysed)
    return analysed


def build_actions(config: PipelineConfig) -> Actions:
    """The pre-write actions for the pipeline's target, as its connector declares them; a
    ConfigError if it has none."""
    factory = registry().target(config.target.type).ddl_task_actions
    if factory is not None:
        return factory(config.target, pipeline=config.name)
    supported = ", ".join(c.type for c in registry().listing("target")
                          if isinstance(c, TargetConnector) and c.ddl_task_actions)
    raise ConfigError(f"pipeline.ddl_tasks: target.type {config.target.type} has no pre-write "
                      f"actions (supported: {supported or 'none'})", file=config.file, pipeline=config.name)


__all__ = ["analyse_steps", "build_actions", "build_load", "build_select", "build_stages", "build_transform",
           "describe_tables", "table_creation", "table_creator"]
