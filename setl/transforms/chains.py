"""The transform chains of a pipeline's tables (`TablePlan`), found for a row change by its route
(`ChainPlans`), setl's metadata columns a chain sees, and the errors of a chain Spark rejects."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pyarrow as pa

from setl.errors import TransformError
from setl.model import RowChange, TableName
from setl.plugins import BoundStep
from setl.routing import Route, RoutingPlan

META_PREFIX = "_setl_"
OP, IMAGE, SEQ, COMMIT_TIME, POSITION = "_setl_op", "_setl_image", "_setl_seq", "_setl_commit_time", "_setl_position"
BEFORE, AFTER = "before", "after"
REQUIRED_META = (SEQ, IMAGE)
INFORMATIONAL_META = (OP, COMMIT_TIME, POSITION)
_UNKNOWN: Any = object()


def sample_meta() -> dict[str, pa.Array]:
    """setl's metadata columns of one row, typed as a batch has them (`setl.transforms.stage._Rows.table`)."""
    return {
        OP: pa.array(["insert"], pa.string()), IMAGE: pa.array([AFTER], pa.string()),
        SEQ: pa.array([0], pa.int64()), COMMIT_TIME: pa.array([0], pa.timestamp("us", tz="UTC")),
        POSITION: pa.array(["x"], pa.string()),
    }


class StepAnalysisError(TransformError):
    """Spark SQL rejects a step against its table's columns (an unknown column or function, a syntax
    error in a `filter`, `add_column` or `sql` step). Raised by the first batch of the table, at the
    step's eager analysis; the same on every attempt, so the pipeline pauses at once."""

    retryable = False


class PartialRowRefused(TransformError):
    """A partial row image (`RowChange.partial`) of a table with transforms: Spark sees whole rows
    only, so the change cannot be transformed exactly. The same on every attempt: pause at once."""

    retryable = False


class StartupAnalysisError(StepAnalysisError):
    """A `StepAnalysisError` found at startup, before anything is read or written: a configuration
    error (``setl start`` exits 2)."""

    exit_code = 2


def is_analysis_error(exc: BaseException) -> bool:
    """Whether `exc` is Spark's analysis or parse error (classic or Spark Connect)."""
    try:
        from pyspark.errors import AnalysisException
    except ImportError:  # pragma: no cover - pyspark < 3.4
        return False
    return isinstance(exc, AnalysisException)


@attrs.frozen
class TablePlan:
    """The validated transform chain of one table's rows: one route's, or one named target's.

    `types_key` names the column types cache entry (per source table when routed: two source
    tables routed into one target table may differ in columns).
    """

    target: str
    steps: tuple[BoundStep, ...]
    source: str | None = None
    types_key: str = ""

    @property
    def may_drop_deletes(self) -> bool:
        return any(step.may_drop_deletes for step in self.steps)

    @property
    def names(self) -> str:
        return ",".join(step.name for step in self.steps)

    @classmethod
    def of_route(cls, route: Route) -> TablePlan | None:
        if not route.steps:
            return None
        return cls(str(route.target), route.steps, str(route.source),
                   repr((route.source.schema, route.source.table)))


class ChainPlans:
    """Which chain a row change goes through: its route's in `routing` (the pipeline's
    `setl.routing.RoutingPlan`), found by the change's `source` table, so rows of two source tables
    routed into one target table keep their own chains; no chain is ever found by inverting a
    target name. `tables` names chains for changes that carry no `source` (made by hand, as
    `setl.testing` does), by their qualified name. It owns the plans made from routes, made once
    per route under its lock: safe to call from several threads at once."""

    def __init__(self, tables: Mapping[str, Sequence[BoundStep]] | None = None, *,
                 sources: Mapping[str, str] | None = None, routing: RoutingPlan | None = None) -> None:
        self.routing = routing
        self._named: dict[str, TablePlan | None] = {
            name: TablePlan(name, tuple(steps), (sources or {}).get(name), name)
            for name, steps in (tables or {}).items()
            if steps
        }
        self._of_routes: dict[int, TablePlan | None] = {}
        self._lock = threading.Lock()

    def plan_for(self, table: str) -> TablePlan | None:
        """The chain given for a target table by name (`tables`), or None when it has none.

        Only for changes that carry no `source` (not routed by Extract); a routed change's
        chain is always its route's (`plan_for_source`), whatever its target name.
        """
        return self._named.get(table)

    def plan_for_source(self, source: TableName) -> TablePlan | None:
        """The chain of a source table's route in the routing plan, or None when it has none."""
        route = self.route(source)
        if route is None:
            return None
        plan = self._of_routes.get(id(route), _UNKNOWN)
        if plan is _UNKNOWN:
            with self._lock:
                plan = self._of_routes.setdefault(id(route), TablePlan.of_route(route))
        return plan

    def route(self, source: TableName) -> Route | None:
        """The route of a source table, if the routing plan has one."""
        return None if self.routing is None else self.routing.route(source.schema, source.table)

    def plan_of(self, change: RowChange) -> TablePlan | None:
        """The chain of `change`: its route's, or (not routed by Extract: a pass-through Extract, or
        a batch made by hand, whose names are the source's own) a target named in `tables`."""
        if change.source is not None:
            return self.plan_for_source(change.source)
        named = self.plan_for(change.qualified_table)
        return named if named is not None else self.plan_for_source(TableName(change.schema, change.table))
