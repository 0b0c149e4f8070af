"""Who waits on a test's lock: the sessions blocked by one connection's open transaction.

Counted per holder, never server-wide: the MariaDB and PostgreSQL servers are shared by the whole
test session, and a lock wait anywhere else must not pass for the wait a test expects. (A CI run
of the frozen-leader test found the batch it meant to freeze inside its transaction committed in
the target: the leader cannot have been waiting on the test's lock, so the server-wide count had
passed on some other wait.)
"""

from __future__ import annotations

from typing import Any


def mariadb_lock_waits(server: Any, holder: Any) -> int:
    """Transactions waiting for a row lock held by `holder`'s transaction (a PyMySQL connection).

    Poll at most every 0.3 s: InnoDB refreshes INNODB_TRX and INNODB_LOCK_WAITS only after 100 ms
    without a read of them, so faster polling can see the same stale answer forever."""
    return int(server.query(
        "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w"
        " JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id"
        " WHERE b.trx_mysql_thread_id = %s", (holder.thread_id(),))[0][0])


def postgres_lock_waits(server: Any, holder: Any) -> int:
    """Sessions waiting for a lock held by `holder`'s transaction (a psycopg connection)."""
    return int(server.query("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                            (holder.info.backend_pid,))[0][0])


__all__ = ["mariadb_lock_waits", "postgres_lock_waits"]
