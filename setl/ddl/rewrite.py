"""The routing's edit of a DDL model: table names mapped and qualified, columns renamed or cut
(`rewrite`), and the DEFAULTs that draw on a sequence left out (`without_sequence_defaults`). Each
returns a new model whose text is the edited tokens, read by the same parser as the source's."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from setl.ddl.model import Statement, TableRef
from setl.ddl.parser import expression, parse_tokens
from setl.ddl.tokens import Reader, Token, quote, tokenize

TableMap = Callable[[str, str], "tuple[str, str] | None"]


def rewrite(
    parsed: Statement,
    default_schema: str,
    map_table: TableMap,
    columns: Mapping[str, str] | None = None,
    keep_column: Callable[[str], bool] | None = None,
) -> Statement | None:
    """The model of `parsed` with every table name qualified and mapped, and column names renamed.

    `map_table(schema, table)` gives the target (schema, table), or None for a table setl does not
    replicate: a DROP TABLE (or SEQUENCE) leaves such tables out, any other statement keeps their source name.
    `columns` maps the statement's (first) table's column names, compared without case as MySQL
    does. A column `keep_column` refuses (one the table rule leaves out) is cut from the statement:
    its definition or ALTER clause, its place in a key's column list (the key goes when no column
    is left), its AFTER. Returns None when nothing is left to apply (a DROP of only unreplicated
    tables, an ALTER of only left-out columns).
    """
    tokens = list(parsed.tokens)
    if parsed.kind == "other":
        return parsed
    schema = parsed.tables[0].schema or default_schema
    replaced: dict[int, tuple[int, list[Token]]] = {}  # start -> (end, tokens)
    kept_drops = []
    for ref in parsed.tables:
        source = (ref.schema or schema, ref.table)
        target = map_table(*source)
        if target is None and parsed.kind in ("drop_table", "drop_sequence"):
            continue
        kept_drops.append(ref)
        target_schema, target_table = target if target is not None else source
        replaced[ref.start] = (ref.end, _qualified(target_schema, target_table))
    if parsed.kind in ("drop_table", "drop_sequence"):
        if not kept_drops:
            return None
        return _drop_statement(tokens, parsed.tables, kept_drops, replaced)
    renames = {k.lower(): v for k, v in (columns or {}).items()}
    for index in parsed.columns:
        new = renames.get(tokens[index].name.lower())
        if new is not None:
            replaced[index] = (index + 1, [Token("ident", quote(new))])
    cut: set[int] = set()
    if keep_column is not None:
        left_out = [i for i in parsed.columns if not keep_column(tokens[i].name)]
        if left_out:
            cut = _cut_columns(parsed, left_out)
            if parsed.kind == "alter_table" and not any(
                    t.kind != "ws" for i, t in enumerate(tokens) if i >= parsed.tables[0].end and i not in cut):
                return None
    out: list[Token] = []
    i = 0
    while i < len(tokens):
        if i in cut:
            i += 1
        elif i in replaced:
            end, new_tokens = replaced[i]
            out.extend(new_tokens)
            i = end
        else:
            out.append(tokens[i])
            i += 1
    return parse_tokens(tuple(out))


def _qualified(schema: str, table: str) -> list[Token]:
    return [Token("ident", quote(schema)), Token("punct", "."), Token("ident", quote(table))]


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
                    replaced: Mapping[int, tuple[int, list[Token]]]) -> Statement:
    """DROP TABLE with only the `kept` tables, in their mapped names."""
    out = list(tokens[:refs[0].start])
    for n, ref in enumerate(kept):
        if n:
            out += [Token("punct", ","), Token("ws", " ")]
        out += replaced[ref.start][1]
    return parse_tokens(tuple(out + tokens[refs[-1].end:]))


def with_table(statement: Statement, schema: str, table: str) -> Statement:
    """`statement` with its (first) table named `schema`.`table` instead (a scratch copy's name)."""
    ref = statement.tables[0]
    tokens = statement.tokens
    return parse_tokens(tuple(tokens[:ref.start]) + tuple(_qualified(schema, table)) + tuple(tokens[ref.end:]))



_SEQUENCE_FUNCTIONS = frozenset({"NEXTVAL", "LASTVAL", "SETVAL"})


def without_sequence_defaults(statement: Statement) -> Statement:
    """The model of `statement` without the DEFAULT clauses that draw on a sequence (``DEFAULT NEXTVAL(s)``,
    ``DEFAULT (NEXT VALUE FOR s)``, ``DEFAULT LASTVAL(s)``), each with the space before it; the
    statement itself when it has none. Sequences are not replicated, so a target holds no such
    sequence (the rows carry the values the source drew)."""
    tokens = statement.tokens
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
    out: list[Token] = []
    i = 0
    while i < len(tokens):
        if i in cut:
            i, replacement = cut[i]
            out.extend(tokenize(replacement))
            continue
        out.append(tokens[i])
        i += 1
    return parse_tokens(tuple(out))


def _default_end(tokens: Sequence[Token], sig: list[int], n: int) -> int:
    """The index in `sig` just past the DEFAULT expression starting at sig[n], as the parser reads
    one (`setl.ddl.parser.expression`): the whole rest for an expression cut short."""
    reader = Reader(tokens)
    reader.at = n
    if reader.done():
        return n
    try:
        expression(reader)
    except ValueError:
        return len(sig)
    return reader.at


__all__ = ["TableMap", "rewrite", "with_table", "without_sequence_defaults"]
