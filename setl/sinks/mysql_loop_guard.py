"""The MariaDB loader's side of a two-way channel's marker-row loop guard (docs/bidirectional.md):
a connection that writes the channel's mark first in every transaction it writes, and puts the
mark's comment before every statement MariaDB logs as a query (DDL), right after a marked commit
that names its session, so that the other direction's reader drops them (`setl.loop_marks`).

Every statement the loader sends goes through `MarkedConnection.query`; that is what makes the
mark exact: no write path (rows, positions, the fence, conflicts, quarantine, DDL marks) can reach
the binlog without it, whatever part of the sink issued it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from setl import failpoints
from setl.adapters import pymysql as pymysql_io
from setl.loop_marks import MARK_DDL, MARK_SCHEMA, MARK_TABLE, ddl_comment

log = logging.getLogger("setl.sinks.mysql")

#: statements MariaDB logs as a query event of their own, committing the open transaction
_DDL_VERBS = frozenset({"CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE", "ANALYZE", "OPTIMIZE", "REPAIR", "GRANT",
                        "REVOKE", "FLUSH"})
#: statements that write nothing to the binlog (or end the transaction): no mark before them. A
#: SAVEPOINT is marked: the `LOAD DATA` that follows one (`mysql_load_data.LoadData.send`) is sent
#: past `query`, and a mark before the savepoint survives a ROLLBACK TO it.
_QUIET_VERBS = frozenset({"SELECT", "SHOW", "SET", "DESCRIBE", "DESC", "EXPLAIN", "KILL", "USE", "DO", "BEGIN",
                          "START", "COMMIT", "ROLLBACK", "RELEASE", "HELP", "CHECKSUM", "LOCK", "UNLOCK", "WITH"})
_LEADING = re.compile(r"^(?:\s+|/\*.*?\*/|--[^\n]*\n|#[^\n]*\n|\()*", re.S)
_VERB = re.compile(r"[A-Za-z]+")
_ENDS_TX = re.compile(r"(?:^|;)\s*(?:COMMIT|ROLLBACK)\s*;?\s*$", re.I)


def _verb(text: str) -> str:
    head = text[:400]
    found = _VERB.match(head, _LEADING.match(head).end())  # type: ignore[union-attr]
    return found[0].upper() if found else ""


class MarkedConnection(pymysql_io.Connection):
    """A PyMySQL connection that, once `loop_mark` is set (`start_marking`), upserts its row of the
    mark table before the first write of each transaction, and prefixes DDL with the mark's comment.

    A transaction ends at COMMIT or ROLLBACK (sent through `commit`/`rollback`, or as a statement,
    a multi-statement's last included), at a DDL (MariaDB commits around it) and at a failed
    statement (a deadlock rolls the transaction back): the next write marks again. Marking twice in
    one transaction costs a row update, never a miss.
    """

    loop_mark: str | None = None
    _marked = False

    def query(self, sql: Any, unbuffered: bool = False) -> int:
        if self.loop_mark is None:
            return int(super().query(sql, unbuffered))
        text = sql if isinstance(sql, str) else bytes(sql).decode(self.encoding, "surrogateescape")
        verb = _verb(text)
        if verb in _DDL_VERBS:
            # MariaDB commits the open transaction before a DDL: commit it here, marked, so that the
            # session's mark row (its connection id) is in the binlog right before the DDL. MariaDB
            # rewrites some DDL's text, dropping the comment (DROP TABLE): the reader knows it by its
            # session then.
            if not self._marked:
                self._mark()
            self.commit()
            failpoints.hit("loop_mark_ddl", task=f"{self.loop_mark} {verb}")
            return int(super().query(f"{ddl_comment(self.loop_mark)} {text}", unbuffered))
        if verb not in _QUIET_VERBS and not self._marked:
            self._mark()
        ends = verb in ("COMMIT", "ROLLBACK") or (";" in text[-40:] and _ENDS_TX.search(text[-40:]) is not None)
        if ends and self._marked and "COMMIT" in text[-40:].upper():
            failpoints.hit("loop_mark_commit", task=self.loop_mark)
        try:
            result = int(super().query(sql, unbuffered))
        except BaseException:
            self._marked = False
            raise
        if ends:
            self._marked = False
        return result

    def _mark(self) -> None:
        """Upsert this session's mark row (its `seq` always changes, so a rows event is always logged)."""
        mark = self.escape(self.loop_mark)
        super().query(f"INSERT INTO `{MARK_SCHEMA}`.`{MARK_TABLE}` (`mark`, `session`, `seq`) VALUES "
                      f"({mark}, CONNECTION_ID(), 1) ON DUPLICATE KEY UPDATE `seq` = `seq` + 1")
        self._marked = True

    def begin(self) -> None:
        self._marked = False
        super().begin()

    def commit(self) -> None:
        if self._marked and self.loop_mark is not None:
            failpoints.hit("loop_mark_commit", task=self.loop_mark)
        self._marked = False
        super().commit()

    def rollback(self) -> None:
        self._marked = False
        super().rollback()


def start_marking(conn: MarkedConnection, mark: str) -> None:
    """Make the mark table if missing (its DDL carrying the mark's comment), then mark every
    transaction of `conn`, starting with one that deletes the rows of `mark` left by sessions that
    are gone (`GONE`), if any: the table holds about a row per live loader session, not one per
    connection ever opened."""
    conn.loop_mark = None
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (MARK_SCHEMA, MARK_TABLE))
        row = cur.fetchone()
        if not row or not row[0]:
            cur.execute(f"{ddl_comment(mark)} CREATE DATABASE IF NOT EXISTS `{MARK_SCHEMA}`")
            cur.execute(f"{ddl_comment(mark)} {MARK_DDL}")
    conn.commit()
    conn.loop_mark = mark
    with conn.cursor() as cur:
        cur.execute(GONE, (mark,))  # a consistent read: no lock on a live session's row
        gone = [int(r[0]) for r in cur.fetchall()]
        if gone:  # marked first (`query`): the other reader drops it whole, an echo
            cur.execute(f"DELETE FROM `{MARK_SCHEMA}`.`{MARK_TABLE}` WHERE `mark` = %s AND `session` IN "
                        f"({', '.join(['%s'] * len(gone))})", (mark, *gone))
    conn.commit()


#: The sessions of one mark that are gone, whose rows `start_marking` deletes. Safe at any time: in a
#: transaction marked first, of this direction's mark only, and a session's row is only a carrier:
#: each marked transaction upserts it again, which logs a rows event whether the row was there or
#: not. The rows are deleted by key, so a live session's open transaction is never waited for (a
#: DELETE scanning the mark's rows would wait on the row lock of a loader's open batch).
GONE = (f"SELECT `session` FROM `{MARK_SCHEMA}`.`{MARK_TABLE}` WHERE `mark` = %s AND `session` <> CONNECTION_ID() "
        "AND `session` NOT IN (SELECT `ID` FROM information_schema.PROCESSLIST)")


__all__ = ["GONE", "MarkedConnection", "start_marking"]
