"""What the binlog source's test modules share: one server_id counter, the `sources` fixture,
and small readers of a source and its server.

The `sources` fixture lives in this directory's conftest.py. The server_ids come from one
counter for the whole run, so no two sources of these modules ever read with the same
id (the server would disconnect the older one).
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from setl.model import Position, Transaction
from setl.sources.mysql_binlog import MysqlBinlogSource
from tests.helpers.wait import wait_until

_server_ids = itertools.count(7001)


def make_source(server: Any, start: Any = "latest", **kwargs: Any) -> MysqlBinlogSource:
    """A source reading `server` with a server_id no other reader in this run uses (not opened)."""
    return MysqlBinlogSource.from_config(server.source_config(next_server_id(), start), pipeline="t", **kwargs)


def next_server_id() -> int:
    """A binlog server_id that no other reader of this run uses."""
    return next(_server_ids)


def head(server: Any) -> Position:
    """The server's binlog end (``SHOW MASTER STATUS``), without a GTID."""
    file, pos = server.query("SHOW MASTER STATUS")[0][:2]
    return Position(file, int(pos))


def bare(position: Position | None) -> Position | None:
    """The file and offset of a position, without its GTID set (what SHOW MASTER STATUS shows)."""
    return None if position is None else attrs.evolve(position, gtid=None)


def read(src: MysqlBinlogSource, count: int, schema: str | None = None, timeout: float = 15) -> list[Transaction]:
    """Poll until `count` transactions touching `schema` (all if None) arrived."""
    got: list[Transaction] = []

    def more() -> bool:
        tx = src.poll(0.2)
        if tx is not None and (schema is None or any(c.schema == schema for c in tx.changes)):
            got.append(tx)
        return len(got) >= count

    wait_until(more, timeout=timeout, interval=0, message=f"{count} transactions (got {len(got)})")
    return got


def execute(server: Any, db: str, *statements: str | tuple) -> None:
    """Run statements one by one (autocommit) on one connection to `db`; a tuple is (sql, args)."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                if isinstance(statement, tuple):
                    cur.execute(*statement)
                else:
                    cur.execute(statement)
    finally:
        conn.close()
