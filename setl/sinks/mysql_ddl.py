"""How the MySQL target runs a replicated DDL in its place among a batch's rows, and recognises
one that ran already (`MysqlDdlApplier`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import pymysql
import pymysql.err
from pymysql.connections import Connection

from setl.ddl import Statement
from setl.errors import LoadError
from setl.model import Batch
from setl.sinks.mysql_sql import SQL_MODE, plain_quote, quote, table_name
from setl.sinks.sql_failures import ddl_refused
from setl.sinks.sql_segments import DdlStep

log = logging.getLogger(__name__)

# What a DDL that already ran says when it runs again.
ALREADY_DONE_ERRORS = frozenset({
    1050,  # table already exists
    1051,  # unknown table
    1054,  # unknown column
    1060,  # duplicate column name
    1061,  # duplicate key name
    1091,  # can't drop: check that it exists
    1146,  # table doesn't exist
    4091,  # unknown sequence (DROP or ALTER SEQUENCE of one already dropped)
})


def _several_statements(statement: Statement) -> bool:
    """Whether a DDL text holds a statement separator before its end (one at the end is fine).
    The sink's connections take several statements at once (``CLIENT.MULTI_STATEMENTS``), so
    such a text would run as several, where a server taking one statement refuses it."""
    tokens = [t for t in statement.tokens if t.kind != "ws"]
    return any((t.kind == "punct" and t.text == ";" and i < len(tokens) - 1) or (t.kind == "xcomment" and ";" in t.text)
               for i, t in enumerate(tokens))


class MysqlDdlApplier:
    """Runs one table DDL of a batch on a connection of `MysqlLoad` (`apply`; see its docstring).

    It commits the rows before the DDL with a mark in the ``<position_table>_ddl`` table (`marks`),
    runs the DDL under the source statement's sql_mode, and leaves the connection in a new
    transaction under the sink's own mode; the caller takes the fence again after it. `forget` is
    called before each DDL, so that the sink learns its tables' columns again. It holds no state
    of its own: safe for the sink's threads.
    """

    def __init__(self, pipeline: str, marks: str, *, context: Callable[..., dict[str, Any]],
                 describe: Callable[[BaseException], str], forget: Callable[[], None],
                 refuses: Callable[[BaseException], bool] = lambda exc: False) -> None:
        """`context(batch, table=...)` names a batch in an error; `describe` gives one line for a
        driver error; `refuses(exc)`: whether a server error the statement met is one no retry
        changes (not a lock wait, a deadlock or a lost connection), raised as `ddl_refused`."""
        self.pipeline = pipeline
        self.marks = marks
        self._context = context
        self._describe = describe
        self._forget = forget
        self._refuses = refuses

    def apply(self, conn: Connection, batch: Batch, step: DdlStep) -> None:
        """MySQL commits around every DDL, so the rows before it commit with a mark naming this DDL
        (batch end and index), then the DDL runs and the rest of the batch gets a new transaction.

        A replay is recognised by the mark: after a crash between the DDL and the batch's
        position, an error saying it is already done (table exists, unknown table or column,
        duplicate column or key) counts as applied. Without the mark, a CREATE TABLE of an
        existing table is accepted only if the existing table has the same shape.
        """
        end = batch.end
        if _several_statements(step.statement):
            raise LoadError(f"refused: this DDL holds more than one statement: {step.change.statement}",
                            **{**self._context(batch, table=step.change.qualified_table),
                               "position": step.change.position or end})
        ref = step.statement.tables[0]
        self._forget()
        with conn.cursor() as cur:
            cur.execute(f"SELECT `mark` FROM {self.marks} WHERE `pipeline` = %s", (self.pipeline,))
            row = cur.fetchone()
            # The mark is the batch's end and the index of the last DDL of it that was started.
            stored_end, _, stored_index = (row[0] if row else "").rpartition("#")
            replay = stored_end == f"{end.log}:{end.offset}" and int(stored_index) >= step.index
            if not replay:
                cur.execute(f"INSERT INTO {self.marks} (`pipeline`, `mark`) VALUES (%s, %s)"
                            " ON DUPLICATE KEY UPDATE `mark` = VALUES(`mark`)",
                            (self.pipeline, f"{end.log}:{end.offset}#{step.index}"))
            conn.commit()
            if step.statement.kind in ("create_table", "create_sequence"):
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(ref.schema or step.change.schema)}", ())
            try:  # MariaDB refuses ALTER of a system-versioned table unless history is kept as is
                cur.execute("SET SESSION system_versioning_alter_history = KEEP", ())
            except pymysql.err.MySQLError as exc:
                if not (exc.args and exc.args[0] == 1193):  # unknown variable: MySQL has no versioning
                    raise
            mode = step.change.sql_mode
            try:
                if mode is not None:  # the source's mode: an ALTER it ran non-strict is not refused here
                    self._source_mode(cur, mode, step)
                cur.execute(step.change.statement)
            except pymysql.err.MySQLError as exc:
                code = exc.args[0] if exc.args else None
                if replay and code in ALREADY_DONE_ERRORS:
                    log.info("pipeline=%s stage=load table=%s position=%s: replayed DDL was applied "
                             "before (%s): %s", self.pipeline, step.change.qualified_table, end,
                             self._describe(exc), step.change.statement)
                elif not (code == 1050 and (
                        (step.statement.kind == "create_table" and self._same_shape(cur, step))
                        or (step.statement.kind == "create_sequence" and self._same_sequence(cur, step)))):
                    answered = isinstance(code, int) and code < 2000
                    if not replay and answered:
                        self._unmark(conn, cur, row[0] if row else None)
                    if answered and self._refuses(exc):  # the table's own: quarantine it or pause
                        raise ddl_refused(self._describe(exc), step.change, step.statement,
                                          self._context(batch, table=step.change.qualified_table)) from exc
                    raise
            finally:
                if mode is not None:
                    cur.execute("SET SESSION sql_mode = %s", (SQL_MODE,))

    def _unmark(self, conn: Connection, cur: Any, before: str | None) -> None:
        """The server refused the DDL (an error it answered, not a lost connection): nothing of it
        ran, so its mark goes back to what it was. Otherwise the batch's next attempt (a retry, a
        `setl resume`) would take the same refusal (a duplicate column, say) for a replay of a DDL
        that ran, and pass over it."""
        try:
            if before is None:
                cur.execute(f"DELETE FROM {self.marks} WHERE `pipeline` = %s", (self.pipeline,))
            else:
                cur.execute(f"UPDATE {self.marks} SET `mark` = %s WHERE `pipeline` = %s", (before, self.pipeline))
            conn.commit()
        except pymysql.err.MySQLError:  # the refusal is what the caller reports; the next attempt is a replay then
            log.warning("pipeline=%s: the mark of a refused DDL could not be taken back", self.pipeline, exc_info=True)

    def _source_mode(self, cur: Any, mode: str, step: DdlStep) -> None:
        """Set the session to the source statement's sql_mode; a mode the target does not know
        (MariaDB's NO_AUTO_CREATE_USER or SIMULTANEOUS_ASSIGNMENT on MySQL 8: error 1231) runs
        without the names it refuses, and without strict mode when the source's had none."""
        try:
            cur.execute("SET SESSION sql_mode = %s", (mode,))
            return
        except pymysql.err.MySQLError as exc:
            if not (exc.args and exc.args[0] == 1231):
                raise
        kept: list[str] = []
        for name in filter(None, mode.split(",")):
            try:
                cur.execute("SET SESSION sql_mode = %s", (",".join([*kept, name]),))
                kept.append(name)
            except pymysql.err.MySQLError as exc:
                if not (exc.args and exc.args[0] == 1231):
                    raise
        cur.execute("SET SESSION sql_mode = %s", (",".join(kept),))
        log.info("pipeline=%s stage=load table=%s: the target does not know every mode of the source's sql_mode "
                 "%s; the DDL runs under %s", self.pipeline, step.change.qualified_table, mode, ",".join(kept) or "''")

    def _same_shape(self, cur: Any, step: DdlStep) -> bool:
        """Whether the table a CREATE TABLE names exists with the shape the statement gives it."""
        def shape(text: str, _name: str) -> list[str]:
            return [re.sub(r" AUTO_INCREMENT=\d+", "", line) for line in text.splitlines()[1:]]

        if not self._same_as_twin(cur, step, "TABLE", shape):
            return False
        log.info("pipeline=%s stage=load table=%s: table exists with the same shape; CREATE TABLE "
                 "counts as applied", self.pipeline, step.change.qualified_table)
        return True

    def _same_sequence(self, cur: Any, step: DdlStep) -> bool:
        """Whether the sequence a CREATE SEQUENCE names exists with the options the statement gives
        it (one created from a state row before its CREATE arrived, say)."""
        def options(text: str, name: str) -> str:
            return text[text.index(plain_quote(name)) + len(plain_quote(name)):]

        if not self._same_as_twin(cur, step, "SEQUENCE", options):
            return False
        log.info("pipeline=%s stage=load table=%s: sequence exists with the same options; CREATE SEQUENCE "
                 "counts as applied", self.pipeline, step.change.qualified_table)
        return True

    @staticmethod
    def _same_as_twin(cur: Any, step: DdlStep, kind: str, form: Callable[[str, str], Any]) -> bool:
        """Whether the object (TABLE or SEQUENCE: `kind`) a CREATE names exists as the statement
        would create it: the statement runs again as a scratch TEMPORARY twin, and `form` of both
        SHOW CREATE texts (given the text and the object's name) must be equal. False when the twin
        cannot be made (a system-versioned or sequence table has none) or, for a sequence, the
        existing object is a table."""
        tokens = step.statement.tokens
        ref = step.statement.tables[0]
        schema = ref.schema or step.change.schema
        head = [t.text for t in tokens[:ref.start]]
        word = max(i for i, t in enumerate(tokens[:ref.start]) if t.upper == kind)
        head[word] = f"TEMPORARY {kind}"
        scratch = "setl_shape_check"
        try:
            cur.execute("".join(head) + table_name(schema, scratch).replace("%%", "%")
                        + "".join(t.text for t in tokens[ref.end:]))
        except pymysql.err.MySQLError:
            return False
        try:
            forms = []
            for name in (ref.table, scratch):
                cur.execute(f"SHOW CREATE {kind} {table_name(schema, name)}", ())
                forms.append(form(str(cur.fetchone()[1]), name))
        except pymysql.err.MySQLError:
            if kind != "SEQUENCE":
                raise
            return False  # the existing object is a table, not a sequence
        finally:
            cur.execute(f"DROP TEMPORARY {kind} IF EXISTS {table_name(schema, scratch)}", ())
        return bool(forms[0] == forms[1])
