"""What the binlog source reads from SQL text: the table a DDL or DML statement acts on, savepoints, XA.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs

from setl import ddl
from setl.model import DdlChange, Position

_IGNORED_IN_TX = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO|RELEASE\s+SAVEPOINT|XA\s)", re.I)
# How the server logs the second phase of a prepared XA transaction (its own event group).
_XA_END = re.compile(r"^\s*XA\s+(?P<verb>COMMIT|ROLLBACK)\s+X'(?P<gtrid>[0-9a-f]*)'\s*,\s*X'(?P<bqual>[0-9a-f]*)'"
                     r"\s*,\s*(?P<format>\d+)\s*;?\s*$", re.I)

_NAME = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_QUALIFIED = rf"(?P<name>{_NAME}(?:\s*\.\s*{_NAME})?)"
_DDL_DATABASE = re.compile(rf"^(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:DATABASE|SCHEMA)\s+"
                           rf"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?P<name>{_NAME})", re.I)
_SAVEPOINT = re.compile(rf"^\s*(?P<verb>SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO(?:\s+SAVEPOINT)?|RELEASE\s+SAVEPOINT)\s+"
                        rf"(?P<name>{_NAME})\s*;?\s*$", re.I)
_LEADING_COMMENTS = re.compile(r"^\s*(?:/\*(?!!).*?\*/\s*|#[^\n]*\n\s*|--\s[^\n]*\n\s*)*", re.S)


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def ddl_target(statement: str, default_schema: str, parsed: ddl.Statement | None = None) -> tuple[str, str | None]:
    """``(schema, table or None)`` a DDL statement acts on: the database of CREATE/ALTER/DROP
    DATABASE, else the first table of its model `parsed` (`setl.ddl`; parsed here when not given;
    None for a statement that is not a table DDL)."""
    match = _DDL_DATABASE.match(_LEADING_COMMENTS.sub("", statement, count=1))
    if match:
        return _unquote(match["name"]), None
    if parsed is None:
        parsed = ddl.parse(statement)
    if not parsed.tables:
        return default_schema, None
    first = parsed.tables[0]
    return first.schema or default_schema, first.table


_DML = re.compile(r"^\s*(?:INSERT|REPLACE|UPDATE|DELETE|LOAD\s+(?:DATA|XML)|WITH\s|CALL\s)", re.I)
_DML_TARGETS = [
    re.compile(rf"^\s*(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*(?:INTO\s+)?"
               rf"{_QUALIFIED}", re.I),
    re.compile(rf"^\s*UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*{_QUALIFIED}\s+SET\s", re.I),
    re.compile(rf"^\s*DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*FROM\s+{_QUALIFIED}"
               rf"\s*(?:$|;|WHERE\s|ORDER\s|LIMIT\s|RETURNING\s|PARTITION\s)", re.I),
    re.compile(rf"^\s*LOAD\s+(?:DATA|XML)\s.*?\sINTO\s+TABLE\s+{_QUALIFIED}", re.I | re.S),
]


def dml_text(statement: str) -> str | None:
    """`statement` without its leading comments when it may change rows (INSERT, REPLACE, UPDATE,
    DELETE, LOAD DATA/XML, a WITH or a CALL: a row change logged as a statement), else None."""
    text = _LEADING_COMMENTS.sub("", statement, count=1)
    return text if _DML.match(text) else None


def dml_target(statement: str, default_schema: str) -> tuple[str, str] | None:
    """``(schema, table)`` a single-table DML statement writes, or None when it cannot be told
    (a multi-table UPDATE or DELETE, a CTE, a procedure call)."""
    for pattern in _DML_TARGETS:
        match = pattern.match(statement)
        if match:
            parts = re.split(rf"\s*\.\s*(?={_NAME}$)", match["name"], maxsplit=1)
            if len(parts) == 2:
                return _unquote(parts[0]), _unquote(parts[1])
            return default_schema, _unquote(parts[0])
    return None


# What a statement writing one table may not hold to be that table's alone: a SELECT (INSERT ...
# SELECT, a subquery), a join, a sequence drawn on, a LOAD.
_OTHER_TABLES = re.compile(r"\b(?:SELECT|JOIN|TABLE|NEXT\s+VALUE|PREVIOUS\s+VALUE|NEXTVAL|LASTVAL|SETVAL)\b", re.I)
_LITERALS = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"|`(?:[^`]|``)*`", re.S)
_CALLED = re.compile(r"([A-Za-z_$][\w$]*)\s*\(")
_NOT_CALLS = frozenset({"VALUES", "VALUE", "IN", "AND", "OR", "NOT", "AS", "SET", "WHERE", "ON", "INTO", "PARTITION",
                        "EXISTS", "ANY", "ALL", "SOME", "IS", "LIKE", "BETWEEN", "CASE", "WHEN", "THEN", "ELSE"})


def one_table_dml(statement: str, default_schema: str) -> tuple[tuple[str, str], frozenset[str]] | None:
    """For an INSERT, REPLACE, UPDATE or DELETE logged as a statement that names one table only (its
    target: no SELECT, join, second table or sequence in it; not LOAD DATA), ``((schema, table), the
    names it calls as functions)``, for the source to ask whether a stored function or a trigger
    could write elsewhere; None for any other statement (its tables cannot be told for sure)."""
    if re.match(r"\s*LOAD\s", statement, re.I):
        return None
    target = dml_target(statement, default_schema)
    if target is None:
        return None
    bare = _LITERALS.sub("''", _LEADING_COMMENTS.sub("", statement, count=1))
    if "/*" in bare or "#" in bare or "-- " in bare or _OTHER_TABLES.search(bare):
        return None  # a comment may hide what follows from these checks: not judged
    called = {name.lower() for name in _CALLED.findall(bare) if name.upper() not in _NOT_CALLS}
    called.discard(target[1].lower())  # INSERT INTO t(a, b)
    return target, frozenset(called)


@attrs.frozen
class LoggedStatement:
    """A row change logged as a statement, as read again from the binlog (a prepared XA
    transaction's, `setl.sources.mysql_binlog.xa`): its text, the session's default schema and where
    it was read (``LOG:OFFSET``), for the assembler to judge at XA COMMIT as if read there."""

    schema: str
    text: str
    where: str


@attrs.frozen
class StatementMarker:
    """A row change to `schema`.`table` logged as statement `text`, held in its place among the rows of
    its transaction (the assembler's item): handed on as the marker `DdlChange.rows_logged_as_statement`."""

    schema: str
    table: str
    text: str

    def change(self, at: Position) -> DdlChange:
        return DdlChange.rows_logged_as_statement(self.schema, self.table, self.text, at)


def undone(read: object, transactional: Callable[[str, str], bool] | None) -> bool:
    """Whether a ROLLBACK (TO SAVEPOINT) undid what a transaction item holding `read` stands for: a
    statement marker of a table whose engine is `transactional` (None: every table's); a DDL item is
    never undone."""
    if not isinstance(read, StatementMarker):
        return False
    return transactional is None or transactional(read.schema, read.table)


@attrs.define
class StatementJudge:
    """What the binlog source does with a row change logged as a statement (a session with
    binlog_format STATEMENT or MIXED), for which setl has no row images. One on a table the rules skip
    is passed over. Under `markers` (``on_table_error: quarantine``, docs/quarantine.md), one inside a
    transaction that writes one read table alone (`one_table_dml`, and `writes_elsewhere` finds no
    trigger or stored function) becomes a `StatementMarker` held in its place, which quarantines that
    table at the target. Any other is refused at the end of its transaction."""

    markers: bool = False
    #: why such a statement may write other tables as well, asked of the server
    #: (`TableLookups.writes_elsewhere`); None: it cannot be asked, so no marker is made
    writes_elsewhere: Callable[[str, str, frozenset[str]], str | None] | None = None
    #: what `writes_elsewhere` answered for a skipped table's statements, until the next DDL (`forget`)
    skipped: dict[tuple[str, str, frozenset[str]], str | None] = attrs.field(factory=dict)

    def forget(self) -> None:
        """A DDL was read (it may make or drop a trigger or a function): ask the server again."""
        self.skipped.clear()

    def judge(self, text: str, schema: str, selects: Callable[[str, str], bool] | None, in_tx: bool
              ) -> StatementMarker | tuple[str | None, str] | None:
        """None: passed over (a table `selects` refuses, which has no trigger and calls no stored
        function that might write another table); a marker; else (its table or None, the text to
        show) to refuse."""
        target = dml_target(text, schema)
        shown = " ".join(text.split())[:120]
        if target is not None and selects is not None and not selects(*target):
            why = self._skipped_writes_elsewhere(text, schema, target)
            # its trigger or function ran on the source and wrote what setl cannot see (statement
            # logging logs the statement only): the tables it wrote are unknown
            return None if why is None else (None, f"{shown} (on {target[0]}.{target[1]}, which the rules skip, but "
                                                   f"{why}, which may write tables the pipeline reads)")
        if self.markers:
            why = self._not_alone(text, schema, in_tx)
            if why is None and target is not None:
                return StatementMarker(target[0], target[1], text)
            shown = f"{shown} (it cannot quarantine its table alone: {why})"
        return (f"{target[0]}.{target[1]}" if target is not None else None), shown

    def _skipped_writes_elsewhere(self, text: str, schema: str, target: tuple[str, str]) -> str | None:
        """Why a statement on a table the rules skip may write other tables (`writes_elsewhere`), or
        None; asked once per table and the functions it calls until the next DDL."""
        if self.writes_elsewhere is None:
            return None
        found = one_table_dml(text, schema)
        called = found[1] if found is not None else frozenset()
        key = (target[0], target[1], called)
        if key not in self.skipped:
            self.skipped[key] = self.writes_elsewhere(target[0], target[1], called)
        return self.skipped[key]

    def _not_alone(self, text: str, schema: str, in_tx: bool) -> str | None:
        """Why statement `text` cannot be the marker of one table, or None."""
        if not in_tx:
            return "it is not inside a transaction"
        found = one_table_dml(text, schema)
        if found is None:
            return "it names more than one table, or setl cannot tell which tables it writes"
        if self.writes_elsewhere is None:
            return "setl cannot ask the source whether it writes other tables"
        (target_schema, table), called = found
        why = self.writes_elsewhere(target_schema, table, called)
        return f"{why}, which may write other tables" if why is not None else None
