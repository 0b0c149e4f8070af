"""The reader's side of a two-way channel's marker-row loop guard (docs/bidirectional.md): which
transactions and statements carry a mark the reader drops, and which dropped ones were only echoes
(`MarkGuard`, driven by the assembler)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from setl.errors import SourceError
from setl.loop_marks import MARK_SCHEMA, MARK_TABLE, row_mark, row_session, statement_mark
from setl.model import Position


@attrs.define
class MarkGuard:
    """What the marks of the other direction (`ignore`) tell of the open transaction.

    A transaction with a row of the mark table carrying an ignored mark is dropped whole; so is a
    statement carrying the mark's comment, or run by a session that wrote such a row since the
    last rotation (MariaDB rewrites a DROP TABLE's text, losing the comment; connection ids start
    again only with a server, whose restart begins a new binlog file). A dropped transaction that
    wrote nothing outside setl's own schema is an echo (`echo`).
    """

    ignore: frozenset[str] = frozenset()
    sessions: set[int] = attrs.Factory(set)  # connection ids of the sessions that wrote an ignored mark
    by_mark: bool = False  # the open transaction is dropped for its mark
    foreign: bool = False  # ... and it wrote rows (or a statement) outside setl's own schema
    hold: bool = False  # an echo was dropped since the last transaction handed on: no position mark passes it
    #: while `hold`: where reading stands past the echoes, with nothing but echoes and position events
    #: since the last end handed on (`passing`); None otherwise
    through: Position | None = None

    def is_mark(self, schema: str, table: str) -> bool:
        """Whether rows of `schema`.`table` are the mark table's (read, never handed on)."""
        return bool(self.ignore) and table == MARK_TABLE and schema == MARK_SCHEMA

    def row_marks(self, rows: Sequence[dict[str, Any]]) -> str | None:
        """The first ignored mark among the mark table's `rows` (each one's session is noted), or None."""
        found = None
        for row in rows:
            mark = row_mark(row)
            if mark is not None and mark in self.ignore:
                self.sessions.add(row_session(row))
                found = found or mark
        return found

    def statement(self, statement: str, thread_id: int) -> str | None:
        """Why a query event is the other direction's (its mark's comment, or its session), or None."""
        mark = statement_mark(statement)
        if mark is not None and mark in self.ignore:
            return f"a statement marked {mark!r}"
        if thread_id and thread_id in self.sessions:
            return f"a statement of session {thread_id}, which wrote the mark"
        return None

    def dropping(self, what: str, where: str, handed: int, start: Position | None, xa: bool, foreign: bool) -> None:
        """The open transaction is dropped for its mark (`foreign`: it held more than setl's rows), or
        the reader stops (`late_mark`) when that cannot be exact: `handed` of its row changes were
        handed on in pieces, or it is an XA PREPARE group (`xa`)."""
        if xa or handed:
            raise late_mark(what, where, handed, start, xa)
        self.by_mark, self.foreign = True, self.foreign or foreign

    def saw(self, schema: str) -> None:
        """A rows event of a dropped transaction, on a table of `schema`."""
        if self.by_mark and schema != MARK_SCHEMA:
            self.foreign = True

    def echo(self) -> bool:
        """Whether the transaction ending now is an echo: dropped for its mark, and writing only setl's
        tables (a loader recording the position of a batch without changes). Its end is not handed
        on, nor any position after it until a transaction is: the other direction would record that
        position on the first site, whose reader would hand that on, for ever. The acked position
        rests before it; reading it again drops it again."""
        self.hold = self.by_mark and not self.foreign
        self.by_mark = self.foreign = False
        if not self.hold:
            self.through = None
        return self.hold

    def passing(self, end: Position) -> None:
        """While `hold`: reading reached `end` (an echo's end, or a position event after it) with no
        transaction handed on since the last end handed on. Nothing between them is to be applied:
        ``--until-caught-up`` may end there (`setl.stages.Select.passed`), though no position is handed on."""
        if self.hold and (self.through is None or end > self.through):
            self.through = end

    def handed(self) -> None:
        """A transaction's end was handed on (not by `echo`): positions may pass again."""
        self.hold, self.through = False, None

    def closed(self) -> None:
        """The open transaction ended (not by `echo`)."""
        self.by_mark = self.foreign = False

    def restart(self) -> None:
        self.by_mark = self.foreign = self.hold = False
        self.through = None


def late_mark(what: str, where: str, handed: int, start: Position | None, xa: bool) -> SourceError:
    """The error for a mark that cannot drop its transaction exactly: inside an XA PREPARE group, or
    after `handed` row changes of it were handed on in pieces."""
    if xa:
        return SourceError(f"{what} at {where} is inside an XA PREPARE group: setl's loader never writes its "
                           "marks in XA, so this transaction cannot be judged; fix: write "
                           f"{MARK_SCHEMA}.{MARK_TABLE} only through setl, then move past it (setl position reset)")
    return SourceError(f"{what} at {where} comes after {handed} row changes of its transaction (started at {start}) "
                       "were handed on in pieces: setl's loader writes its mark first, so this transaction was not "
                       "written by it as a whole and cannot be dropped exactly; fix: raise "
                       f"source.max_rows_in_memory above its size, or write {MARK_SCHEMA}.{MARK_TABLE} only "
                       "through setl")


__all__ = ["MarkGuard", "late_mark"]
