"""MySQL table DDL as setl reads it: a tokenizer that respects quotes and comments, the table and
column names a statement refers to, and a rewrite of those names (the table rules' mapping).

It is not a SQL parser. It finds names by their place in the statement kinds setl applies (CREATE,
ALTER, RENAME, TRUNCATE and DROP TABLE, CREATE and DROP INDEX, CREATE, ALTER and DROP SEQUENCE) and
leaves every other byte as it was.
Known limits: a column inside an expression (CHECK, DEFAULT (...), a generated column) is renamed
only when it opens a parenthesised list; an unqualified name in a statement whose first table is
qualified is taken to be in that first table's schema (the binlog does not say the session's).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import attrs

_TOKEN = re.compile(
    r"""(?P<ws>(?:\s+|/\*(?!!).*?\*/|\#[^\n]*|--(?:\s[^\n]*)?(?=\n|$))+)
      | (?P<ident>`(?:[^`]|``)*`)
      | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
      | (?P<xcomment>/\*!.*?\*/)
      | (?P<word>[\w$]+)
      | (?P<punct>.)""",
    re.S | re.X,
)


@attrs.frozen
class Token:
    """One lexical token of a DDL statement as `tokenize` splits it; joining the texts of every
    token gives the statement back unchanged, so a rename edits only the tokens it means."""

    kind: str  # ws, ident (backquoted), string, xcomment, word, punct
    text: str

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def is_name(self) -> bool:
        """A token that can name a table or column: backquoted, or a word not starting with a digit."""
        return self.kind == "ident" or (self.kind == "word" and not self.text[0].isdigit())

    @property
    def name(self) -> str:
        return self.text[1:-1].replace("``", "`") if self.kind == "ident" else self.text


def tokenize(statement: str) -> list[Token]:
    """Every character of `statement` in exactly one token (joining the texts gives it back)."""
    tokens = []
    for match in _TOKEN.finditer(statement):
        kind = match.lastgroup
        assert kind is not None
        tokens.append(Token(kind, match.group()))
    return tokens


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@attrs.frozen
class TableRef:
    """A (possibly qualified) table name at tokens[start:end]."""

    start: int
    end: int
    schema: str | None
    table: str


@attrs.frozen
class Statement:
    """A tokenized statement, its kind and where its table and column names are.

    `kind` is one of create_table, alter_table, rename_table, truncate_table, drop_table,
    create_index, drop_index, create_sequence, alter_sequence, drop_sequence, or other (anything
    else: not a table DDL setl applies). A sequence is a table to MariaDB (and to the table rules):
    its statements list its name(s) as table names; they name no columns.
    `tables` lists every table name in order of appearance; the first is the statement's table
    (a RENAME TABLE lists old and new names in pairs).
    `columns` holds the token indexes of column names.
    """

    kind: str
    tokens: tuple[Token, ...]
    tables: tuple[TableRef, ...] = ()
    columns: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)


# Words that open a table element or ALTER clause without being a column name.
#: The statement kinds of sequences (`Statement.kind`).
SEQUENCE_KINDS = frozenset({"create_sequence", "alter_sequence", "drop_sequence"})
_NOT_COLUMNS = frozenset({
    "PRIMARY", "KEY", "INDEX", "UNIQUE", "CONSTRAINT", "FOREIGN", "CHECK", "FULLTEXT", "SPATIAL",
    "PERIOD", "PARTITION", "SYSTEM", "LIKE", "COLUMN", "IF", "DEFAULT",
})
_COLUMN_CLAUSES = frozenset({"ADD", "DROP", "MODIFY", "CHANGE", "ALTER", "AFTER"})


class Reader:
    """Walks the significant tokens (not whitespace or plain comments) of a token list."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        self.tokens = tokens
        self.sig = [i for i, t in enumerate(tokens) if t.kind != "ws"]
        self.at = 0

    def peek(self, ahead: int = 0) -> Token | None:
        k = self.at + ahead
        return self.tokens[self.sig[k]] if k < len(self.sig) else None

    def next(self) -> Token:
        token = self.peek()
        if token is None:
            raise ValueError("the statement ends too early")
        self.at += 1
        return token

    def done(self) -> bool:
        return self.at >= len(self.sig)

    def sees(self, text: str, ahead: int = 0) -> bool:
        """Whether the token `ahead` is `text` (a word compared without case)."""
        token = self.peek(ahead)
        return token is not None and (token.text == text or token.upper == text)

    def rest(self) -> list[Token]:
        """The significant tokens not read yet."""
        return [self.tokens[i] for i in self.sig[self.at:]]

    def word(self, *words: str) -> bool:
        """Consume the next token if it is one of `words`."""
        token = self.peek()
        if token is not None and token.upper in words:
            self.at += 1
            return True
        return False

    def words(self, *sequence: str) -> bool:
        """Consume `sequence` if the next tokens are exactly it."""
        for k, word in enumerate(sequence):
            token = self.peek(k)
            if token is None or token.upper != word:
                return False
        self.at += len(sequence)
        return True

    def group(self) -> list[Token]:
        """Consume a parenthesised group; its significant tokens without the outer parentheses."""
        if self.next().text != "(":
            raise ValueError("expected '('")
        depth = 1
        inner: list[Token] = []
        while True:
            token = self.next()
            depth += {"(": 1, ")": -1}.get(token.text, 0)
            if depth == 0:
                return inner
            inner.append(token)

    def table(self) -> TableRef | None:
        """Consume a [schema.]table name."""
        first = self.peek()
        if first is None or not first.is_name:
            return None
        start = self.sig[self.at]
        dot, second = self.peek(1), self.peek(2)
        if dot is not None and dot.text == "." and second is not None and second.is_name:
            self.at += 3
            return TableRef(start, self.sig[self.at - 1] + 1, first.name, second.name)
        self.at += 1
        return TableRef(start, start + 1, None, first.name)


def parse(statement: str) -> Statement:
    """Find the kind, table names and column names of a MySQL DDL statement."""
    tokens = tuple(tokenize(statement))
    r = Reader(tokens)
    tables: list[TableRef] = []

    def table() -> None:
        ref = r.table()
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
    if kind in SEQUENCE_KINDS:
        return Statement(kind, tokens, tuple(tables))
    columns = _scan_rest(r, tables, in_create=kind == "create_table")
    return Statement(kind, tokens, tuple(tables), tuple(columns))


def _scan_rest(r: Reader, tables: list[TableRef], in_create: bool) -> list[int]:
    """After the statement's table: more table names (LIKE, REFERENCES, RENAME TO) and columns."""
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
            ref = r.table()
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
                    ref = r.table()
                    if ref is not None:
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


TableMap = Callable[[str, str], "tuple[str, str] | None"]


def rewrite(
    statement: str,
    default_schema: str,
    map_table: TableMap,
    columns: Mapping[str, str] | None = None,
    keep_column: Callable[[str], bool] | None = None,
) -> str | None:
    """`statement` with every table name qualified and mapped, and column names renamed.

    `map_table(schema, table)` gives the target (schema, table), or None for a table setl does not
    replicate: a DROP TABLE (or SEQUENCE) leaves such tables out, any other statement keeps their source name.
    `columns` maps the statement's (first) table's column names, compared without case as MySQL
    does. A column `keep_column` refuses (one the table rule leaves out) is cut from the statement:
    its definition or ALTER clause, its place in a key's column list (the key goes when no column
    is left), its AFTER. Returns None when nothing is left to apply (a DROP of only unreplicated
    tables, an ALTER of only left-out columns).
    """
    parsed = parse(statement)
    tokens = list(parsed.tokens)
    if parsed.kind == "other":
        return statement
    schema = parsed.tables[0].schema or default_schema
    replaced: dict[int, tuple[int, str]] = {}  # start -> (end, text)
    kept_drops = []
    for ref in parsed.tables:
        source = (ref.schema or schema, ref.table)
        target = map_table(*source)
        if target is None and parsed.kind in ("drop_table", "drop_sequence"):
            continue
        kept_drops.append(ref)
        target_schema, target_table = target if target is not None else source
        replaced[ref.start] = (ref.end, f"{quote(target_schema)}.{quote(target_table)}")
    if parsed.kind in ("drop_table", "drop_sequence"):
        if not kept_drops:
            return None
        return _drop_statement(tokens, parsed.tables, kept_drops, replaced)
    renames = {k.lower(): v for k, v in (columns or {}).items()}
    for index in parsed.columns:
        new = renames.get(tokens[index].name.lower())
        if new is not None:
            replaced[index] = (index + 1, quote(new))
    cut: set[int] = set()
    if keep_column is not None:
        left_out = [i for i in parsed.columns if not keep_column(tokens[i].name)]
        if left_out:
            cut = _cut_columns(parsed, left_out)
            if parsed.kind == "alter_table" and not any(
                    t.kind != "ws" for i, t in enumerate(tokens) if i >= parsed.tables[0].end and i not in cut):
                return None
    out = []
    i = 0
    while i < len(tokens):
        if i in cut:
            i += 1
        elif i in replaced:
            end, text = replaced[i]
            out.append(text)
            i = end
        else:
            out.append(tokens[i].text)
            i += 1
    return "".join(out)


@attrs.define
class _List:
    """A comma-separated list: the statement's ALTER clauses, or the inside of parentheses."""

    parent: "_List | None"
    items: list[list[int]] = attrs.Factory(lambda: [[]])  # token indexes of each item
    commas: list[int] = attrs.Factory(list)


def _cut_columns(parsed: Statement, left_out: Sequence[int]) -> set[int]:
    """The token indexes to cut so the columns at `left_out` are gone (see `rewrite`)."""
    tokens = parsed.tokens
    start = parsed.tables[0].end
    top = current = _List(None)
    lists = [top]
    where: dict[int, _List] = {}  # token index -> the innermost list holding it
    for i in range(start, len(tokens)):
        text = tokens[i].text
        if text == ")" and current.parent is not None:
            current = current.parent
        if text == "," and (current is not top or parsed.kind == "alter_table"):
            current.commas.append(i)
            current.items.append([])
            continue
        for owner in _owners(current):
            owner.items[-1].append(i)
        where[i] = current
        if text == "(":
            current = _List(current)
            lists.append(current)
    cut: set[int] = set()
    removed: dict[int, set[int]] = {}  # id(list) -> removed item numbers

    def remove(lst: _List, item: int) -> None:
        removed.setdefault(id(lst), set()).add(item)
        if lst.parent is not None and len(removed[id(lst)]) == len(lst.items):
            opening = min(lst.items[0]) - 1 if lst.items[0] else None
            parent = lst.parent
            for number, members in enumerate(parent.items):
                if opening in members:
                    remove(parent, number)

    sig = [i for i in range(len(tokens)) if tokens[i].kind != "ws"]
    for index in left_out:
        before = max((k for k in sig if k < index), default=None)
        if before is not None and tokens[before].upper == "AFTER":
            cut.update(range(before, index + 1))
            continue
        lst = where[index]
        remove(lst, next(n for n, members in enumerate(lst.items) if index in members))
    for lst in lists:
        gone = removed.get(id(lst), set())
        for number in gone:
            cut.update(lst.items[number])
        for number, comma in enumerate(lst.commas):  # the comma between items number and number + 1
            if number + 1 in gone or all(k in gone for k in range(number + 1)):
                cut.add(comma)
    return cut


def _owners(lst: _List) -> list[_List]:
    """`lst` and every list around it: a token belongs to the current item of each."""
    owners = []
    node: _List | None = lst
    while node is not None:
        owners.append(node)
        node = node.parent
    return owners


def _drop_statement(tokens: list[Token], refs: Sequence[TableRef], kept: Sequence[TableRef],
                    replaced: Mapping[int, tuple[int, str]]) -> str:
    """DROP TABLE with only the `kept` tables, in their mapped names."""
    head = "".join(t.text for t in tokens[:refs[0].start])
    tail = "".join(t.text for t in tokens[refs[-1].end:])
    return head + ", ".join(replaced[ref.start][1] for ref in kept) + tail


_SEQUENCE_FUNCTIONS = frozenset({"NEXTVAL", "LASTVAL", "SETVAL"})


def without_sequence_defaults(statement: str) -> str:
    """`statement` without the DEFAULT clauses that draw on a sequence (``DEFAULT NEXTVAL(s)``,
    ``DEFAULT (NEXT VALUE FOR s)``, ``DEFAULT LASTVAL(s)``), each with the space before it; the
    statement itself when it has none. Sequences are not replicated, so a target holds no such
    sequence (the rows carry the values the source drew)."""
    tokens = tokenize(statement)
    sig = [i for i, t in enumerate(tokens) if t.kind != "ws"]
    cut: dict[int, tuple[int, str]] = {}  # first token index -> (index past the last, replacement)
    n = 0
    while n < len(sig):
        if tokens[sig[n]].upper != "DEFAULT":
            n += 1
            continue
        end = _default_end(tokens, sig, n + 1)
        words = {tokens[sig[k]].upper for k in range(n + 1, end)}
        if words & _SEQUENCE_FUNCTIONS or ({"VALUE", "FOR"} <= words and words & {"NEXT", "PREVIOUS"}):
            setting = n > 0 and tokens[sig[n - 1]].upper == "SET"  # ALTER COLUMN c SET DEFAULT ...
            start = sig[n - 1] if setting else sig[n]
            while start > 0 and tokens[start - 1].kind == "ws":
                start -= 1
            cut[start] = (sig[end - 1] + 1, " DROP DEFAULT" if setting else "")
        n = end
    if not cut:
        return statement
    out, i = [], 0
    while i < len(tokens):
        if i in cut:
            i, replacement = cut[i]
            out.append(replacement)
            continue
        out.append(tokens[i].text)
        i += 1
    return "".join(out)


def _default_end(tokens: list[Token], sig: list[int], n: int) -> int:
    """The index in `sig` just past the DEFAULT expression starting at sig[n]: a parenthesised group,
    a function call, NEXT/PREVIOUS VALUE FOR name, or one token."""
    if n >= len(sig):
        return n
    first = tokens[sig[n]]
    if first.upper in ("NEXT", "PREVIOUS"):  # NEXT VALUE FOR [schema.]name
        end = n + 4
        if end + 1 < len(sig) and tokens[sig[end]].text == ".":
            end += 2
        return min(end, len(sig))
    if first.text != "(" and not (n + 1 < len(sig) and tokens[sig[n + 1]].text == "("):
        return n + 1
    k = n if first.text == "(" else n + 1
    depth = 0
    while k < len(sig):
        depth += {"(": 1, ")": -1}.get(tokens[sig[k]].text, 0)
        k += 1
        if depth == 0:
            break
    return k


__all__ = ["SEQUENCE_KINDS", "Reader", "Statement", "TableRef", "Token", "parse", "quote", "rewrite", "tokenize",
           "without_sequence_defaults"]
