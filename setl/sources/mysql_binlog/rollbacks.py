"""What a ROLLBACK or ROLLBACK TO SAVEPOINT logged inside a transaction undid.

The server logs SAVEPOINT, ROLLBACK TO and RELEASE SAVEPOINT (and a transaction ending in ROLLBACK)
only when the transaction also wrote a non-transactional table. The rows a rollback undid are still
in the binlog before it: the transactional ones (and statement markers of transactional tables)
after the savepoint are dropped, the non-transactional ones were not undone. Rows already handed on
in pieces of a transaction too large to hold cannot be taken back: that is an error naming where.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from setl.errors import SourceError
from setl.sources.mysql_binlog.decoding import _Item, _TableInfo
from setl.sources.mysql_binlog.statements import _SAVEPOINT, _unquote, undone

log = logging.getLogger("setl.sources.mysql_binlog")


class Rollbacks:
    """The open transaction's savepoints (each with the number of row changes read before it) and
    the last transactional row handed on; `transactional` tells a table's engine (None: every
    table is), `selects` whether the rules take a table (None: all)."""

    def __init__(self, transactional: Callable[[str, str], bool] | None,
                 selects: Callable[[str, str], bool] | None) -> None:
        self.transactional = transactional
        self.selects = selects
        self.savepoints: dict[str, int] = {}  # savepoint name -> row changes read before it
        self.handed = 0  # the last ordinal of a transactional row handed on

    def clear(self) -> None:
        """A new transaction: no savepoint, nothing handed on."""
        self.savepoints, self.handed = {}, 0

    def is_transactional(self, info: _TableInfo) -> bool:
        if self.transactional is None:
            return True
        if self.selects is not None and not self.selects(info.schema, info.table):
            return False  # a table the rules skip: its rows go nowhere, undone or not (it may be gone)
        return self.transactional(info.schema, info.table)

    def handing_on(self, rows: list[tuple[int, _Item]]) -> None:
        """Note the transactional rows among `rows`, handed on (or skipped as handed on before): a
        later ROLLBACK (TO SAVEPOINT) cannot take them back."""
        for ordinal, (op, info, _, _) in rows:
            if op is not None and ordinal > self.handed and self.is_transactional(info):
                self.handed = ordinal

    def savepoint(self, statement: str, seen: int, where: str) -> int | None:
        """Follow `statement` (read at `where`, after `seen` row changes of the transaction): for a
        ROLLBACK TO, the number of row changes read before its savepoint (the transactional ones
        after it are undone, `kept`); None for anything else. A SourceError when the savepoint is
        not in the binlog before it."""
        match = _SAVEPOINT.match(statement)
        if match is None:
            return None
        name = _unquote(match["name"]).lower()
        verb = match["verb"].upper()
        if verb == "SAVEPOINT":
            self.savepoints.pop(name, None)
            self.savepoints[name] = seen
            return None
        mark = self.savepoints.get(name)
        if mark is None:
            raise SourceError(f"{statement.strip()} at {where}: the savepoint is not in the binlog before it, so "
                              "the rows it undid cannot be told apart")
        # savepoints set after this one are gone (for RELEASE, this one too)
        names = list(self.savepoints)
        for later in names[names.index(name) + (1 if verb.startswith("ROLLBACK") else 0):]:
            del self.savepoints[later]
        return mark if verb.startswith("ROLLBACK") else None

    def kept(self, rows: list[tuple[int, _Item]], mark: int, statement: str, where: str,
             max_rows: int) -> list[tuple[int, _Item]]:
        """`rows` without the transactional row changes read after the first `mark` (`statement`
        at `where` undid them)."""
        if self.handed > mark:
            raise SourceError(f"{statement.strip()} at {where} undoes row changes of a transaction too large to "
                              f"hold ({max_rows}+ rows) that were already handed on; raise "
                              "source.max_rows_in_memory above its size")
        kept = [(o, item) for o, item in rows
                if o <= mark or (not self.is_transactional(item[1]) if item[0] is not None
                                 else not undone(item[3], self.transactional))]
        if len(kept) < len(rows):
            log.info("%s at %s: dropping the %d row changes it undid", statement.strip(), where, len(rows) - len(kept))
        return kept


__all__ = ["Rollbacks"]
