"""The one model of a MySQL/MariaDB DDL statement (`Statement`): what the source parses once and
every later stage reads, the routing rewrites and each target renders in its own dialect."""

from __future__ import annotations

import attrs

from setl.ddl.tokens import Token

#: The statement kinds of sequences (`Statement.kind`).
SEQUENCE_KINDS = frozenset({"create_sequence", "alter_sequence", "drop_sequence"})


@attrs.frozen
class TableRef:
    """A (possibly qualified) table name at tokens[start:end]."""

    start: int
    end: int
    schema: str | None
    table: str


@attrs.frozen
class ColumnDef:
    """One column definition (of a CREATE TABLE, or an ALTER TABLE's ADD, MODIFY or CHANGE), in
    MySQL terms; a target renders it in its dialect.

    `base` is the type name upper-cased and normalised (``NATIONAL VARCHAR`` -> NVARCHAR, ``DOUBLE
    PRECISION`` -> DOUBLE, ``CHARACTER VARYING`` -> VARCHAR); `args` its parenthesised arguments
    (the first token of each: ENUM and SET members as quoted strings). `not_null` is True for NOT
    NULL; `default` and `on_update` hold the tokens of the expression (None: no such clause);
    `key` is ``PRIMARY KEY``, ``UNIQUE`` or "" for an inline key. `generated` marks a generated
    column (``AS (expr)``, ``GENERATED ALWAYS AS``), `period` a system-versioning ``AS ROW
    START|END`` column. `unknown` is the first attribute the parser did not understand (the
    definition's tokens from there on are not read): a target that must understand every
    attribute refuses it, one that runs the text as it is (MariaDB) does not care.
    """

    name: str
    base: str
    args: tuple[Token, ...] = ()
    unsigned: bool = False
    zerofill: bool = False
    not_null: bool = False
    default: tuple[Token, ...] | None = None
    on_update: tuple[Token, ...] | None = None
    auto_increment: bool = False
    invisible: bool = False
    key: str = ""
    binary: bool = False
    charset: str = ""
    collation: str = ""
    comment: str | None = None
    generated: bool = False
    period: bool = False
    unknown: str | None = None


@attrs.frozen
class Element:
    """One item of a CREATE TABLE's parenthesised list, or one clause of an ALTER TABLE: its
    significant tokens (`tokens`) and the column definitions it holds (one for a column element, an
    ADD [COLUMN], MODIFY or CHANGE; several for ``ADD (a ..., b ...)``; none for a key, a constraint
    or another clause). `word` is its first word upper-cased ("" for a column element)."""

    tokens: tuple[Token, ...]
    columns: tuple[ColumnDef, ...] = ()
    word: str = ""


@attrs.frozen
class Statement:
    """A parsed DDL statement: its tokens, kind, table names, column names and definitions.

    `kind` is one of create_table, alter_table, rename_table, truncate_table, drop_table,
    create_index, drop_index, create_sequence, alter_sequence, drop_sequence, or other (anything
    else: not a table DDL setl applies). A sequence is a table to MariaDB (and to the table rules):
    its statements list its name(s) as table names; they name no columns.
    `tables` lists every table name in order of appearance; the first is the statement's table
    (a RENAME TABLE lists old and new names in pairs).
    `columns` holds the token indexes of column names (the ones a rename or a cut edits).
    `elements` holds the items of a CREATE TABLE's list or the clauses of an ALTER TABLE, with
    their column definitions (`Element`); `options` the significant tokens after a CREATE TABLE's
    list (table options, PARTITION BY, AS SELECT); `like` is set for ``CREATE TABLE ... LIKE``.
    `head` holds the upper-cased words before the statement's table (CREATE, OR, REPLACE, TABLE,
    IF, NOT, EXISTS, ...). `unparsed` says why the elements could not be read (unbalanced
    parentheses, a statement cut short): a target that renders the model refuses it. `renames`
    holds the places in `tables` of the new names an ALTER TABLE ... RENAME [TO|AS] gives.
    """

    kind: str
    tokens: tuple[Token, ...]
    tables: tuple[TableRef, ...] = ()
    columns: tuple[int, ...] = ()
    elements: tuple[Element, ...] = ()
    options: tuple[Token, ...] = ()
    like: bool = False
    head: tuple[str, ...] = ()
    unparsed: str | None = None
    renames: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        """The statement as MySQL/MariaDB runs it (the MySQL dialect's rendering of the model)."""
        return "".join(t.text for t in self.tokens)

    @property
    def definitions(self) -> tuple[ColumnDef, ...]:
        """Every column definition of the statement, in order."""
        return tuple(c for e in self.elements for c in e.columns)

    @property
    def is_sequence(self) -> bool:
        """Whether it creates, alters or drops a sequence (CREATE/ALTER/DROP SEQUENCE, or a CREATE
        TABLE with the table option SEQUENCE=1)."""
        if self.kind in SEQUENCE_KINDS:
            return True
        if self.kind != "create_table":
            return False
        texts = [t.text for t in self.options if t.kind != "xcomment"]
        return any(text.upper() == "SEQUENCE" and texts[k + 1:k + 3] in (["=", "1"], ["1"])
                   for k, text in enumerate(texts))


__all__ = ["SEQUENCE_KINDS", "ColumnDef", "Element", "Statement", "TableRef"]
