"""Creating a pipeline's missing target tables (``pipeline.create_tables``): `TableCreator` plans
and creates them on a `SchemaTarget`, `CreateTablesLoad` does so before a table's first row is
written, and `check_tables` refuses an existing table that does not fit, at start."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from setl.errors import ConfigError, LoadError, RefusedLoadError, SetlError, TransientLoadError
from setl.model import Batch, DdlChange, RowChange, TableName, TableSchema
from setl.schema.plan import SchemaPlanner, TargetTable
from setl.schema.target import SchemaTarget
from setl.stages.layers import find_layer
from setl.stages.load import Load, LoadWrapper

log = logging.getLogger(__name__)


class TableCreator:
    """A pipeline's target tables, planned by `planner` and created or checked on `target`.

    Its connection to the target is its own, opened on first use; safe to call from several threads.
    """

    def __init__(self, pipeline: str, planner: SchemaPlanner, target: SchemaTarget) -> None:
        self.pipeline = pipeline
        self.planner = planner
        self.target = target
        self._lock = threading.RLock()

    def missing(self) -> list[tuple[TargetTable, list[str]]]:
        """The planned tables the target does not have, each with the DDL that creates it; raises
        the `ConfigError` of the first existing table that does not fit (`SchemaTarget.misfit`)."""
        out = []
        with self._lock:
            for table in self.planner.tables():
                existing = self.target.existing(table.table)
                if existing is None:
                    out.append((table, self.target.statements(table)))
                    continue
                error = self.target.misfit(table, existing)
                if error is not None:
                    raise error
        return out

    def check(self) -> int:
        """Refuse (`ConfigError`) an existing planned table that does not fit; the number of planned tables."""
        self.missing()
        return len(self.planner.tables())

    def ensure(self, source: TableName, target: TableName) -> bool:
        """Create the target table source table `source` is routed into, if the target lacks it;
        whether it was created. False also when the source cannot describe the table (the load
        then reports the missing table)."""
        with self._lock:
            if self.target.existing(target) is not None:
                return False
            planned = self.planner.for_source(source)
            if planned is None:
                log.warning("pipeline=%s stage=load table=%s: target table missing and source table %s cannot be "
                            "described; not created", self.pipeline, target, source)
                return False
            self.target.execute(self.target.statements(planned))
            log.info("pipeline=%s stage=load table=%s: created the target table before its first row "
                     "(%d columns, key %s)", self.pipeline, planned.table, len(planned.columns),
                     ", ".join(planned.primary_key) or "none")
            return True

    def absent(self, tables: Iterable[TableName]) -> set[TableName]:
        """Those of the target tables `tables` the target does not have."""
        with self._lock:
            return {table for table in tables if self.target.existing(table) is None}

    def close(self) -> None:
        self.target.close()


class CreateTablesLoad(LoadWrapper):
    """Creates each missing target table before the first batch that writes a row into it.

    A table the batch's own replicated DDL names before its first row (a ``CREATE TABLE`` in the
    binlog, when ``pipeline.ddl: apply``) is left to that DDL, so no table is created twice; the
    DDL runs ``IF NOT EXISTS`` anyway. A table is looked up once per process: afterwards its
    rows go straight through. With ``check_first``, the first batch first checks every planned
    existing table's fit (what `check_tables` does at start when the target could not be reached).
    """

    parts = True

    def __init__(self, inner: Load, creator: TableCreator, *, ddl_creates: bool = True,
                 check_first: bool = False) -> None:
        super().__init__(inner)
        self.creator = creator
        self.ddl_creates = ddl_creates
        self.check_first = check_first
        self._ready: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def load(self, batch: Batch) -> None:
        self._ensure(batch)
        self.inner.load(batch)

    def load_part(self, batch: Batch) -> None:
        self._ensure(batch)
        self.inner.load_part(batch)

    def mark_loaded(self, batch: Batch) -> None:
        self.inner.mark_loaded(batch)

    def close_own(self) -> None:
        self.creator.close()

    def _ensure(self, batch: Batch) -> None:
        named: set[tuple[str, str]] = set()
        todo: list[tuple[TableName, TableName]] = []
        ready = self._ready
        last = None
        for change in batch.changes:
            if type(change) is RowChange:
                key = (change.schema, change.table)
                if key == last or key in ready or key in named:
                    last = key  # runs of one table are common
                    continue
            elif isinstance(change, DdlChange):
                if change.snapshot and change.table and change.source is not None:
                    # A snapshot empties the table before copying it: it must exist first.
                    key = (change.schema, change.table)
                    if key not in ready and key not in named:
                        named.add(key)
                        todo.append((change.source, TableName(*key)))
                elif self.ddl_creates:
                    named |= _tables_named(change)
                continue
            else:
                continue
            named.add(key)  # once per batch
            todo.append((change.source or TableName(change.schema, change.table), TableName(*key)))
        if not todo and not self.check_first:
            return
        with self._lock:
            try:
                if self.check_first:
                    self.creator.check()
                    self.check_first = False
                for source, target in todo:
                    if (target.schema, target.table) not in self._ready:
                        self.creator.ensure(source, target)
                        self._ready.add((target.schema, target.table))
            except ConfigError as exc:  # no type for a column, or a table that does not fit: retrying cannot help
                raise RefusedLoadError(exc.message, pipeline=self.creator.pipeline, stage="load",
                                       table=exc.context.get("table"), batch=batch.id, position=batch.start) from exc
            except LoadError as exc:
                exc.with_context(pipeline=self.creator.pipeline, stage="load", batch=batch.id)
                raise
            except SetlError as exc:  # the source cannot describe now: try again
                raise TransientLoadError(f"cannot plan a target table: {exc}", pipeline=self.creator.pipeline,
                                         stage="load", batch=batch.id, position=batch.start) from exc
            except Exception as exc:  # the target's driver: a lost connection is worth a retry
                self.creator.target.close()
                raise TransientLoadError(f"cannot create a target table: {type(exc).__name__}: {exc}",
                                         pipeline=self.creator.pipeline, stage="load", batch=batch.id,
                                         position=batch.start) from exc


def _tables_named(change: DdlChange) -> set[tuple[str, str]]:
    """The (schema, table) pairs a replicated DDL statement names (it creates, renames or alters them)."""
    found = {(ref.schema or change.schema, ref.table) for ref in change.ddl.tables}
    if change.table:
        found.add((change.schema, change.table))
    return found


def find_creator(load: Any) -> CreateTablesLoad | None:
    """The `CreateTablesLoad` in a composed Load chain (through `inner`), if any."""
    return find_layer(load, CreateTablesLoad)


def check_tables(load: Load, tables: Sequence[TableSchema] | None, *, first_start: bool) -> int:
    """At start: hand the described source tables to the pipeline's table creator, and on the
    pipeline's first start refuse (`ConfigError`, exit 2) an existing target table that does not
    fit, before anything is written. A target that cannot be reached now is checked by the first
    batch instead. Returns the number of planned tables checked (0: none, or no creator)."""
    wrapper = find_creator(load)
    if wrapper is None:
        return 0
    creator = wrapper.creator
    if tables is not None:
        creator.planner.seed(tables)
    if not first_start:
        return 0
    try:
        checked = creator.check()
    except ConfigError:
        raise
    except SetlError as exc:
        if not exc.retryable:
            raise
        if tables is None and exc.context.get("stage") == "select":  # the source's failure, logged once already
            log.info("pipeline=%s target tables not checked at start: the source's tables were not described "
                     "(the first batch will)", creator.pipeline)
        else:
            log.warning("pipeline=%s target tables not checked at start (the first batch will): %s",
                        creator.pipeline, exc)
        wrapper.check_first = True
        return 0
    except Exception as exc:  # noqa: BLE001 - the target's driver: away now
        log.warning("pipeline=%s target tables not checked at start (the first batch will): %s: %s",
                    creator.pipeline, type(exc).__name__, exc)
        wrapper.check_first = True
        return 0
    finally:
        creator.target.close()  # the start-up look is done; the first batch reconnects
    log.info("pipeline=%s target tables checked at start: %d planned", creator.pipeline, checked)
    return checked
