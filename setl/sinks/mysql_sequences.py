"""The MySQL target's sequences (MariaDB ``CREATE SEQUENCE``): a sequence's state rows written as
its state, and a sequence the target lacks created first (`MysqlSequences`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pymysql.connections import Connection

from setl.ddl import parse
from setl.errors import LoadError, RefusedLoadError
from setl.model import RowChange
from setl.sinks.merge import TableChanges
from setl.sinks.mysql_sql import plain_quote, quote, table_name, to_db

log = logging.getLogger(__name__)


def _create_if_missing(definition: str, schema: str, name: str) -> str:
    """CREATE SEQUENCE IF NOT EXISTS `schema`.`name` with the options of `definition` (a CREATE
    SEQUENCE, such as the source's SHOW CREATE SEQUENCE), or with none when it is not one."""
    parsed = parse(definition) if definition else None
    options = "".join(t.text for t in parsed.tokens[parsed.tables[0].end:]) if (
        parsed is not None and parsed.kind == "create_sequence") else ""
    return f"CREATE SEQUENCE IF NOT EXISTS {plain_quote(schema)}.{plain_quote(name)}{options}"


class MysqlSequences:
    """Writes the state rows of the pipeline's sequences into a MySQL or MariaDB target.

    `apply_state` writes a sequence's last state in one INSERT, in the batch's transaction on the
    connection given; a sequence the target lacks is created first on a connection of its own
    (`connect`), since DDL commits the open transaction. The sequences known to exist are
    remembered until `forget` (after any DDL). Safe for the sink's threads: at worst two threads
    both check one sequence.
    """

    def __init__(self, pipeline: str, connect: Callable[[], Connection]) -> None:
        self.pipeline = pipeline
        self._connect = connect
        self._known: set[tuple[str, str]] = set()

    def forget(self) -> None:
        self._known.clear()

    def apply_state(self, conn: Connection, table: TableChanges) -> None:
        """One INSERT of the last state row of a sequence in this part of the batch: MariaDB takes an
        INSERT into a sequence as its new state (every column), so applying it twice is applying it
        once. Never a DELETE. A sequence the target lacks is created first (`ensure`)."""
        last: RowChange | None = next((c for c in reversed(table.sequence) if c.after is not None), None)
        if last is None or last.after is None:
            return  # a sequence's state is never deleted; nothing to write
        if getattr(conn, "loop_mark", None) is not None:
            raise RefusedLoadError(f"sequence {table.schema}.{table.table}: a two-way channel with the marker loop "
                            "guard cannot mark a sequence's state (MariaDB logs it outside the transaction holding the "
                            "mark), so it would loop between the sites. Fix: grant the loader's user BINLOG REPLAY, "
                            "BINLOG ADMIN (loop_guard server_id), or exclude the sequence from the channel",
                            pipeline=self.pipeline, stage="load", table=f"{table.schema}.{table.table}",
                            position=last.position)
        self.ensure(conn, table.schema, table.table, last.sequence or "")
        image = last.after
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {table_name(table.schema, table.table)} ({', '.join(map(quote, image))}) "
                        f"VALUES ({', '.join(['%s'] * len(image))})", [to_db(v) for v in image.values()])

    def ensure(self, conn: Connection, schema: str, name: str, definition: str) -> None:
        """Create the target sequence `schema`.`name` if it does not exist, from `definition` (the
        source's CREATE SEQUENCE, names mapped) or, without one, with default options (the state
        row written next sets every option). DDL commits the open transaction in MySQL, so it runs
        on a connection of its own: the batch's transaction stays whole."""
        if (schema, name) in self._known:
            return
        with conn.cursor() as cur:
            cur.execute("SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                        (schema, name))
            found = cur.fetchone()
        if found is not None:
            if str(found[0]).upper() != "SEQUENCE":
                raise LoadError(f"target table {schema}.{name} is not a sequence, but the source's is: its state "
                                "rows cannot be applied", pipeline=self.pipeline, stage="load",
                                table=f"{schema}.{name}")
            self._known.add((schema, name))
            return
        statement = _create_if_missing(definition, schema, name)
        side = self._connect()
        try:
            with side.cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(schema)}", ())
                cur.execute(statement)
            side.commit()
        finally:
            side.close()
        log.info("pipeline=%s stage=load table=%s.%s: the target had no such sequence; created: %s",
                 self.pipeline, schema, name, statement)
        self._known.add((schema, name))
