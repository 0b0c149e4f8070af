"""The parser of setl's one DDL model: a MySQL/MariaDB statement's kind, table names, column names,
column definitions and clauses (`setl.ddl.model.Statement`), read once where the statement enters
the pipeline (the binlog source).

It is not a full SQL parser. It finds names by their place in the statement kinds setl applies
(CREATE, ALTER, RENAME, TRUNCATE and DROP TABLE, CREATE and DROP INDEX, CREATE, ALTER and DROP
SEQUENCE) and leaves every other byte as it was: the MySQL rendering of a model is its tokens.
Known limits: a column inside an expression (CHECK, DEFAULT (...), a generated column) is renamed
only when it opens a parenthesised list; an unqualified name in a statement whose first table is
qualified is taken to be in that first table's schema (the binlog does not say the session's).
"""

from __future__ import annotations

from collections.abc import Sequence

from setl.ddl.model import SEQUENCE_KINDS, ColumnDef, Element, Statement, TableRef
from setl.ddl.tokens import Reader, Token, tokenize

_NOT_COLUMNS = frozenset({
    "PRIMARY", "KEY", "INDEX", "UNIQUE", "CONSTRAINT", "FOREIGN", "CHECK", "FULLTEXT", "SPATIAL",
    "PERIOD", "PARTITION", "SYSTEM", "LIKE", "COLUMN", "IF", "DEFAULT",
})
_COLUMN_CLAUSES = frozenset({"ADD", "DROP", "MODIFY", "CHANGE", "ALTER", "AFTER"})
#: words that open a CREATE TABLE element or an ADD clause that is not a column
ELEMENT_KEYWORDS = frozenset({"PRIMARY", "UNIQUE", "CONSTRAINT", "KEY", "INDEX", "FULLTEXT", "SPATIAL", "FOREIGN",
                              "CHECK", "PERIOD"})


def _table(r: Reader) -> TableRef | None:
    """Consume a [schema.]table name."""
    first = r.peek()
    if first is None or not first.is_name:
        return None
    start = r.sig[r.at]
    dot, second = r.peek(1), r.peek(2)
    if dot is not None and dot.text == "." and second is not None and second.is_name:
        r.at += 3
        return TableRef(start, r.sig[r.at - 1] + 1, first.name, second.name)
    r.at += 1
    return TableRef(start, start + 1, None, first.name)


def split(tokens: Sequence[Token]) -> list[list[Token]]:
    """`tokens` cut at commas outside parentheses."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for token in tokens:
        if token.text == "," and depth == 0:
            parts.append([])
            continue
        depth += {"(": 1, ")": -1}.get(token.text, 0)
        parts[-1].append(token)
    return [p for p in parts if p]


def parse(statement: str) -> Statement:
    """The model of a MySQL DDL statement: its kind, table names, column names and definitions."""
    return parse_tokens(tuple(tokenize(statement)))


def parse_tokens(tokens: tuple[Token, ...]) -> Statement:
    """`parse` of a statement already tokenized (as `setl.ddl.rewrite` edits one)."""
    r = Reader(tokens)
    tables: list[TableRef] = []

    def table() -> None:
        ref = _table(r)
        if ref is not None:
            tables.append(ref)

    def table_list(separator_word: str | None = None) -> None:
        while True:
            table()
            if separator_word and r.word(separator_word):
                table()
            token = r.peek()
            if token is None or token.text != ",":
                return
            r.at += 1

    kind = "other"
    if r.word("CREATE"):
        r.words("OR", "REPLACE")
        if r.word("TEMPORARY"):
            return Statement("other", tokens)  # not in a ROW binlog, never the target's business
        if r.word("TABLE"):
            kind = "create_table"
            r.words("IF", "NOT", "EXISTS")
            table()
        elif r.word("SEQUENCE"):
            kind = "create_sequence"
            r.words("IF", "NOT", "EXISTS")
            table()
        else:
            r.word("ONLINE", "OFFLINE")
            r.word("UNIQUE", "FULLTEXT", "SPATIAL")
            if r.word("INDEX"):
                kind = "create_index"
    elif r.word("ALTER"):
        r.word("ONLINE", "OFFLINE")
        r.word("IGNORE")
        if r.word("TABLE"):
            kind = "alter_table"
            r.words("IF", "EXISTS")
            table()
        elif r.word("SEQUENCE"):
            kind = "alter_sequence"
            r.words("IF", "EXISTS")
            table()
    elif r.word("RENAME"):
        if r.word("TABLE", "TABLES"):
            kind = "rename_table"
            table_list("TO")
    elif r.word("TRUNCATE"):
        r.word("TABLE")
        kind = "truncate_table"
        table()
    elif r.word("DROP"):
        if r.word("TEMPORARY"):
            return Statement("other", tokens)
        if r.word("TABLE", "TABLES"):
            kind = "drop_table"
            r.words("IF", "EXISTS")
            table_list()
        elif r.word("SEQUENCE"):
            kind = "drop_sequence"
            r.words("IF", "EXISTS")
            table_list()
        else:
            r.word("ONLINE", "OFFLINE")
            if r.word("INDEX"):
                kind = "drop_index"
    if kind in ("create_index", "drop_index"):
        r.words("IF", "NOT", "EXISTS") or r.words("IF", "EXISTS")
        while r.peek() is not None and not r.word("ON"):
            r.at += 1
        table()
    if kind == "other" or not tables:
        return Statement("other", tokens)
    head = tuple(t.upper for t in tokens[:tables[0].start] if t.kind != "ws")
    if kind in SEQUENCE_KINDS:
        return Statement(kind, tokens, tuple(tables), head=head)
    structure = r.at
    renames: list[int] = []
    columns = _scan_rest(r, tables, renames, in_create=kind == "create_table")
    r.at = structure
    elements: tuple[Element, ...] = ()
    options: tuple[Token, ...] = ()
    like, unparsed = False, None
    try:
        if kind == "create_table":
            elements, options, like = _create_elements(r)
        elif kind == "alter_table":
            elements = tuple(_alter_element(clause) for clause in split(r.rest()))
    except ValueError as exc:  # unbalanced parentheses, a statement cut short
        unparsed = str(exc)
    return Statement(kind, tokens, tuple(tables), tuple(columns), elements, options, like, head, unparsed,
                     tuple(renames))


def _scan_rest(r: Reader, tables: list[TableRef], renames: list[int], in_create: bool) -> list[int]:
    """After the statement's table: more table names (LIKE, REFERENCES, RENAME TO: its place in
    `tables` noted in `renames`) and columns."""
    columns: list[int] = []
    depth = 0
    expect_column = 0  # how many column names the current ALTER clause still names
    while (token := r.peek()) is not None:
        index = r.sig[r.at]
        if token.text == "(":
            depth += 1
            r.at += 1
            _element_start(r, columns)
            continue
        if token.text == ")":
            depth = max(0, depth - 1)
        elif token.text == "," and depth >= 1:
            r.at += 1
            _element_start(r, columns)
            continue
        elif token.upper in ("REFERENCES", "LIKE") and (depth == 0 or token.upper == "REFERENCES"
                                                       or in_create):
            r.at += 1
            ref = _table(r)
            if ref is not None:
                tables.append(ref)
            continue
        elif depth == 0 and not in_create:
            if token.upper == "RENAME":
                r.at += 1
                if r.word("COLUMN"):
                    expect_column = 2  # old TO new
                elif r.word("INDEX", "KEY"):
                    expect_column = 0
                else:
                    r.word("TO", "AS")
                    ref = _table(r)
                    if ref is not None:
                        renames.append(len(tables))
                        tables.append(ref)
                continue
            if token.upper in _COLUMN_CLAUSES:
                r.at += 1
                r.word("COLUMN")
                r.words("IF", "NOT", "EXISTS") or r.words("IF", "EXISTS")
                nxt = r.peek()
                if nxt is not None and nxt.is_name and nxt.upper not in _NOT_COLUMNS:
                    columns.append(r.sig[r.at])
                    r.at += 1
                    if token.upper == "CHANGE":
                        nxt = r.peek()
                        if nxt is not None and nxt.is_name:
                            columns.append(r.sig[r.at])
                            r.at += 1
                continue
            if expect_column and token.is_name and token.upper != "TO":
                columns.append(index)
                expect_column -= 1
        r.at += 1
    return columns


def _element_start(r: Reader, columns: list[int]) -> None:
    """The first token of a parenthesised list element names a column unless it is a keyword."""
    token = r.peek()
    if token is not None and token.is_name and token.upper not in _NOT_COLUMNS:
        columns.append(r.sig[r.at])
        r.at += 1


def _create_elements(r: Reader) -> tuple[tuple[Element, ...], tuple[Token, ...], bool]:
    """A CREATE TABLE's list (from `r`, just after its table): its elements, the table options after
    it, and whether it is a CREATE TABLE ... LIKE."""
    if r.sees("LIKE") or (r.sees("(") and r.sees("LIKE", 1)):
        return (), tuple(r.rest()), True
    if not r.sees("("):
        return (), tuple(r.rest()), False  # CREATE TABLE t SELECT ..., CREATE TABLE t AS SELECT ...
    elements = []
    for part in split(r.group()):
        if part[0].kind != "ident" and part[0].upper in ELEMENT_KEYWORDS:
            elements.append(Element(tuple(part), (), part[0].upper))
        else:
            elements.append(Element(tuple(part), (column_definition(part),)))
    return tuple(elements), tuple(r.rest()), False


def _alter_element(clause: list[Token]) -> Element:
    """One ALTER TABLE clause, with the column definitions of an ADD, MODIFY or CHANGE."""
    t = Reader(clause)
    verb = t.next().upper
    columns: list[ColumnDef] = []
    if verb == "ADD":
        t.word("COLUMN")
        t.words("IF", "NOT", "EXISTS")
        token = t.peek()
        versioning = t.sees("SYSTEM") and t.sees("VERSIONING", 1)  # MariaDB's ADD SYSTEM VERSIONING
        if token is not None and not versioning and not (
                token.kind != "ident" and token.upper in ELEMENT_KEYWORDS | {"PARTITION"}):
            parts = split(t.group()) if token.text == "(" else [t.rest()]
            columns = [column_definition(part) for part in parts]
    elif verb in ("MODIFY", "CHANGE"):
        t.word("COLUMN")
        t.words("IF", "EXISTS")
        if verb == "CHANGE":
            t.next()
        columns = [column_definition(t.rest())]
    return Element(tuple(clause), tuple(columns), verb)


def column_definition(tokens: Sequence[Token]) -> ColumnDef:
    """A column definition (its significant tokens: name, type, attributes) as a `ColumnDef`; never
    raises: what it cannot read is its `unknown`."""
    t = Reader(tokens)
    name = t.next().name if not t.done() else ""
    try:
        return _column(t, name)
    except ValueError as exc:
        return ColumnDef(name, "", unknown=str(exc))


def _column(t: Reader, name: str) -> ColumnDef:
    base = t.next().upper
    if base == "NATIONAL":  # NATIONAL CHAR(n), NATIONAL VARCHAR(n): utf8 character types
        base = {"CHAR": "NCHAR", "CHARACTER": "NCHAR", "VARCHAR": "NVARCHAR"}.get(t.next().upper, "")
    if base == "NCHAR" and t.word("VARYING"):
        base = "NVARCHAR"
    if base == "DOUBLE":
        t.word("PRECISION")
    if base in ("CHARACTER", "CHAR") and t.word("VARYING"):
        base = "VARCHAR"
    args: tuple[Token, ...] = ()
    if t.sees("("):
        args = tuple(part[0] for part in split(t.group()))
    unsigned = zerofill = False
    while (token := t.peek()) is not None and token.upper in ("UNSIGNED", "SIGNED", "ZEROFILL"):
        unsigned = unsigned or token.upper != "SIGNED"
        zerofill = zerofill or token.upper == "ZEROFILL"
        t.next()
    found: dict[str, object] = {}
    key, generated, period, binary = "", False, False, False
    while not t.done():
        if t.word("NOT"):
            if not t.word("NULL"):
                found["unknown"] = "NOT without NULL"
                break
            found["not_null"] = True
        elif t.word("NULL", "FIRST", "SIGNED", "UNSIGNED", "VISIBLE", "ASCII", "UNICODE", "BYTE", "VIRTUAL",
                    "STORED", "PERSISTENT"):
            pass
        elif t.word("AUTO_INCREMENT"):
            found["auto_increment"] = True
        elif t.word("INVISIBLE"):
            found["invisible"] = True
        elif t.word("DEFAULT"):
            found["default"] = expression(t)
        elif t.word("PRIMARY"):
            t.word("KEY")
            key += " PRIMARY KEY"
        elif t.word("KEY"):
            key += " PRIMARY KEY"
        elif t.word("UNIQUE"):
            t.word("KEY")
            key += " UNIQUE"
        elif t.word("BINARY"):
            binary = True  # CHAR(n) BINARY: the charset's binary collation
        elif t.word("COLLATE"):
            collation = t.next().name.lower()
            found["collation"] = collation
            binary = binary or collation.endswith("_bin") or collation == "binary"
        elif t.word("CHARSET"):
            found["charset"] = t.next().name.lower()
        elif t.word("CHARACTER"):
            t.word("SET")
            found["charset"] = t.next().name.lower()
        elif t.word("COMMENT"):
            found["comment"] = t.next().text
        elif t.word("AFTER"):
            t.next()
        elif t.word("REF_SYSTEM_ID"):  # MariaDB's SRID of a spatial column: each value carries it
            if t.sees("="):
                t.next()
            t.next()
        elif t.word("SRID"):  # MySQL's
            t.next()
        elif t.word("ON"):
            t.word("UPDATE")
            found["on_update"] = expression(t)
        elif t.word("GENERATED"):  # GENERATED ALWAYS AS (expr)
            t.word("ALWAYS")
            generated = True
        elif t.words("AS", "ROW"):  # AS ROW START/END: a system-versioning period column
            t.word("START", "END")
            period = True
        elif t.word("AS"):
            t.group()
            generated = True
        elif t.words("WITH", "SYSTEM", "VERSIONING") or t.words("WITHOUT", "SYSTEM", "VERSIONING"):
            pass
        elif t.word("CHECK"):
            t.group()
        elif t.word("REFERENCES"):
            t.at = len(t.sig)
        else:
            found["unknown"] = t.next().text
            break
    return ColumnDef(name, base, args, unsigned, zerofill, key=key, binary=binary, generated=generated and not period,
                     period=period, **found)  # type: ignore[arg-type]


def expression(t: Reader) -> tuple[Token, ...]:
    """Consume a DEFAULT or ON UPDATE expression: NULL, a number, a string (with a charset
    introducer, b'..', x'..'), a parenthesised group, a function call, NEXT|PREVIOUS VALUE FOR
    [schema.]name, or one word; its tokens."""
    start = t.at
    token = t.next()
    if token.upper in ("NEXT", "PREVIOUS") and t.sees("VALUE") and t.sees("FOR", 1):
        t.next(), t.next(), t.next()
        if t.sees("."):
            t.next(), t.next()
    elif token.text in ("-", "+"):
        token = t.next()
        if token.kind == "word" and token.text[0].isdigit() and t.sees("."):
            t.next(), t.next()
    elif token.kind == "word" and token.text[0].isdigit():
        if t.sees("."):
            t.next(), t.next()
    elif token.text == "(":
        t.at -= 1
        t.group()
    elif token.kind == "word" and (value := t.peek()) is not None and value.kind == "string":
        t.next()  # b'0101', x'ff', _utf8mb4'...'
    elif token.kind == "word" and t.sees("("):
        t.group()  # a function call: CURRENT_TIMESTAMP(6), MariaDB's concat('a','b'), uuid(), nextval(s)
    return tuple(t.tokens[t.sig[k]] for k in range(start, t.at))


__all__ = ["ELEMENT_KEYWORDS", "column_definition", "expression", "parse", "parse_tokens", "split"]
