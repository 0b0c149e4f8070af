"""How an SQL target names its failures and retries the transient ones (`LoadFailures`), and which
table a thread is writing, for those names (`CurrentTable`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from setl.ddl import Statement
from setl.errors import LoadError, RefusedLoadError, TableRefused, TransientLoadError
from setl.model import STATEMENT_LOGGED, Batch, DdlChange, Quarantined
from setl.retry import call_with_retries
from setl.tls import tls_failure

log = logging.getLogger(__name__)

T = TypeVar("T")


class TargetTableMissing(Exception):
    """Raised by a dialect's error classifier: the statement named a table that does not exist."""


class DriverErrors(Protocol):
    """What a dialect says of its driver's errors (the part of `setl.sinks.sql_dialect.SqlDialect`
    that `LoadFailures` reads)."""

    name: str  # mysql, postgresql: named in messages

    def classify(self, exc: BaseException) -> type[LoadError] | type[TargetTableMissing] | None:
        """TransientLoadError for errors worth a replay, TargetTableMissing for a missing table,
        RefusedLoadError for rows the target refuses whatever the retry, TableRefused for one table's
        rows the target refuses whatever the retry (a value, a privilege), LoadError for other driver
        errors, None for errors that are not the driver's."""

    def describe(self, exc: BaseException) -> str:
        """One line for a driver error."""


class CurrentTable:
    """The target table the calling thread is writing (None: none, or not known), for the messages
    of its failures. One per sink, shared by its steps, fence and position store."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def table(self) -> str | None:
        return getattr(self._local, "table", None)

    @table.setter
    def table(self, table: str | None) -> None:
        self._local.table = table


def load_context(pipeline: str, batch: Batch | None, table: str | None = None) -> dict[str, Any]:
    """The context of a setl error of `pipeline`'s load about `batch` (and `table`)."""
    return {
        "pipeline": pipeline,
        "stage": "load",
        "table": table,
        "batch": batch.id if batch is not None else None,
        "position": batch.end if batch is not None else None,
    }


#: DDL kinds whose only table is the statement's own: quarantining that table holds back all it changes.
_ONE_TABLE_DDL = frozenset({"alter_table", "create_table", "drop_table", "create_index", "drop_index",
                            "truncate_table"})


def changes_one_table(statement: Statement) -> bool:
    """Whether `statement` changes its own table only (it names no other and renames none), so that
    holding back that table's changes from it on (quarantine) holds back everything it touches."""
    return (statement.kind in _ONE_TABLE_DDL and len(statement.tables) == 1 and not statement.renames
            and not statement.like)


def ddl_refused(cause: str, change: DdlChange, statement: Statement, context: dict[str, Any]) -> LoadError:
    """The error for a table DDL the target refuses whatever the retry (`cause`: the target's one line,
    or why it cannot be expressed there): a `TableRefused` of its table (quarantine or pause,
    docs/quarantine.md) when the statement changes its own table only (`changes_one_table`), a
    `RefusedLoadError` (pause) when it names or renames others. `context` names the batch; the position
    is the statement's."""
    text = " ".join(change.statement.split())
    context = {**context, "table": change.qualified_table, "position": change.position or context.get("position")}
    if not changes_one_table(statement):
        return RefusedLoadError(
            f"the target refuses this DDL ({cause}): {text}; nothing of it is applied. It names more than one table,"
            " so it pauses the pipeline whatever on_table_error says: fix the cause on the target, then `setl "
            "resume`", **context)
    return TableRefused(
        f"the target refuses this DDL ({cause}): {text}; nothing of it is applied. Fix the cause on the target, then "
        "resume (a quarantined table: `setl resume --table` applies it first, then its kept rows); "
        "docs/quarantine.md", **context)


def refuse_replay(pipeline: str, found: Quarantined) -> None:
    """Raise a `TableRefused` when quarantined table `found` cannot be replayed: its quarantine began
    at a row change logged as a statement (`setl.model.DdlChange.logged_rows`), whose rows setl never
    had, so nothing kept can stand in for it; only a copy (`setl snapshot --table`) brings it back."""
    if found.cause.startswith(STATEMENT_LOGGED):
        raise TableRefused(f"{found.table} cannot be replayed, a snapshot is needed (`setl snapshot --table` of its "
                           f"source table): its quarantine began at {found.first} with {found.cause}",
                           pipeline=pipeline, stage="load", table=found.table, position=found.first)


class LoadFailures:
    """The failures of one SQL sink, as setl errors, and its in-place retries.

    Every error names the pipeline, the stage (load), the table being written, the batch id and
    its end position (`context`). A driver error becomes a `TransientLoadError` (worth a replay),
    a `RefusedLoadError` (the same rows would fail the same way), or a `LoadError` (a missing
    table named as such), as the dialect's `classify` says, with the dialect's one-line
    `describe` of it (`translate`, `connect_failed`). `retrying` runs a whole transaction again on
    a `TransientLoadError`, at most `max_attempts` times with backoff (`setl.retry`), and when the
    attempts run out raises a `TransientLoadError` saying so. It keeps no state: safe for the
    sink's threads.
    """

    def __init__(self, *, pipeline: str, errors: DriverErrors, max_attempts: int, initial_backoff: float,
                 max_backoff: float, sleep: Callable[[float], None]) -> None:
        """`errors`: the dialect's `classify` and `describe` of its driver's errors."""
        self.pipeline = pipeline
        self.dialect = errors.name
        self._classify = errors.classify
        self._describe = errors.describe
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._sleep = sleep

    def context(self, batch: Batch | None, table: str | None = None) -> dict[str, Any]:
        """The context of a setl error about `batch` (and `table`)."""
        return load_context(self.pipeline, batch, table)

    def translate(self, exc: Exception, batch: Batch | None, table: str | None) -> LoadError:
        """A driver error raised while writing `table` (None: not known) for `batch`, as a setl error."""
        kind = self._classify(exc)
        if kind is TargetTableMissing:
            return LoadError(f"target table {table} does not exist ({self._describe(exc)})",
                             **self.context(batch, table=table))
        if kind is TransientLoadError:
            return TransientLoadError(self._describe(exc), **self.context(batch, table=table))
        if kind is TableRefused:  # one table's rows fail the same way: quarantine it or pause
            if table:
                return TableRefused(self._describe(exc), **self.context(batch, table=table))
            return RefusedLoadError(self._describe(exc), **self.context(batch, table=table))
        if kind is RefusedLoadError:  # the same rows would fail the same way: no retries
            return RefusedLoadError(self._describe(exc), **self.context(batch, table=table))
        return LoadError(self._describe(exc), **self.context(batch, table=table))

    def connect_failed(self, exc: Exception, batch: Batch | None, config: Any) -> LoadError:
        """A failure to connect to the target of `config`: a TLS failure is permanent, a transient
        one is a `TransientLoadError`; a setl error raised while preparing the session stands."""
        if isinstance(exc, LoadError):
            exc.with_context(**self.context(batch))
            return exc
        cause = tls_failure(exc)
        if cause is not None:  # permanent (setl.retry.classify): no reconnecting
            host = f"{getattr(config, 'host', '?')}:{getattr(config, 'port', '?')}"
            return LoadError(f"cannot connect to the {self.dialect} target {host} over TLS: {cause} "
                             "(see target.ssl)", **self.context(batch))
        kind = TransientLoadError if self._classify(exc) is TransientLoadError else LoadError
        return kind(f"cannot connect to the {self.dialect} target: {self._describe(exc)}", **self.context(batch))

    def retrying(self, fn: Callable[[], T], batch: Batch | None) -> T:
        """`fn()`, run again on a `TransientLoadError` (see the class docstring)."""
        def before_retry(exc: BaseException) -> None:
            log.warning("pipeline %s: %s target: %s; reconnecting and replaying", self.pipeline,
                        self.dialect, exc)

        try:
            return call_with_retries(
                fn,
                attempts=self.max_attempts,
                initial=self.initial_backoff,
                maximum=self.max_backoff,
                retry_on=(TransientLoadError,),
                sleep=self._sleep,
                before_retry=before_retry,
            )
        except TransientLoadError as exc:
            raise TransientLoadError(f"{self.max_attempts} attempts in a row failed: {exc.message}",
                                     **exc.context) from exc
