"""A chunk of snapshot reads written into MySQL/MariaDB by ``LOAD DATA LOCAL INFILE``.

A multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` costs the target about a fifth more CPU a row
than ``LOAD DATA`` of the same rows (7.0 against 5.6 µs a sysbench row on MariaDB 10.11), and
in a snapshot the target applying rows is what bounds the copy. So a batch of snapshot reads
only (a chunk: rows the target is not expected to hold yet) is first sent to an InnoDB table as
``LOAD DATA LOCAL`` of its rows (`setl.sinks.mysql_sql.load_data_text`), inside a savepoint.

With ``LOCAL`` the server cannot stop the client mid-file, so it turns what strict mode would
refuse, and a key already there, into warnings: a row skipped, a value cut or converted. The
load is kept only when the server reports no warning, note included, and exactly one row
written per row sent: then every row landed as the upsert's ``INSERT`` would have written it
(the fields are the literals' text, converted by the server as a literal is). Otherwise it is
rolled back to the savepoint and the rows go by the upsert statements, which refuse or apply
them as before; the table is then not tried again by this sink (a replayed chunk, rows the
binlog wrote first: most of its chunks would collide too).

The client sends only the bytes given here whatever file name the server asks for: the
connection has the ``LOCAL_FILES`` capability but not PyMySQL's ``local_infile``, so any other
statement that asks for a file is refused by PyMySQL. A server that refuses ``LOCAL`` (its
``local_infile`` off) makes the sink write statements from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pymysql
from pymysql.constants import COMMAND
from pymysql.protocol import OKPacketWrapper

from setl.adapters import pymysql as pymysql_io
from setl.sinks.mysql_sql import LOAD_DATA_FORMAT, load_data_text, plain_quote

log = logging.getLogger(__name__)

#: MySQL/MariaDB errors of a server that refuses ``LOAD DATA LOCAL``: "the used command is not
#: allowed" (1148), MySQL 8's "loading local data is disabled" (3948), MariaDB's (4166).
REFUSED = frozenset({1148, 3948, 4166})
SAVEPOINT = "setl_load_data"
#: At most this many bytes of input a packet (the server reads packets up to ``max_allowed_packet``).
PACKET_BYTES = 1 << 20


def statement(schema: str, table: str, columns: Sequence[str]) -> str:
    """The ``LOAD DATA LOCAL`` statement for rows of `columns` into ``schema.table``."""
    return (f"LOAD DATA LOCAL INFILE 'setl' INTO TABLE {plain_quote(schema)}.{plain_quote(table)} "
            f"{LOAD_DATA_FORMAT} ({', '.join(map(plain_quote, columns))})")


def load_local(connection: pymysql.connections.Connection, text: str, data: bytes, packet: int = PACKET_BYTES
               ) -> tuple[int, int]:
    """Run the ``LOAD DATA LOCAL`` statement `text` on `connection`, sending `data` as the file in
    packets of at most `packet` bytes: (rows written, warnings). A server error is raised as
    PyMySQL raises it; the connection stays usable."""
    conn: Any = connection
    pymysql_io.send_command(conn, COMMAND.COM_QUERY, text)  # PyMySQL has no hook for a file in memory
    first = pymysql_io.read_packet(conn)  # raises the server's error
    if not first.is_load_local_packet():
        raise pymysql.err.OperationalError(2014, "LOAD DATA LOCAL: the server did not ask for the data")
    view = memoryview(data)
    try:
        for start in range(0, len(data), packet):
            conn.write_packet(bytes(view[start:start + packet]))
    finally:
        conn.write_packet(b"")  # the end of the file: the server answers either way
    ok = OKPacketWrapper(pymysql_io.read_packet(conn))
    conn.server_status = ok.server_status
    return ok.affected_rows, ok.warning_count


#: One ``LOAD DATA`` of a table's rows: (statement, its input, its rows).
Input = tuple[str, bytes, int]


def inputs(schema: str, table: str, groups: Iterable[tuple[Sequence[str], Sequence[Mapping[str, Any]]]]
           ) -> list[Input] | None:
    """The ``LOAD DATA`` inputs of a table's rows grouped by column list; None when a value is of a
    type only a statement writes (`setl.sinks.mysql_sql.load_data_text`)."""
    found = []
    for columns, images in groups:
        data = load_data_text(images)
        if data is None:
            return None
        found.append((statement(schema, table, columns), data, len(images)))
    return found


class LoadData:
    """One sink's use of ``LOAD DATA`` for snapshot reads: which tables may take it, and sending.
    Safe for the workers that ask `may` and the threads that `send` (plain reads and adds)."""

    def __init__(self, pipeline: str, describe: Callable[[BaseException], str]) -> None:
        self.pipeline = pipeline
        self._describe = describe
        #: per target table: whether its engine is InnoDB (a load can be rolled back to a savepoint)
        self.transactional: dict[tuple[str, str], bool] = {}
        #: tables where a load gave warnings: their rows go by statements
        self.collided: set[tuple[str, str]] = set()
        #: the server refused LOAD DATA LOCAL (its ``local_infile`` is off): statements only
        self.refused = False

    def may(self, ident: tuple[str, str]) -> bool:
        """Whether the table (schema, table) may take its snapshot reads by ``LOAD DATA``: an InnoDB
        table whose loads gave no warning yet, on a server that allows ``LOCAL``."""
        return not self.refused and self.transactional.get(ident, False) and ident not in self.collided

    def forget(self, ident: tuple[str, str] | None = None) -> None:
        """After a DDL (of `ident`, or of any table): learn the engine again, and try loads again."""
        if ident is None:
            self.transactional.clear()
            self.collided.clear()
        else:
            self.transactional.pop(ident, None)
            self.collided.discard(ident)

    def send(self, conn: pymysql.connections.Connection, cur: Any, ident: tuple[str, str],
             loads: Sequence[Input], packet: int) -> bool:
        """Send `loads` inside a savepoint: True when every row landed with no warning; False when
        nothing of it was kept (rolled back to the savepoint), and the table's rows go by
        statements from now on (see the module docstring)."""
        cur.execute(f"SAVEPOINT {SAVEPOINT}")
        for text, data, rows in loads:
            try:
                written, warnings = load_local(conn, text, data, packet)
            except pymysql.err.MySQLError as exc:
                if (exc.args[0] if exc.args else None) not in REFUSED:
                    raise
                cur.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
                self.refused = True
                log.info("pipeline=%s stage=load table=%s.%s: the target refuses LOAD DATA LOCAL (%s); "
                         "snapshot rows go by INSERT statements", self.pipeline, *ident, self._describe(exc))
                return False
            if warnings or written != rows:
                cur.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
                self.collided.add(ident)
                log.info("pipeline=%s stage=load table=%s.%s: a LOAD DATA of %d snapshot rows wrote %d with "
                         "%d warning(s) (rows there already, or values the server would convert); rolled "
                         "back, and this table's rows go by upsert statements", self.pipeline, *ident,
                         rows, written, warnings)
                return False
        return True


__all__ = ["PACKET_BYTES", "REFUSED", "SAVEPOINT", "Input", "LoadData", "inputs", "load_local", "statement"]
