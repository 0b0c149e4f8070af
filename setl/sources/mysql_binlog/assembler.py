"""Binlog events into transactions (on the reader thread), GTID sets, and the tables each schema holds.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import attrs
from pymysqlreplication.gtid import Gtid, GtidSet

from setl.adapters import replication
from setl.binlog_events import (
    POSITION_EVENTS,
    Heartbeat,
    MariadbGtid,
    MysqlGtid,
    Query,
    Rotate,
    Rows,
    SkippedRows,
    TableLayout,
    TableMap,
    Unknown,
    XaPrepare,
    Xid,
)
from setl.errors import CorruptEvent, SetlError, SourceError, UnreadableEvent
from setl.model import Change, Position, RowChange, Transaction
from setl.sources.mysql_binlog.ddl_events import DdlEvents, KnownTables
from setl.sources.mysql_binlog.decoding import (
    TableKind,
    XaKey,
    _Item,
    _row_items,
    _TableInfo,
)
from setl.sources.mysql_binlog.marks import MarkGuard
from setl.sources.mysql_binlog.rollbacks import Rollbacks
from setl.sources.mysql_binlog.skipping import unread
from setl.sources.mysql_binlog.statements import (
    _IGNORED_IN_TX,
    _XA_END,
    LoggedStatement,
    StatementJudge,
    StatementMarker,
    dml_text,
)

log = logging.getLogger("setl.sources.mysql_binlog")


# Events that only move the read position: outside a transaction they become position marks.
_POSITION_EVENTS = POSITION_EVENTS
# Every event the reader asks the library for (`setl.adapters.replication.READ_EVENTS`): the library
# drops the others before building them, only the kinds in `IGNORED_EVENTS`, which setl may pass
# over. Every kind the library does not know arrives as an `Unknown` and is judged by
# `refuse_unknown`: setl never skips an event it has not judged (compressed events arrive inflated:
# `compressed`).
_EVENTS = list(replication.READ_EVENTS)
#: The event kinds that the library knows and setl passes over, and why that loses nothing.
IGNORED_EVENTS: dict[str, str] = {
    "MariadbAnnotateRowsEvent": "the statement text of the rows events after it (binlog_annotate_row_events)",
    "RowsQueryLogEvent": "the statement text of the rows events after it (MySQL binlog_rows_query_log_events)",
    "IntvarEvent": "an auto-increment value for a statement-logged query, which is judged itself",
    "RandEvent": "RAND()'s seed for a statement-logged query, which is judged itself",
    "UserVarEvent": "a user variable for a statement-logged query, which is judged itself",
    "BeginLoadQueryEvent": "the file of a statement-logged LOAD DATA, judged at its EXECUTE_LOAD_QUERY event",
    "MariadbStartEncryptionEvent": "encrypt_binlog=ON: the server decrypts the events it sends its readers",
}
#: Event types the library does not know that setl passes over (type -> name, why).
_IGNORED_TYPES: dict[int, tuple[str, str]] = {
    0x09: ("APPEND_BLOCK_EVENT", "a block of a statement-logged LOAD DATA's file, judged at its EXECUTE_LOAD_QUERY"),
    0x0B: ("DELETE_FILE_EVENT", "a statement-logged LOAD DATA that failed: nothing was loaded"),
    0x1C: ("IGNORABLE_LOG_EVENT", "an event its server marks as safe for readers to ignore"),
    0x22: ("ANONYMOUS_GTID_LOG_EVENT", "a transaction's start without a GTID (MySQL gtid_mode=OFF)"),
    0x29: ("TRANSACTION_CONTEXT_EVENT", "MySQL group replication's certification data"),
    0x2A: ("VIEW_CHANGE_EVENT", "MySQL group replication's membership change"),
    0x2C: ("HEARTBEAT_LOG_EVENT_V2", "a heartbeat of an idle server"),
}
#: Event types setl refuses: (name, why setl cannot apply it exactly, the fix).
_REFUSED_TYPES: dict[int, tuple[str, str, str]] = {
    0x1A: ("INCIDENT_EVENT", "the server recorded an incident: changes may be missing from its binlog",
           "compare the tables (setl verify) and re-copy them (setl snapshot), then move the position past it "
           "(setl position reset)"),
    0x28: ("TRANSACTION_PAYLOAD_EVENT", "a transaction compressed by MySQL's binlog_transaction_compression=ON",
           "SET GLOBAL binlog_transaction_compression=OFF (and in the writing sessions), then re-copy the "
           "transaction's tables"),
    0x27: ("PARTIAL_UPDATE_ROWS_EVENT", "JSON columns updated in place, logged as diffs "
                                        "(MySQL binlog_row_value_options=PARTIAL_JSON)",
           "SET GLOBAL binlog_row_value_options='' (and in the writing sessions), then re-copy the table"),
}
for _old, _name in ((0x01, "START_EVENT_V3"), (0x06, "LOAD_EVENT"), (0x07, "SLAVE_EVENT"), (0x08, "CREATE_FILE_EVENT"),
                    (0x0A, "EXEC_LOAD_EVENT"), (0x0C, "NEW_LOAD_EVENT"), (0x14, "PRE_GA_WRITE_ROWS_EVENT"),
                    (0x15, "PRE_GA_UPDATE_ROWS_EVENT"), (0x16, "PRE_GA_DELETE_ROWS_EVENT")):
    _REFUSED_TYPES[_old] = (_name, "a binlog format of servers older than MySQL 5.1", "read a binlog written by a "
                            "supported server (MariaDB 10.5+, MySQL 8.0+)")
_GTID_STANDALONE = 0x01  # MariaDB GTID flag: one statement, no BEGIN/COMMIT follows
_GTID_PREPARED_XA = 0x40  # MariaDB GTID flag: the group ends in XA PREPARE


_MARIADB_GTID = re.compile(r"^\s*\d+-\d+-\d+\s*(?:,\s*\d+-\d+-\d+\s*)*$")
_MYSQL_GTID = re.compile(r"^\s*[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}(?::\d+(?:-\d+)?)+\s*"
                         r"(?:,\s*[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}(?::\d+(?:-\d+)?)+\s*)*$", re.I)


def gtid_flavor(text: str) -> str | None:
    """``"mariadb"`` for a ``domain-server-seq`` list, ``"mysql"`` for a ``uuid:interval`` set, else None."""
    if _MARIADB_GTID.match(text):
        return "mariadb"
    if _MYSQL_GTID.match(text):
        return "mysql"
    return None


class _GtidState:
    """The GTID set executed up to a point of the binlog, in the server's flavour.

    MariaDB: the last GTID of each replication domain (``0-1-42,1-2-7``); MySQL: a ``uuid:intervals``
    set. `add` records a committed transaction's GTID.
    """

    def __init__(self, flavor: str, text: str) -> None:
        self.flavor = flavor
        self._domains: dict[int, str] = {}
        self._set: GtidSet | None = None
        if flavor == "mariadb":
            for gtid in filter(None, (g.strip() for g in text.split(","))):
                self._domains[int(gtid.split("-", 1)[0])] = gtid
        else:
            self._set = GtidSet(text.replace("\n", ""))
        self.text = self._render()

    def _render(self) -> str:
        if self._set is not None:
            return str(self._set)
        return ",".join(self._domains[d] for d in sorted(self._domains))

    def add(self, gtid: str) -> None:
        if self._set is not None:
            self._set = self._set + Gtid(gtid)
        else:
            domain = int(gtid.split("-", 1)[0])
            if len(self._domains) == 1 and domain in self._domains:  # one domain: the set is this GTID
                self._domains[domain] = self.text = gtid
                return
            self._domains[domain] = gtid
        self.text = self._render()

    def covers(self, other: "_GtidState") -> bool:
        """Whether every transaction of `other` is in this set."""
        if self._set is not None and other._set is not None:
            return all(gtid in self._set for gtid in other._set.gtids)
        mine = {d: int(g.rsplit("-", 1)[1]) for d, g in self._domains.items()}
        return all(mine.get(d, -1) >= int(g.rsplit("-", 1)[1]) for d, g in other._domains.items())


class _Assembler:
    """Turns a stream of binlog events into transactions (runs on the reader thread).

    Outside a transaction, events that only move the read position (rotation, checkpoints, GTID
    lists, heartbeats) yield a position mark: a Transaction with no changes whose `end` is where
    reading continues.

    A transaction of more than `max_rows` row changes is handed on in pieces. A piece's `end` is
    the transaction's start (where its first event begins, with the GTID set before it) with
    `row` = the row changes handed on so far, and each change of such a transaction carries the
    start with `row` = its 1-based ordinal. Reading again from such a position (a reconnect, or
    `open` at an acknowledged piece end) re-reads the transaction and drops its first `skip`
    row changes.

    A transaction whose first event carries a server_id in `ignore_server_ids` (a two-way channel's
    other direction wrote it) is dropped whole, DDL included: only its end is handed on. So is one
    that `marks` (the marker-row loop guard) finds marked: a mark after handed-on pieces stops it.
    """

    def __init__(self, start: Position, max_rows: int, gtids: _GtidState | None,
                 prepared_rows: Callable[[XaKey, Position | None, Position], list[_Item]] | None = None,
                 transactional: Callable[[str, str], bool] | None = None,
                 selects: Callable[[str, str], bool] | None = None, tables_of: KnownTables | None = None
                 ) -> None:
        #: the DDL this reader reads: parsed once, the tables each schema holds, the session's sql_mode
        self.ddl_events = DdlEvents(tables_of)
        self.kind_of: Callable[[str, str], TableKind] | None = None
        self.sequences_seen: set[tuple[str, str]] = set()
        #: whether a sequence's state rows are handed on (the pipeline's target applies them), or dropped
        self.sequences = False
        self.plain_rows = False  # table row changes as plain tuples (a reader process's frames: `tx_changes`)
        self.ignore_server_ids: frozenset[int] = frozenset()  # whose transactions are dropped whole
        self.ignoring = False  # the open transaction is one of theirs
        self.marks = MarkGuard()  # a channel's marks whose transactions are dropped whole
        self.kinds: dict[tuple[str, str], TableKind] = {}  # asked of the server once, until the next DDL
        self.selects = selects  # whether the pipeline's table rules take schema.table (None: all)
        self.reads: Callable[[str, str], bool] | None = None  # whose rows are handed on at all (None: all)
        self.unselected: set[int] = set()  # ids of the others' tables: counted, not decoded (`FastStream.skip`)
        self.rollbacks = Rollbacks(transactional, selects)  # what a ROLLBACK (TO SAVEPOINT) undid
        self.log_file = start.log
        # XA PREPARE groups seen by this reader (where each starts), and how to read a prepared
        # transaction's rows again when its XA COMMIT arrives.
        self.prepared: dict[XaKey, Position] = {}
        self.prepared_rows = prepared_rows
        self.xa_pending = False  # the open group is an XA PREPARE group: its rows wait for XA COMMIT
        self.tx_start: Position | None = None  # where the open transaction's first event begins
        self.max_rows = max_rows
        self.gtids = gtids
        self.tables: dict[int, _TableInfo] = {}
        self._infos: dict[int, tuple[Any, _TableInfo, bool]] = {}
        self.rows: list[tuple[int, _Item]] = []  # (ordinal in the transaction, item) not yet handed on
        #: row changes of the open transaction logged as statements: (table, where, text); refused at its end
        self.statements: list[tuple[str | None, str, str]] = []
        self.judge = StatementJudge()  # a row change logged as a statement: passed over, a marker, or refused
        self.nbytes = 0
        self.in_tx = False
        self.standalone = False
        self.pending_gtid: str | None = None
        self.handed_in_tx = start.row  # row changes of the open transaction already handed on in pieces
        self.seen_in_tx = 0  # row changes of the open transaction read so far (skipped ones included)
        self.skip = start.row
        self.mark = start  # the last end handed on; a position mark must be past it
        # After a GTID start the server skips to it from the start of a file: positions read
        # before the first transaction are behind the start, so none is handed on as a mark.
        self.positioned = bool(start.log)

    def restart(self, at: Position) -> None:
        """Forget the open transaction: reading restarts at `at`, the last end handed on (a piece's
        end restarts at its transaction's start and skips the row changes it covers)."""
        self.skip = self.handed_in_tx = at.row
        if self.skip:
            log.info("re-reading a transaction split across a reconnect from %s: skipping the %d changes "
                     "already handed on", at, self.skip)
        self.log_file = at.log
        self._forget_tx()
        self.xa_pending = False
        self.marks.restart()

    def passed(self) -> tuple[Position, Position] | None:
        """(the last end handed on, where reading stands past it) when only echoes (and position
        events) lie between them and reading stands between transactions; else None."""
        through = self.marks.through
        if through is None or self.in_tx or not self.marks.hold or not through > self.mark:
            return None
        return self.mark, through

    def _forget_tx(self) -> None:
        """Forget the open transaction's rows, statements, savepoints and state (at its end, or a restart)."""
        self.rows, self.nbytes, self.in_tx, self.standalone, self.pending_gtid = [], 0, False, False, None
        self.tx_start, self.seen_in_tx, self.ignoring, self.statements = None, 0, False, []
        self.rollbacks.clear()

    def _position(self, log: str, offset: int) -> Position:
        return Position(log, offset, self.gtids.text or None if self.gtids is not None else None)

    def feed(self, event: Any) -> list[Transaction]:
        """The transactions (and position marks) that event value `event` (`setl.binlog_events`) completes."""
        kind = type(event)
        if kind is Rows or kind is SkippedRows:  # the events of a busy binlog first, by their exact type
            self.nbytes += event.header.event_size
            return self._rows_event(event) if kind is Rows else self._skipped(event)
        if kind is TableMap:
            self.nbytes += event.header.event_size
            self._table_map(event.layout)
            return []
        if isinstance(event, _POSITION_EVENTS):
            return self._moved(event)
        header = event.header
        self.nbytes += header.event_size
        if self.tx_start is None and kind in (MariadbGtid, MysqlGtid, Query):
            self.tx_start = self._position(self.log_file, header.log_pos - header.event_size)
            self.ignoring = bool(self.ignore_server_ids) and header.server_id in self.ignore_server_ids
        if kind is MariadbGtid:
            self.xa_pending = bool(event.flags & _GTID_PREPARED_XA)
            self.standalone = bool(event.flags & _GTID_STANDALONE)
            self.in_tx = not self.standalone
            self.pending_gtid = event.gtid
            return []
        if kind is MysqlGtid:
            self.pending_gtid = event.gtid
            return []
        if kind is Xid:
            return self._commit(header.log_pos, header.timestamp)
        if kind is XaPrepare:
            return self._xa_prepared(event)
        if kind is Query:
            return self._query(event, header.log_pos)
        refuse_unknown(event, self.log_file)
        return []

    def _table_map(self, layout: TableLayout) -> None:
        # A cached table map shares its decoded table: decode our view of it once too.
        known = self._infos.get(layout.table_id)
        if known is None or known[0] is not layout.description:
            info = _TableInfo.from_table_map(layout)
            if self.kind_of is not None:
                kind = self.kinds.get((info.schema, info.table))
                if kind is None:
                    kind = self.kinds[(info.schema, info.table)] = self.kind_of(info.schema, info.table)
                info = info.with_kind(kind)
            known = self._infos[layout.table_id] = (layout.description, info, unread(info, self.reads)
                                                    and not self.marks.is_mark(info.schema, info.table))
        self.tables[layout.table_id] = known[1]
        (self.unselected.add if known[2] else self.unselected.discard)(layout.table_id)

    def _skipped(self, event: SkippedRows) -> list[Transaction]:
        """`_add_rows` for a table not read: only its row count moves the ordinals (`skipping`)."""
        if not self.ignoring and not self.xa_pending:  # else nothing of it is counted, as in `_add_rows`
            self.seen_in_tx += event.count
            self.skip -= min(self.skip, event.count)  # resuming inside a split transaction: counted before
        elif self.ignoring:
            self.marks.saw(event.schema)
        return []

    def _rows_event(self, event: Rows) -> list[Transaction]:
        if self.marks.is_mark(event.schema, event.table):
            return self._marked(event)
        self._add_rows(event)
        if len(self.rows) >= self.max_rows:
            return self._pieces()
        return []

    def _marked(self, event: Rows) -> list[Transaction]:
        """The mark table's rows: an ignored mark drops the open transaction whole; others are only counted."""
        if (mark := self.marks.row_marks(event.rows)) is not None and not self.ignoring:
            self._drop_open(f"a mark table row with mark {mark!r}", event.header.log_pos, False)
        elif not self.ignoring and not self.xa_pending:
            self.seen_in_tx += len(event.rows)
            self.skip -= min(self.skip, len(event.rows))
        return []

    def _drop_open(self, what: str, offset: int, statement: bool) -> None:
        """Drop the open transaction whole, from its start: the other direction of a channel wrote it."""
        self.marks.dropping(what, f"{self.log_file}:{offset}", self.handed_in_tx, self.tx_start, self.xa_pending,
                            statement or bool(self.rows) or self.seen_in_tx > 0)
        self.ignoring, self.rows, self.statements = True, [], []
        self.rollbacks.clear()

    def _moved(self, event: Any) -> list[Transaction]:
        if isinstance(event, Rotate):
            self.marks.sessions.clear()  # connection ids start again with the server (in a new file)
            self.log_file = event.next_binlog
            if event.header.timestamp:  # a real rotation: table ids may be reused in the next file
                self.tables.clear()
                self._infos.clear()
                self.unselected.clear()
            end = self._position(event.next_binlog, event.position)
        elif isinstance(event, Heartbeat):
            if event.log_file != self.log_file or not event.header.log_pos:
                return []
            end = self._position(event.log_file, event.header.log_pos)
        else:
            if not event.header.log_pos:
                return []
            end = self._position(self.log_file, event.header.log_pos)
        return self._moved_to(end)

    def _moved_to(self, end: Position) -> list[Transaction]:
        if not self.positioned or self.in_tx or self.rows or self.handed_in_tx or end <= self.mark:
            return []
        if self.marks.hold:  # past echoes: no position is handed on, but reading got this far (`passed`)
            self.marks.passing(end)
            return []
        self.mark = end
        return [Transaction((), end)]

    def _append(self, item: _Item) -> None:
        self.seen_in_tx += 1
        if self.skip:
            self.skip -= 1
            self.rollbacks.handing_on([(self.seen_in_tx, item)])
        else:
            self.rows.append((self.seen_in_tx, item))

    def _savepoint(self, statement: str, offset: int) -> None:
        """SAVEPOINT, ROLLBACK TO and RELEASE SAVEPOINT inside a transaction (`Rollbacks`)."""
        mark = self.rollbacks.savepoint(statement, self.seen_in_tx, f"{self.log_file}:{offset}")
        if mark is not None:
            self._undo(mark, statement, offset)

    def _undo(self, mark: int, statement: str, offset: int) -> None:
        """Drop the transactional row changes read after the first `mark` (the server undid them)."""
        self.rows = self.rollbacks.kept(self.rows, mark, statement, f"{self.log_file}:{offset}", self.max_rows)

    def _add_rows(self, event: Rows) -> None:
        if self.ignoring:
            self.marks.saw(event.schema)
            return  # the other direction's write: dropped with its whole transaction
        info = self.tables.get(event.table_id)
        if info is None:
            raise SourceError(f"rows event for table id {event.table_id} ({event.schema}.{event.table}) "
                              "without its table map")
        if self.xa_pending:
            return  # an XA PREPARE group: its rows are read again when its XA COMMIT arrives
        if info.sequence and not self.sequences:
            if (info.schema, info.table) not in self.sequences_seen:
                self.sequences_seen.add((info.schema, info.table))
                log.info("%s.%s is a sequence: its state is not replicated (the values drawn from it arrive "
                         "in the tables that use them)", info.schema, info.table)
            return
        items = _row_items(event, info)
        if self.skip:
            for item in items:
                self._append(item)
        else:  # as `_append` does for each, without a call per row
            self.rows.extend(enumerate(items, self.seen_in_tx + 1))
            self.seen_in_tx += len(items)

    def _xa_prepared(self, event: XaPrepare) -> list[Transaction]:
        """The end of a group: XA PREPARE (its rows wait for XA COMMIT), or XA COMMIT ONE PHASE."""
        if event.one_phase:
            return self._commit(event.header.log_pos, event.header.timestamp)
        key = (event.format_id, event.gtrid, event.bqual)
        offset = event.header.log_pos
        if self.handed_in_tx:  # MySQL marks an XA group only at its end
            raise SourceError(f"XA PREPARE at {self.log_file}:{offset} of a transaction of which "
                              f"{self.handed_in_tx} row changes were already handed on as committed; "
                              "raise source.max_rows_in_memory above its size")
        self.prepared[key] = self._start()
        self.rows = []
        self._close_tx(offset)
        self.xa_pending = False
        # Its end may be acknowledged: at XA COMMIT the prepared rows are found in the binlog again.
        return self._moved_to(self._position(self.log_file, offset))

    def _xa_finished(self, match: re.Match[str], offset: int, timestamp: float | None) -> list[Transaction]:
        """XA COMMIT or XA ROLLBACK of a prepared transaction: its rows are applied now, or never."""
        key = (int(match["format"]), bytes.fromhex(match["gtrid"]), bytes.fromhex(match["bqual"]))
        start = self.prepared.pop(key, None)
        if match["verb"].upper() == "ROLLBACK":
            self._close_tx(offset)
            return self._moved_to(self._position(self.log_file, offset))
        if self.prepared_rows is None:
            raise SourceError(f"XA COMMIT at {self.log_file}:{offset} of a prepared transaction this reader "
                              "cannot read again")
        self.in_tx, self.standalone = True, False  # its statements are judged as inside its transaction
        for item in self.prepared_rows(key, start, self._start()):
            if isinstance(item[3], LoggedStatement):  # a row change logged as a statement, judged as if read here
                self._statement_dml(item[3].text, item[3].schema, offset, item[3].where)
            else:
                self._append(item)
        pieces = self._pieces() if len(self.rows) >= self.max_rows else []
        return [*pieces, *self._commit(offset, timestamp)]

    def _statement_dml(self, statement: str, schema: str, offset: int, where: str | None = None) -> bool:
        """Whether `statement` is a row change logged as a statement (a session with binlog_format
        STATEMENT or MIXED), judged by `judge` (`StatementJudge`): passed over, held in its place among
        the transaction's rows as a marker, or stopping the reader at the end of its transaction,
        naming the tables to copy again (`refuse_statements`). In a prepared XA group it is read again
        and judged at the group's XA COMMIT (`_xa_finished`; `where`: where it was read)."""
        text = dml_text(statement)
        if text is None:
            return False
        if self.xa_pending:
            return True  # read again from the binlog at its XA COMMIT, and judged there (never at XA ROLLBACK)
        verdict = self.judge.judge(text, schema, self.selects, self.in_tx and not self.standalone)
        if isinstance(verdict, StatementMarker):
            self._append((None, None, text, verdict))
        elif verdict is not None:  # refused at the transaction's end, which the fix moves past
            self.statements.append((verdict[0], where or f"{self.log_file}:{offset}", verdict[1]))
        return True

    def _start(self) -> Position:
        if self.tx_start is None:
            raise SourceError(f"a transaction too large to hold ({self.max_rows}+ row changes) at {self.log_file} "
                              "has no start event (GTID or BEGIN) to resume it from")
        return self.tx_start

    def _pieces(self) -> list[Transaction]:
        """Cut full pieces off a transaction too large to hold; each `end` is a checkpoint inside it."""
        pieces = []
        while len(self.rows) >= self.max_rows:
            chunk, self.rows = self.rows[: self.max_rows], self.rows[self.max_rows:]
            self.rollbacks.handing_on(chunk)
            self.handed_in_tx = chunk[-1][0]
            end = attrs.evolve(self._start(), row=self.handed_in_tx)
            changes = tx_changes(chunk, end, None, self._start(), self.plain_rows)
            pieces.append(Transaction(changes, end, complete=False, nbytes=self.nbytes))
            self.nbytes = 0
        return pieces

    def _close_tx(self, offset: int) -> None:
        if self.skip:
            raise SourceError(f"resumed inside a transaction at {self._start() if self.tx_start else self.log_file}"
                              f" to skip {self.seen_in_tx + self.skip} row changes, but it ends at "
                              f"{self.log_file}:{offset} after {self.seen_in_tx}: the position does not "
                              "belong to this binlog")
        if self.pending_gtid is not None and self.gtids is not None:
            self.gtids.add(self.pending_gtid)
        self._forget_tx()  # a split transaction's rows handed on no longer bar a later one's ROLLBACK
        self.handed_in_tx = self.skip = 0
        self.marks.closed()
        self.positioned = True

    def _commit(self, offset: int, timestamp: float | None) -> list[Transaction]:
        """The transaction ending at `offset`, or none: an echo (`MarkGuard.echo`)."""
        if self.marks.echo():
            self._close_tx(offset)
            self.marks.passing(self._position(self.log_file, offset))
            return []
        refuse_statements(self.statements, self.rows, self.log_file, offset)
        rows, nbytes = self.rows, self.nbytes
        start = self._start() if self.handed_in_tx else None  # for the ordinals of a split one's last changes
        self._close_tx(offset)
        end = self.mark = self._position(self.log_file, offset)
        changes = tx_changes(rows, end, float(timestamp) if timestamp else None, start, self.plain_rows)
        return [Transaction(changes, end, nbytes=nbytes)]

    def _query(self, event: Query, offset: int) -> list[Transaction]:
        statement = event.query.strip()
        verb = statement.rstrip(";").strip().upper()
        if verb == "BEGIN":
            self.in_tx = True
            return []
        if statement.upper().startswith("XA START"):  # MySQL logs the XA group's start as a query
            self.in_tx = True
            return []
        xa_end = _XA_END.match(statement)
        if xa_end:
            return self._xa_finished(xa_end, offset, event.header.timestamp)
        if verb == "COMMIT":  # non-transactional tables, or a server that sends BEGIN/COMMIT
            return self._commit(offset, event.header.timestamp)
        if verb == "ROLLBACK":
            # Only a transaction that wrote a non-transactional table is logged this way: the
            # server undid its transactional rows, not the others.
            self._undo(0, statement, offset)
            return self._commit(offset, event.header.timestamp)
        if self.in_tx and not self.standalone and (self.ignoring or _IGNORED_IN_TX.match(statement)):
            self._savepoint(statement, offset)  # nothing of an ignored transaction's statements is kept
            return []
        dropped = self.marks.statement(statement, event.thread_id) if self.marks.ignore and not self.ignoring else None
        if dropped is not None:
            self._drop_open(dropped, offset, True)
            if self.in_tx and not self.standalone:
                return []
        schema = event.schema
        if not self.ignoring and self._statement_dml(statement, schema or "", offset):
            if self.in_tx and not self.standalone:
                return []
            refuse_statements(self.statements, self.rows, self.log_file, offset)
            self._close_tx(offset)
            return self._moved_to(self._position(self.log_file, offset))
        self.judge.forget()  # a DDL may make or drop a trigger: a skipped table's statements are asked again
        read = self.ddl_events.read(statement, schema or "")
        if self.in_tx and (self.rows or self.handed_in_tx):
            # A statement logged inside a transaction: keep it ordered with the rows around it.
            self._append((None, None, statement, read))
            return []
        nbytes, ignoring = self.nbytes, self.ignoring
        self._close_tx(offset)
        self.marks.handed()
        end = self.mark = self._position(self.log_file, offset)
        self.kinds.clear()
        changes = self.ddl_events.changes(read, schema or "", end, event.sql_mode)
        return [Transaction(() if ignoring else changes, end, nbytes=nbytes)]


def tx_changes(rows: list[tuple[int, _Item]], position: Position, commit_time: float | None,
               start: Position | None = None, plain: bool = False) -> tuple[Change, ...]:
    """The changes of `rows`. Those of a split transaction (`start`: where it starts) each carry its
    start with `row` = their 1-based ordinal among the row changes it logged, the others `position`.
    `plain`: a table's row change is the tuple of `RowChange`'s first fields, not one (a reader
    process's frames take them so, `frames.py`)."""
    # A DDL item is (None, None, statement, its DdlRead); a statement marker (None, None, text, StatementMarker).
    changes: list[Change] = []
    for o, (op, info, before, after) in rows:
        at = attrs.evolve(start, row=o) if start is not None else position
        if op is None:
            changes.append(after.change(at))
        elif info.sequence:
            changes.append(RowChange(op, info.schema, info.table, info.primary_key, before, after, at,
                                     commit_time, sequence=info.definition or ""))
        elif plain:
            changes.append((op, info.schema, info.table, info.primary_key, before, after, at,  # type: ignore[arg-type]
                            commit_time))
        else:  # positional: a keyword argument (or a tuple spread) costs the attrs __init__ a slower call
            changes.append(RowChange(op, info.schema, info.table, info.primary_key, before, after, at,
                                     commit_time))
    return tuple(changes)


def refuse_statements(statements: list[tuple[str | None, str, str]], rows: list[tuple[int, _Item]], log_file: str,
                      end: int) -> None:
    """Stop the reader at the end (`end`) of a transaction that wrote selected tables by statements
    (`_Assembler._statement_dml`), before any of its rows is handed on. The line names the first
    such statement, the tables to copy again (those of the statements, and the tables its rows
    wrote: passing the transaction skips them too) and the commands that do it."""
    if not statements:
        return
    table, where, text = statements[0]
    tables = sorted({name for name, _, _ in statements if name is not None}
                    | {f"{info.schema}.{info.table}" for _, (_, info, _, _) in rows if info is not None})
    unknown = " (and the tables of its statements setl cannot name)" if any(n is None for n, _, _ in statements) \
        else ""
    raise UnreadableEvent(
        f"a row change to {table or 'a table setl cannot determine'} at {where} is logged as a statement (the "
        f"session ran with binlog_format STATEMENT or MIXED), which setl cannot replicate exactly: {text}. Fix: SET "
        "GLOBAL binlog_format=ROW (and in the writing sessions); then pass its transaction and copy the tables it "
        f"wrote again: `setl position reset --to {log_file}:{end}`, `setl snapshot --table "
        f"{' --table '.join(tables) or 'SCHEMA.TABLE'}`{unknown}, `setl resume` (each with --pipeline)",
        table=table)


def refuse_unknown(event: Any, log_file: str) -> None:
    """Pass over an event of a kind the assembler does not read when `_IGNORED_TYPES` says it loses
    nothing; else stop the reader at it, naming its type, position and cause."""
    kind = event.header.event_type
    if kind in _IGNORED_TYPES:
        return
    name, cause, fix = _REFUSED_TYPES.get(kind) or (
        event.name if isinstance(event, Unknown) and event.name else f"event type {kind}",
        "a binlog event kind setl does not know (a newer server, or a server setting setl does not handle)",
        "see docs/mysql-source.md for the server settings setl reads; exclude the setting or report the case")
    raise UnreadableEvent(f"binlog event {name} (type {kind:#04x}) ending at {log_file}:{event.header.log_pos}: "
                          f"{cause}; nothing after it is applied: {fix}")


def read_events(assembler: _Assembler, events: Any, limit: int = 64) -> tuple[Any, list[Transaction], int]:
    """Feed `assembler` events from `events.fetchone()` until transactions are ready, a heartbeat
    arrives or `limit` events were read: (the last event, or None at the stream's end; the
    transactions; the most rows the assembler held meanwhile). The reader's loop runs once per
    transaction rather than once per event (this module is compiled)."""
    peak = len(assembler.rows)
    event: Any = None
    for _ in range(limit):
        event = None
        try:
            event = events.fetchone()
            if event is None:
                break
            txs = assembler.feed(event)
        except UNDECODABLE as exc:  # the library's (or the patches') reading of bytes it cannot account for
            if isinstance(exc, SetlError):
                raise
            raise _undecodable(exc, events, event) from exc
        if len(assembler.rows) > peak:
            peak = len(assembler.rows)
        if txs or isinstance(event, Heartbeat):
            return event, txs, peak
    return event, [], peak


#: What python-mysql-replication raises on bytes it cannot account for (`setl.adapters.replication`).
UNDECODABLE = replication.UNDECODABLE


def corrupt_event(exc: BaseException, what: str, log_file: str, start: int, end: int | None,
                  table: str | None = None) -> CorruptEvent:
    """The error that stops a pipeline at an event it cannot decode (reading it again would fail again)."""
    span = f"{log_file}:{start}" + (f" (it ends at {end})" if end is not None else "")
    stop = f" --stop-position={end}" if end is not None else ""
    return CorruptEvent(f"cannot decode the binlog's {what} at {span}: {type(exc).__name__}: {exc}; the event is "
                        f"corrupt or beyond setl's readers, so the pipeline stops here (read it with `mariadb-binlog "
                        f"--start-position={start}{stop} -vv {log_file}`; `setl position reset` past it skips its "
                        f"rows)", table=table, position=Position(log_file, start))


def _undecodable(exc: BaseException, events: Any, event: Any) -> CorruptEvent:
    """`corrupt_event` for an event the library could not build (`event` None) or whose rows it could not read."""
    reader = getattr(events, "reader", events)  # a fast.FastStream reads through the library's reader
    log_file = str(reader.log_file)
    if event is None:  # the library failed inside fetchone(): the reader stands at the event's start
        return corrupt_event(exc, "event", log_file, int(reader.log_pos or 0), None)
    header = event.header
    table = f"{event.schema}.{event.table}" if isinstance(event, Rows) else None
    return corrupt_event(exc, type(event).__name__, log_file, header.log_pos - header.event_size, header.log_pos,
                         table)
