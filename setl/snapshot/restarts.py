"""What the binlog handed on does to the table copies (`CopyRestarts`): a DDL on a table being
copied starts its copy again or ends it, a write in a keyless copy's window copies it again, and a
table gone without a DDL ends its copy."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import attrs

from setl import ddl, failpoints
from setl.errors import SourceError
from setl.model import DdlChange, Position, RowChange, TableName, Transaction
from setl.snapshot.copies import CopyBook
from setl.snapshot.progress import CopyProgress
from setl.tablecopy import CopyStatus, TableProgress

log = logging.getLogger("setl.snapshot")

#: How often in a row a keyless non-transactional table is copied again after a write while its
#: read began, before the pipeline stops with an error.
MAX_REREADS = 5


class CopyRestarts:
    """The poll thread's decisions, as each binlog transaction is handed on, about the copies it
    affects. Every method runs under the book's lock and blocks only on the meta store (a copy
    dropped without a DDL carrying its progress); a copy dropped leaves its table in
    `book.waiting` (copied again from a new TRUNCATE) or ends it, and its chunks still to come
    are dropped (`book.abandoned`). `rereads` counts the keyless re-reads in a row per table."""

    def __init__(self, book: CopyBook, progress: CopyProgress, *, pipeline: str,
                 selects: Callable[[str, str], bool] | None) -> None:
        self.book = book
        self.progress = progress
        self.pipeline = pipeline
        self.selects = selects
        self.rereads: collections.Counter[TableName] = collections.Counter()

    def altered(self, change: DdlChange) -> None:
        """Under the lock: a DDL handed on, naming tables whose copy is not all handed on yet.

        A copy that goes on would follow a plan (columns, key) made before the DDL, so each such
        table starts again after it, from a new TRUNCATE (chunks of the old copy still to come are
        dropped), unless the DDL removed it (DROP, RENAME): then its copy ends. A table a RENAME
        gives one of their names, if the rules select it, is copied (the target's renamed table
        holds only part of the rows)."""
        parsed = change.ddl
        names = [TableName(ref.schema or change.schema, ref.table) for ref in parsed.tables] or [
            TableName(change.schema, str(change.table))]
        moving = [n for n in names if n in self.book.gone
                  or (n in self.book.copies and not self.book.copies[n].handed_on)]
        if not moving:
            return  # waiting tables are planned after the DDL; a copy all handed on precedes it
        removed, pairs = removed_and_renamed(parsed, names)
        renamed = [new for old, new in pairs if old in moving]
        ended = [n for n in moving if n in removed or n in self.book.gone]
        again = [n for n in moving if n not in ended] + [
            n for n in renamed if n not in self.book.copies and n not in self.book.waiting and n not in moving
            and (self.selects is None or self.selects(n.schema, n.table))]
        for name in ended + again:
            self.drop_copy(name, again=name not in ended, carrier=change)
        for name in ended:
            failpoints.hit("snapshot_ended", task=str(name))
        log.warning("pipeline=%s stage=select table=%s position=%s altered while being copied (%s): %s",
                    self.pipeline, ", ".join(map(str, moving)), change.position, change.statement[:120],
                    "; ".join(filter(None, [
                        f"copy of {', '.join(map(str, ended))} ended" if ended else "",
                        f"copying {', '.join(map(str, again))} from its start after it" if again else ""])))

    def drop_copy(self, name: TableName, *, again: bool, carrier: DdlChange | None = None) -> None:
        """Under the lock: forget the table's copy (its chunks still to come are dropped, its
        progress not committed yet never will be); `again`: copy it from its start (a new TRUNCATE
        at the current position), else its copy is done.

        With a `carrier` (the DDL being handed on that ends or restarts the copy) the meta store
        gets that progress only with the ack of the batch holding the DDL: a crash before it
        resumes the copy from its last acked chunk, and the DDL, replayed, ends it again. Without
        one (a table gone with no DDL, a keyless re-read) it is written now."""
        self.book.drop(name)
        now = time.time()
        stored = self.progress.ledger.get(name) or TableProgress(name.schema, name.table)
        progress = (TableProgress(name.schema, name.table, CopyStatus.PENDING, started=now, updated=now) if again
                    else attrs.evolve(stored, status=CopyStatus.DONE, updated=now))
        self.progress.abandon(progress, carrier)
        if again:
            self.book.queue(name)

    def check_windows(self, found: Transaction) -> None:
        """Under the lock, before `found` is handed on: a write to a keyless table the snapshot does
        not cover, committed between its read's snapshot position and the head read once its SELECT
        ran, may be in the copy and would be applied again: copy the table again (its TRUNCATE after
        `found`), at most `MAX_REREADS` times in a row."""
        for name, (since, until, _serial) in list(self.book.windows.items()):
            if found.end <= since:
                continue
            if until is not None and found.end > until:
                self.book.window_closed(name)  # past the window with no write to the table: the copy holds
                self.rereads.pop(name, None)
                continue
            if not any(isinstance(c, RowChange) and c.schema == name.schema and c.table == name.table
                       for c in found.changes):
                continue
            self.rereads[name] += 1
            if self.rereads[name] > MAX_REREADS:
                raise SourceError(
                    f"the keyless {name} is not transactional, and it was written while its snapshot read began "
                    f"{MAX_REREADS + 1} times in a row: a copy of it cannot be placed in the binlog exactly; give it "
                    "a primary key, or copy it (setl snapshot --table) while it is not written",
                    pipeline=self.pipeline, stage="select", table=str(name), position=found.end)
            log.warning("pipeline=%s stage=select table=%s position=%s was written while its snapshot read began "
                        "(a non-transactional table without a primary key: the copy may hold that write): "
                        "copying it again", self.pipeline, name, found.end)
            self.drop_copy(name, again=True)

    def lost_without_ddl(self, at: Position) -> None:
        """Under the lock: tables gone without a DDL in the stream up to the head seen when they were
        found gone (removed with the binlog off): their copy ends, with a warning."""
        for name, head in list(self.book.gone.items()):
            if head is not None and at < head:
                continue
            self.drop_copy(name, again=False)
            log.warning("pipeline=%s stage=select table=%s position=%s no longer exists and no DDL in the binlog "
                        "removed it: its copy ends unfinished (the target may hold part of its rows)",
                        self.pipeline, name, at)


def removed_and_renamed(parsed: ddl.Statement, names: list[TableName]
                        ) -> tuple[list[TableName], list[tuple[TableName, TableName]]]:
    """The tables a DDL removes (DROP, RENAME), and its renames as (old, new): `names` are the
    statement's tables (`parsed.tables`, qualified). ``ALTER TABLE ... RENAME COLUMN|INDEX`` renames
    no table."""
    if parsed.kind == "rename_table":
        pairs = list(zip(names[0::2], names[1::2]))
        return [old for old, _ in pairs], pairs
    if parsed.kind == "alter_table" and parsed.renames:  # RENAME TO u[, RENAME TO v]: the last name stays
        return names[:1], [(names[0], names[parsed.renames[-1]])]
    if parsed.kind == "drop_table":
        return list(names), []
    return [], []
