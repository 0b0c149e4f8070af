"""A chunk of snapshot reads written into PostgreSQL with one ``COPY`` straight into its table.

The PostgreSQL sink writes a group of upserts by ``COPY`` into a temporary table, then one
``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE``: each row is written twice, and the
``INSERT ... SELECT`` was over half of the loading thread's time in a snapshot into PostgreSQL.
A batch of snapshot reads only (a chunk: rows the target is not expected to hold yet) is tried
first as a ``COPY`` into the table itself, inside a savepoint:

* it lands as the upsert would only if no row of it is there already, so it is tried only when
  the table has a unique index on exactly the key columns (immediate, not partial, no
  expression, no included column; read from the catalog in the batch's transaction), which makes
  any row already there a unique violation;
* a unique violation (a chunk replayed after a crash, rows the binlog wrote first, another unique
  index) rolls back to the savepoint, and the group goes by the two-step upsert as before; the
  table is then not tried again by this sink (most of its chunks would collide too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import psycopg.errors

from setl.sinks.postgresql_ddl import pg_name

_SAVEPOINT = "setl_copy_straight"

#: Whether the table (regclass text) has an immediate, plain unique index on exactly these columns.
_UNIQUE_ON = (
    "SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(%s) AND i.indisunique"
    " AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnatts = i.indnkeyatts"
    " AND i.indnatts = %s AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text COLLATE \"C\")"
    " FROM pg_attribute a"
    " WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)) = %s::text[])")


def unique_on_key(conn: psycopg.Connection, qualified: str, key: Sequence[str]) -> bool:
    """Whether the table `qualified` (its quoted ``schema.table``) has a unique index on exactly the
    columns `key` (target names, mapped by `pg_name` as the table was made); asked on `conn`, in
    its open transaction. Both sides sorted by code point (Python's order, PostgreSQL's "C")."""
    names = sorted(pg_name(c) for c in key)
    row = conn.execute(_UNIQUE_ON, (qualified, len(names), names)).fetchone()
    return bool(row and row[0])


def copy_straight(cur: Any, copy: Callable[[], None]) -> bool:
    """Run `copy` (a ``COPY`` into the table) inside a savepoint: True when it landed, False when a
    row was there already (unique violation), everything it wrote rolled back."""
    cur.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        copy()
    except psycopg.errors.UniqueViolation:
        cur.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return False
    cur.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
    return True
