"""The epoch fence of an SQL target: a deposed writer's transactions never commit after a new
leader takes the target (`TargetFence`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Generic, TypeVar

from setl.errors import LoadError, TransientLoadError
from setl.model import Batch, Position
from setl.sinks.sql_dialect import SqlDialect
from setl.sinks.sql_failures import CurrentTable, LoadFailures
from setl.sinks.sql_positions import FenceBusy, PositionStore

log = logging.getLogger(__name__)

C = TypeVar("C")  # a driver connection


class TargetFence(Generic[C]):
    """The pipeline's fence on the target, through a `PositionStore`'s fence and session tables.

    Every connection registers itself (server session id, this process's token, the pipeline) in
    the session table when it connects, before it writes anything. The fence row holds the highest
    epoch that took the target. Every batch or part transaction first reads it under a shared lock
    (`check`) and refuses a batch of an older epoch with a `LoadError`; the lock is held to
    COMMIT, so the fence cannot move under a running transaction. The first batch of an epoch
    higher than any this sink has fenced takes the fence (`take`): it kills every registered
    session of the pipeline that belongs to another process (MariaDB ``KILL CONNECTION``,
    PostgreSQL ``pg_terminate_backend``), then raises the fence row's epoch with a short lock
    timeout, killing and retrying until it holds (at most `timeout` seconds). A killed session's
    transaction is rolled back by the server, so a deposed leader frozen at any point of its
    transaction (GC, SIGSTOP, VM pause) never commits after the takeover, and the new leader does
    not wait for the freeze to end. The account needs the right to kill those sessions (its own
    sessions need none; otherwise MariaDB ``CONNECTION ADMIN``/``SUPER``, PostgreSQL membership of
    the same role or ``pg_signal_backend``).

    `epoch` is the highest epoch this sink took the fence for (0: none yet); one thread takes it
    for an epoch, the others see it taken. Safe for the threads of one sink.
    """

    def __init__(self, store: PositionStore[C], dialect: SqlDialect[C], failures: LoadFailures, *,
                 timeout: float, writing: CurrentTable) -> None:
        """`dialect` ends the transaction on a connection, `failures` names a batch in an error,
        `writing` is set to the table whose position is read (None when done)."""
        self.store = store
        self.epoch = 0
        self.timeout = timeout
        self._dialect = dialect
        self._failures = failures
        self._writing = writing
        self._lock = threading.Lock()

    def _refused(self, batch: Batch, stored: int) -> LoadError:
        return LoadError(f"refused: batch epoch {batch.epoch} is older than epoch {stored} the target "
                         f"holds for this pipeline (a newer writer owns it)", **self._failures.context(batch))

    def check(self, conn: C, batch: Batch, table: str | None = None) -> Position | None:
        """In the open transaction: take the fence first if `batch` has a newer epoch than any
        taken, then hold the fence row shared to COMMIT and refuse a batch of an older epoch.
        With a `table`, its position is read with the fence (`fence_and_table_position`) and
        returned, locked to COMMIT."""
        if batch.epoch > self.epoch:
            self._dialect.commit(conn)  # nothing is written yet; the fence is taken outside this transaction
            self.take(conn, batch)
        table_at = None
        if table is None:
            stored = self.store.shared_epoch(conn)
        else:
            self._writing.table = table
            stored, table_at = self.store.fence_and_table_position(conn, table)
            self._writing.table = None
        if stored is not None and batch.epoch < stored:
            raise self._refused(batch, stored)
        return table_at

    def take(self, conn: C, batch: Batch | None) -> None:
        """Kill the other processes' sessions of the pipeline and raise the fence row to the
        batch's epoch (without a batch: one above the stored epoch), retrying both until the row
        lock is ours (see the class docstring)."""
        with self._lock:
            if batch is not None and batch.epoch <= self.epoch:
                return  # another thread of this sink took it meanwhile
            stored_epoch = self.store.read_position(conn)[1]
            if batch is not None and stored_epoch is not None and stored_epoch > batch.epoch:
                raise self._refused(batch, stored_epoch)  # a newer writer owns it: kill nothing of it
            deadline = time.monotonic() + self.timeout
            killed = 0
            while True:
                killed += self.store.kill_others(conn)
                try:
                    stored = self.store.raise_fence(conn, batch.epoch if batch is not None else None)
                    break
                except FenceBusy:
                    self._dialect.rollback(conn)
                    if time.monotonic() > deadline:
                        raise TransientLoadError(
                            f"could not take the fence for epoch "
                            f"{batch.epoch if batch else 'above the stored one'} within "
                            f"{self.timeout:.0f} s: its row stays locked by a session setl "
                            f"cannot kill", **self._failures.context(batch)) from None
            if batch is not None and stored > batch.epoch:
                raise self._refused(batch, stored)
            self.epoch = stored
            log.info("pipeline=%s stage=load: took the %s target's fence for epoch %d (%d other "
                     "session(s) killed)", self.store.pipeline, self._dialect.name, stored, killed)
