"""Run transforms on a local Spark without a binlog: for plugin authors' tests and setl's own.

    from setl.testing.spark import run_transform

    def test_upper():
        rows = run_transform("add_column", [{"id": 1, "name": "a"}],
                             {"name": "up", "expr": "upper(name)"}, primary_key=["id"])
        assert rows == [{"id": 1, "name": "a", "up": "A"}]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from setl.config import SparkConfig, TransformStep
from setl.model import Batch, Op, Position, RowChange
from setl.plugins import Registry, as_plugin

#: Settings for tests on a small machine: two cores, few shuffle partitions, no UI.
LOCAL_SETTINGS = SparkConfig(
    master="local[2]",
    app_name="setl-tests",
    conf={
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "1g",
        "spark.sql.adaptive.enabled": "false",
    },
)


def local_spark(settings: SparkConfig | None = None) -> Any:
    """The process's SparkSession, started with `LOCAL_SETTINGS` if it is not running yet."""
    from setl.spark import get_session

    return get_session(settings or LOCAL_SETTINGS)


_START = Position("test", 0)  # frozen: one shared default is safe


def make_batch(
    table: str,
    rows: Iterable[Mapping[str, Any] | tuple[Mapping[str, Any], Mapping[str, Any]]],
    primary_key: Sequence[str] = (),
    op: str | Op | Sequence[str | Op] = "insert",
    schema: str = "demo",
    *,
    pipeline: str = "test",
    batch_id: int = 1,
    epoch: int = 1,
    start: Position = _START,
    commit_time: float | None = 1_700_000_000.0,
) -> Batch:
    """A batch of row changes to `schema.table` (or a qualified `table`) made from Python dicts.

    `op` is one operation for all rows or one per row. An insert's or a read's
    (a snapshot row's) row is its after image, a delete's its before image; an update's row is a
    ``(before, after)`` pair, or a single dict used as both.
    """
    if "." in table:
        schema, table = table.split(".", 1)
    rows = list(rows)
    ops = [Op(op)] * len(rows) if isinstance(op, (str, Op)) else [Op(o) for o in op]
    if len(ops) != len(rows):
        raise ValueError(f"{len(ops)} operations for {len(rows)} rows")
    changes = []
    for offset, (row, kind) in enumerate(zip(rows, ops), start=1):
        position = Position(start.log, start.offset + offset)
        before: Mapping[str, Any] | None
        after: Mapping[str, Any] | None
        if kind is Op.UPDATE:
            before, after = row if isinstance(row, tuple) else (row, row)
        elif isinstance(row, tuple):
            raise ValueError(f"a (before, after) pair for a {kind.value}: only an update takes one")
        elif kind is Op.INSERT or kind is Op.READ:
            before, after = None, row
        else:
            before, after = row, None
        changes.append(RowChange(
            kind, schema, table, tuple(primary_key),
            dict(before) if before is not None else None,
            dict(after) if after is not None else None,
            position, commit_time,
        ))
    end = Position(start.log, start.offset + len(changes))
    return Batch(pipeline, batch_id, epoch, start, end, tuple(changes))


def run_transform(
    name_or_fn: str | Callable[..., Any],
    rows: Iterable[Any],
    params: Mapping[str, Any] | None = None,
    *,
    primary_key: Sequence[str] = (),
    op: str | Op | Sequence[str | Op] = "insert",
    table: str = "demo.rows",
    registry: Registry | None = None,
    plugin_dirs: Iterable[str | Path] = (),
    spark: Any = None,
    changes: bool = False,
) -> list[Any]:
    """Run one transform over `rows` on a local Spark; return the resulting row images.

    `name_or_fn` is a registered name (found through entry points and
    `plugin_dirs`, or in `registry`) or the decorated function or class
    itself. Params are validated as at pipeline startup, so a bad param raises
    `PluginError`. With ``changes=True`` the RowChanges are returned instead
    (to check ops and keys).
    """
    from setl.transforms.stage import SparkTransform

    if registry is None:
        registry = Registry()
        if isinstance(name_or_fn, str):
            registry.discover(plugin_dirs)
    if isinstance(name_or_fn, str):
        name = name_or_fn
    else:
        plugin = as_plugin(name_or_fn)
        name = plugin.name if plugin is not None else getattr(name_or_fn, "__name__", "transform")
        if name not in registry:
            registry.register(name_or_fn, "setl.testing.run_transform", name=None if plugin else name)
    step = registry.validate(TransformStep(use=name, params=dict(params or {})))
    batch = make_batch(table, rows, primary_key=primary_key, op=op)
    session = spark if spark is not None else local_spark()
    stage = SparkTransform({batch.changes[0].qualified_table: [step]} if batch.changes else {},
                           pipeline="test", session=lambda: session)
    result = stage.transform(batch)
    if changes:
        return list(result.changes)
    return [dict(change.image) for change in result.changes]  # type: ignore[union-attr]
