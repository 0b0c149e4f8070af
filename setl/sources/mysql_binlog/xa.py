"""Two-phase XA on the binlog source: the rows of a prepared XA transaction read again from the
binlog when its XA COMMIT arrives (`PreparedXa`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pymysql

from setl.binlog_events import MariadbGtid, MysqlGtid, Query, Rotate, Rows, TableMap, XaPrepare
from setl.errors import SourceError
from setl.model import Position
from setl.sources.mysql_binlog.assembler import _EVENTS, _POSITION_EVENTS
from setl.sources.mysql_binlog.connector import _Connector
from setl.sources.mysql_binlog.decoding import TableKind, XaKey, _Item, _row_items, _TableInfo
from setl.sources.mysql_binlog.fast import FastStream, RowDecoders
from setl.sources.mysql_binlog.server import SourceServer
from setl.sources.mysql_binlog.statements import _XA_END, LoggedStatement, dml_text
from setl.sources.mysql_binlog.stream import BinlogStream

log = logging.getLogger("setl.sources.mysql_binlog")


class PreparedXa:
    """Reads the rows of a prepared XA transaction again from the binlog, for the assembler to hand
    on at its XA COMMIT (`rows` is the assembler's `prepared` callable).

    It runs on the reader thread and blocks while it reads: a second, non-blocking binlog dump
    (server_id 0) over one file at a time, ended before it returns. Tables are described with
    `table_kind`, as the reader's own stream describes them. A prepared transaction no binlog holds
    any more is a `SourceError` naming the XA COMMIT's position.
    """

    def __init__(self, server: SourceServer, table_kind: Callable[[str, str], TableKind], pipeline: str = "",
                 precisions: Callable[[str, str], Any] | None = None) -> None:
        self.server = server
        self.table_kind = table_kind
        self.pipeline = pipeline
        self.precisions = precisions  # MariaDB's pre-10.1 temporal columns' (`fast.RowDecoders`)

    def rows(self, key: XaKey, start: Position | None, commit: Position) -> list[_Item]:
        """The row changes of prepared XA transaction `key`, read again from the binlog (runs on the
        reader thread when its XA COMMIT group, starting at `commit`, arrives), in their order with its
        row changes logged as statements (items ``(None, None, None, LoggedStatement)``), for the
        assembler to judge.

        From `start` when this reader saw its XA PREPARE; else (a restart between XA PREPARE and
        XA COMMIT) from the last XA PREPARE of `key` before `commit`, searching the binlogs newest
        first. A prepared transaction no binlog holds any more stops the pipeline.
        """
        xid = f"X'{key[1].hex()}',X'{key[2].hex()}',{key[0]}"
        if start is not None:
            found = self._scan(key, start, commit, first_only=True)
        else:
            conn = self.server.connect()
            try:
                logs = [str(row[0]) for row in self.server.query(conn, "SHOW BINARY LOGS")]
            finally:
                conn.close()
            found = None
            for name in reversed(logs[: logs.index(commit.log) + 1] if commit.log in logs else []):
                found = self._scan(key, Position(name, 4), commit)
                if found is not None:
                    log.info("pipeline=%s found the XA PREPARE of %s (committed at %s) in %s", self.pipeline,
                             xid, commit, name)
                    break
        if found is None:
            raise SourceError(f"XA COMMIT {xid} at {commit}: its XA PREPARE is no longer in the binlogs of "
                              f"{self.server.host}:{self.server.port} (purged?), so its rows cannot be applied; "
                              "reload the tables it touched and reset the pipeline's position past it", position=commit)
        return found

    def _scan(self, key: XaKey, start: Position, stop: Position, first_only: bool = False) -> list[_Item] | None:
        """The rows of the last XA PREPARE group of `key` in ``[start, stop)`` of one binlog file."""
        connector = _Connector(tls=self.server.ssl is not None)
        # server_id 0 with a non-blocking dump, as mariadb-binlog reads: it does not displace the
        # pipeline's own stream (a second reader with its server_id would).
        stream = BinlogStream(connector, self.server.stream_settings(), server_id=0, at=start, gtid=None,
                              flavor="", events=_EVENTS, table_maps=None, blocking=False)
        reader = FastStream(stream, RowDecoders(precisions=self.precisions))
        tables: dict[int, _TableInfo] = {}
        group: list[_Item] = []
        found: list[_Item] | None = None
        try:
            stream.connect()
            while True:
                event = reader.fetchone()
                if event is None:
                    return found
                if isinstance(event, Rotate):
                    if event.next_binlog != start.log:
                        return found
                    continue
                if not isinstance(event, _POSITION_EVENTS) and (start.log, event.header.log_pos) > (
                        stop.log, stop.offset):
                    return found
                if isinstance(event, (MariadbGtid, MysqlGtid)):
                    group = []
                elif isinstance(event, TableMap):
                    info = _TableInfo.from_table_map(event.layout)
                    tables[event.layout.table_id] = info.with_kind(self.table_kind(info.schema, info.table))
                elif isinstance(event, Rows) and event.table_id in tables:
                    if not tables[event.table_id].sequence:
                        group.extend(_row_items(event, tables[event.table_id]))
                elif isinstance(event, XaPrepare) and not event.one_phase and (
                        event.format_id, event.gtrid, event.bqual) == key:
                    found = group
                    if first_only:
                        return found
                elif isinstance(event, Query):
                    match = _XA_END.match(event.query)
                    if match and (int(match["format"]), bytes.fromhex(match["gtrid"]),
                                  bytes.fromhex(match["bqual"])) == key:
                        found = None  # finished before: a later XA PREPARE reuses the XID
                    elif event.query.strip().upper().startswith("XA START"):
                        group = []
                    elif dml_text(event.query) is not None:
                        # a row change logged as a statement: the assembler judges it at the XA COMMIT
                        where = f"{start.log}:{event.header.log_pos - event.header.event_size}"
                        group.append((None, None, None, LoggedStatement(event.schema or "", event.query, where)))
        except pymysql.MySQLError as exc:
            raise SourceError(f"cannot read {start.log} of {self.server.host}:{self.server.port} again for the XA "
                              f"PREPARE of the XA COMMIT at {stop}: {exc}", position=stop) from exc
        finally:
            stream.close()
            connector.shutdown()
