"""MySQL table DDL translated for PostgreSQL, for `PostgresqlLoad` under ``pipeline.ddl: apply``: the
PostgreSQL rendering of setl's one DDL model (`setl.ddl.Statement`, parsed once at the source; its
column definitions are `setl.ddl.ColumnDef`), never a parse of the statement's text.

Translated: CREATE TABLE (columns with the type mapping below, NULL/NOT NULL, simple DEFAULTs,
PRIMARY KEY and UNIQUE), CREATE TABLE ... LIKE, ALTER TABLE ADD/DROP/MODIFY/CHANGE/ALTER/RENAME
COLUMN, ADD/DROP PRIMARY KEY, RENAME TO, RENAME TABLE (across schemas too), TRUNCATE and DROP TABLE.
Left out on purpose, since rows carry full images and do not need them: secondary (non-unique)
indexes, FOREIGN KEY and CHECK constraints, column COMMENTs, charsets and case-insensitive collations
(PostgreSQL compares text case-sensitively: a UNIQUE key MySQL would refuse for 'a' and 'A' holds
both), AUTO_INCREMENT,
ON UPDATE CURRENT_TIMESTAMP, FIRST/AFTER, table options, and defaults other than a number, a
plain string (also with a charset introducer), NULL, CURRENT_TIMESTAMP, b'..' (on integer and BIT
columns) and x'..'/0x.. (on integer and binary columns): expression defaults ``DEFAULT (1+1)``
(or, as MariaDB takes them, ``DEFAULT concat('a','b')``) are left out where rows carry full
images (CREATE TABLE, MODIFY), but an ADD COLUMN with one, or
with CURRENT_TIMESTAMP (existing rows get the time of the DDL on the source), is exact only on an
empty table: `Translator.needs_empty` names it and `PostgresqlLoad` refuses it if the table has rows.
CREATE/DROP INDEX statements are not applied.
Generated columns (``AS (expr) VIRTUAL|STORED|PERSISTENT``, ``GENERATED ALWAYS AS``) become plain
columns holding the values the source's row events carry (the expression is not translated; an ADD
of one is exact only on an empty table, see below). Partitioning becomes a plain table holding the
same rows (the target's ``partitions: plain``, the default; ``refuse`` raises `UnsupportedDdl` for
``CREATE TABLE ... PARTITION BY`` and ``ALTER TABLE ... PARTITION BY`` instead):
``CREATE TABLE ... PARTITION BY`` loses the clause, and ALTERs that only reshape
partitions (PARTITION BY, ADD, REORGANIZE, COALESCE PARTITION, REMOVE PARTITIONING, ...) translate
to nothing; DROP, TRUNCATE, EXCHANGE, IMPORT and DISCARD PARTITION and CONVERT PARTITION/TABLE,
which change rows without row events, raise
`UnsupportedDdl` (the pipeline stops rather than keep rows the source removed). Anything else
raises `UnsupportedDdl`.
ADD COLUMN ... NOT NULL without a DEFAULT fills existing rows with MySQL's implicit default (0,
'', the first ENUM member, zero bytes); for dates MySQL's zero date has no PostgreSQL value, so
such an ADD fails on a non-empty table.

System versioning (MariaDB) is left out: ``WITH SYSTEM VERSIONING``, ``PERIOD FOR SYSTEM_TIME``,
the ``AS ROW START``/``AS ROW END`` columns, ``ADD/DROP SYSTEM VERSIONING`` and ``ADD/DROP PERIOD``
translate to nothing, so PostgreSQL holds the current rows only (the source drops history rows and
period columns from row changes). Sequences (CREATE/ALTER/DROP SEQUENCE, CREATE TABLE ...
SEQUENCE=1) are not replicated to PostgreSQL: `is_sequence_ddl` tells them, and this target skips
them (a MySQL target applies them).

Names (schemas, tables, columns, constraints) go through `ident`, which maps a name over 63 bytes
by `pg_name` (cut plus a short hash; docs/sql-targets.md), as table creation and the loads do.

Type mapping (MySQL -> PostgreSQL): TINYINT, SMALLINT -> smallint (SMALLINT UNSIGNED -> integer);
MEDIUMINT, INT -> integer (INT UNSIGNED -> bigint); BIGINT -> bigint (UNSIGNED -> numeric(20,0));
BOOL -> smallint; DECIMAL(p,s) -> numeric(p,s); FLOAT -> real; DOUBLE -> double precision;
DATE -> date; TIME -> interval (MySQL TIME spans -838..838 hours); DATETIME(n) -> timestamp(n);
TIMESTAMP(n) -> timestamptz(n); YEAR -> smallint; CHAR(n), VARCHAR(n) -> varchar(n) (no padding);
TEXT types -> text; a binary collation (``CHAR(n) BINARY``, ``VARCHAR(n) BINARY``,
``COLLATE utf8mb4_bin``, ``COLLATE binary``) adds ``COLLATE "C"``; ``CHARACTER SET binary`` on a
character type makes it bytea (MySQL makes it BINARY/VARBINARY/BLOB); BINARY, VARBINARY, BLOB
types -> bytea; ENUM, SET -> text (a SET as its members sorted and comma-joined); BIT(n) -> bigint
(numeric(20,0) for BIT(64)); JSON -> jsonb; MariaDB's UUID -> uuid, INET4 and INET6 -> inet (both
readers hand them on as text: `setl.values`); the spatial types (GEOMETRY, POINT, LINESTRING,
POLYGON, MULTIPOINT, MULTILINESTRING, MULTIPOLYGON, GEOMETRYCOLLECTION) by the target's ``spatial``
form (`setl.sinks.postgresql_spatial`): ``postgis`` -> geometry, typed for all but GEOMETRY
(``geometry(Point)``, ...; the SRID is carried by each value, as a MariaDB column without
``REF_SYSTEM_ID`` holds any), ``wkb`` -> bytea, ``wkt`` -> text.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

import attrs

from setl.ddl import (
    ELEMENT_KEYWORDS,
    ColumnDef,
    Reader,
    Statement,
    TableRef,
    Token,
    column_definition,
    expression,
    split,
    without_sequence_defaults,
)
from setl.model import Batch, Change, DdlChange

log = logging.getLogger(__name__)


class UnsupportedDdl(ValueError):
    """The statement has a part this translation does not handle."""


#: PostgreSQL keeps the first 63 bytes of a longer identifier (NAMEDATALEN - 1).
MAX_IDENTIFIER_BYTES = 63
_HASH_HEX = 8


def clip(name: str, size: int) -> str:
    """`name` cut to at most `size` bytes of UTF-8, on a character boundary."""
    return name.encode()[:size].decode(errors="ignore")


def pg_name(name: str) -> str:
    """The PostgreSQL name of a MySQL table, column, index or constraint name: the name itself when
    it fits in 63 bytes of UTF-8; a longer one (which PostgreSQL would silently cut, so that two
    names sharing their first 63 bytes collide) is cut on a character boundary and suffixed with
    ``_`` and the first 8 hex digits of the SHA-1 of the whole name, 63 bytes at most. Stable
    across runs and nodes, and its own image (``pg_name(pg_name(n)) == pg_name(n)``)."""
    raw = name.encode()
    if len(raw) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:_HASH_HEX]
    return clip(name, MAX_IDENTIFIER_BYTES - _HASH_HEX - 1) + "_" + digest


def pkey_name(table: str) -> str:
    """The name PostgreSQL gives the primary key of a table created under name `table` (already
    a PostgreSQL name): ``<table>_pkey``, the table's part cut to fit 63 bytes."""
    return clip(table, MAX_IDENTIFIER_BYTES - len("_pkey")) + "_pkey"


def ident(name: str) -> str:
    """`name` as a quoted PostgreSQL identifier, mapped by `pg_name`."""
    return '"' + pg_name(name).replace('"', '""') + '"'


_INTS = {  # signed, unsigned
    "TINYINT": ("smallint", "smallint"),
    "SMALLINT": ("smallint", "integer"),
    "MEDIUMINT": ("integer", "integer"),
    "INT": ("integer", "bigint"),
    "INTEGER": ("integer", "bigint"),
    "BIGINT": ("bigint", "numeric(20,0)"),
}
_SIMPLE = {
    "BOOL": "smallint", "BOOLEAN": "smallint", "REAL": "double precision", "DOUBLE": "double precision",
    "DATE": "date", "TIME": "interval", "YEAR": "smallint", "TINYTEXT": "text", "TEXT": "text",
    "MEDIUMTEXT": "text", "LONGTEXT": "text", "BINARY": "bytea", "VARBINARY": "bytea",
    "TINYBLOB": "bytea", "BLOB": "bytea", "MEDIUMBLOB": "bytea", "LONGBLOB": "bytea", "ENUM": "text",
    "SET": "text", "JSON": "jsonb", "UUID": "uuid", "INET4": "inet", "INET6": "inet",
}


#: ALTER TABLE verbs that, before PARTITION, change rows without row events (DROP, TRUNCATE,
#: EXCHANGE PARTITION), and those that only reshape partitions (their rows stay as they are).
_ROWS_WITHOUT_EVENTS = frozenset({"DROP", "TRUNCATE", "EXCHANGE", "IMPORT", "DISCARD"})
_PARTITION_UPKEEP = frozenset({"ADD", "REORGANIZE", "COALESCE", "ANALYZE", "CHECK", "OPTIMIZE", "REBUILD",
                               "REPAIR"})


#: why a partitioned table is refused under the target's ``partitions: refuse``
PARTITIONS_REFUSED = ("a partitioned table, and the target's partitions option is refuse (set it to plain for a "
                      "plain table holding the same rows)")


#: MySQL spatial type -> the PostGIS geometry subtype of its column (None: any geometry).
SPATIAL = {
    "GEOMETRY": None, "POINT": "Point", "LINESTRING": "LineString", "POLYGON": "Polygon",
    "MULTIPOINT": "MultiPoint", "MULTILINESTRING": "MultiLineString", "MULTIPOLYGON": "MultiPolygon",
    "GEOMETRYCOLLECTION": "GeometryCollection", "GEOMCOLLECTION": "GeometryCollection",
}


def pg_type(base: str, args: Sequence[str], unsigned: bool, spatial: str = "wkb") -> str:
    """The PostgreSQL type for a MySQL type name, its numeric arguments and UNSIGNED; a spatial
    type's by the `spatial` form (postgis, wkb or wkt: `setl.sinks.postgresql_spatial`)."""
    if base in SPATIAL:
        if spatial == "postgis":
            subtype = SPATIAL[base]
            return f"geometry({subtype})" if subtype else "geometry"
        return "text" if spatial == "wkt" else "bytea"
    if base in _INTS:
        return _INTS[base][unsigned]
    if base in ("DECIMAL", "NUMERIC", "DEC", "FIXED"):
        precision, scale = (list(args) + ["10", "0"][len(args):])[:2]
        return f"numeric({int(precision)},{int(scale)})"
    if base == "FLOAT":
        return "double precision" if args and int(args[0]) > 24 else "real"
    if base in ("DATETIME", "TIMESTAMP"):
        kind = "timestamp" if base == "DATETIME" else "timestamptz"
        return f"{kind}({int(args[0])})" if args else kind
    if base in ("CHAR", "VARCHAR", "NCHAR", "NVARCHAR"):
        return f"varchar({int(args[0]) if args else 1})"
    if base == "BIT":
        return "numeric(20,0)" if args and int(args[0]) == 64 else "bigint"
    if base in _SIMPLE:
        return _SIMPLE[base]
    raise UnsupportedDdl(f"MySQL type {base} has no PostgreSQL mapping")


def _names(tokens: Sequence[Token]) -> str:
    """A key's column list (prefix lengths and ASC/DESC dropped)."""
    return ", ".join(ident(part[0].name) for part in split(tokens))


_INTEGER_KINDS = ("smallint", "integer", "bigint", "numeric(20,0)")


def _default(tokens: Sequence[Token], kind: str = "") -> tuple[str | None, str | None]:
    """A DEFAULT's value (its tokens: `setl.ddl.expression`) in PostgreSQL for a column of
    PostgreSQL type `kind`, or None to leave the default out; and the MySQL text of a default that
    is left out (None when nothing is lost)."""
    t = Reader(tokens)
    value = _default_value(t, kind) if tokens else None
    if value is not None and t.done():
        return value, None
    return None, "".join(token.text for token in tokens)


def _default_value(t: Reader, kind: str) -> str | None:
    token = t.next()
    if token.upper == "NULL":
        return "NULL"
    if token.upper in ("CURRENT_TIMESTAMP", "NOW", "LOCALTIMESTAMP"):
        if t.sees("("):
            t.group()
        return "CURRENT_TIMESTAMP"
    sign = ""
    if token.text in ("-", "+"):
        sign, token = token.text, t.next()
    if token.kind == "word" and token.text[0].isdigit():
        if t.sees("."):
            t.next()
            return f"{sign}{token.text}.{t.next().text}"
        if token.text.lower().startswith("0x"):
            return _hex_default(token.text[2:], kind)
        return sign + token.text
    if token.kind == "string" and token.text[0] == "'" and "\\" not in token.text:
        return None if token.text.startswith("'0000-00-00") else token.text
    if token.text == "(":
        t.at -= 1
        t.group()
    elif token.kind == "word" and (value := t.peek()) is not None and value.kind == "string":
        t.next()  # b'0101', x'ff', _utf8mb4'...'
        text = value.text[1:-1]
        if token.upper == "B" and kind in _INTEGER_KINDS and set(text) <= {"0", "1"}:
            return str(int(text or "0", 2))
        if token.upper == "X":
            return _hex_default(text, kind)
        if token.text.startswith("_") and value.text[0] == "'" and "\\" not in value.text:
            return value.text  # a string with a charset introducer
    elif token.kind == "word" and t.sees("("):
        t.group()  # MariaDB's unparenthesized expression default: concat('a','b'), uuid(), ...
    return None


def _hex_default(digits: str, kind: str) -> str | None:
    """A hexadecimal literal as the default of a bytea or integer column (None for other kinds)."""
    if not digits or any(c not in "0123456789abcdefABCDEF" for c in digits):
        return None
    if kind == "bytea":
        return f"'\\x{digits.lower()}'::bytea"
    if kind in _INTEGER_KINDS:
        return str(int(digits, 16))
    return None


@attrs.frozen
class Column:
    """A MySQL column definition in PostgreSQL terms. `default` is the translated DEFAULT, or
    None (`lost_default` is then the MySQL text of a DEFAULT left out, if there was one);
        `implicit` is what MySQL fills existing rows with when the column is added NOT NULL without a DEFAULT
    (None where PostgreSQL has no such value, as for zero dates); `key` is an
    inline `` PRIMARY KEY`` or `` UNIQUE``; `generated` is set for a generated column (translated as
    a plain column: the rows carry its values); `period` for the ROW START/ROW END column of a
    system-versioned table (left out)."""

    name: str
    kind: str
    not_null: bool
    default: str | None
    implicit: str | None
    key: str
    lost_default: str | None = None
    generated: bool = False
    period: bool = False

    def text(self, default: str | None = None) -> str:
        text = f"{ident(self.name)} {self.kind}{self.key}"
        if self.not_null:
            text += " NOT NULL"
        default = default if default is not None else self.default
        return text + (f" DEFAULT {default}" if default is not None else "")


def _implicit(base: str, args: Sequence[Token]) -> str | None:
    """MySQL's implicit default of a NOT NULL column of type `base`(`args`), in PostgreSQL."""
    if base in _INTS or base in ("DECIMAL", "NUMERIC", "DEC", "FIXED", "FLOAT", "DOUBLE", "REAL", "BIT",
                                 "YEAR", "BOOL", "BOOLEAN"):
        return "0"
    if base == "ENUM":
        return args[0].text if args and args[0].kind == "string" else None
    if base == "BINARY":
        width = int(args[0].text) if args else 1
        return f"'\\x{'00' * width}'::bytea"
    if base in ("CHAR", "VARCHAR", "NCHAR", "NVARCHAR", "TINYTEXT", "TEXT", "MEDIUMTEXT", "LONGTEXT",
                "VARBINARY", "TINYBLOB", "BLOB", "MEDIUMBLOB", "LONGBLOB", "SET"):
        return "''"
    if base == "TIME":
        return "'0'"
    return None


def column(tokens: Sequence[Token], spatial: str = "wkb") -> Column:
    """A MySQL column definition (its significant tokens), translated (`render_column`)."""
    return render_column(column_definition(tokens), spatial)


def render_column(definition: ColumnDef, spatial: str = "wkb") -> Column:
    """A column definition of the model, translated (spatial types by the `spatial` form: `pg_type`)."""
    name, base = definition.name, definition.base
    if definition.unknown is not None:
        raise UnsupportedDdl(f"column {name}: {definition.unknown} is not translated")
    implicit = _implicit(base, definition.args)
    args = [] if base in ("ENUM", "SET") else [token.text for token in definition.args]
    kind = pg_type(base, args, definition.unsigned, spatial)
    default, lost = _default(definition.default, kind) if definition.default is not None else (None, None)
    if kind in ("text",) or kind.startswith("varchar"):
        if definition.charset == "binary":  # CHAR(n) CHARACTER SET binary is BINARY(n): bytes, as the binlog has them
            kind = "bytea"
            implicit = "''::bytea" if implicit == "''" else implicit
            if base in ("CHAR", "NCHAR") and implicit is not None:
                implicit = f"'\\x{'00' * (int(args[0]) if args else 1)}'::bytea"
        elif definition.binary:
            kind += ' COLLATE "C"'  # a binary collation: byte order, case and accents distinct
    return Column(name, kind, definition.not_null, default, implicit, definition.key, lost, definition.generated,
                  definition.period)


def _constraint(tokens: Sequence[Token]) -> str | None:
    """A table element that is not a column: PRIMARY KEY or UNIQUE translated, others None."""
    t = Reader(tokens)
    if t.word("CONSTRAINT"):
        if not any(t.sees(word) for word in ("PRIMARY", "UNIQUE", "FOREIGN", "CHECK")):
            t.next()
    if t.word("PRIMARY"):
        t.word("KEY")
        kind = "PRIMARY KEY"
    elif t.word("UNIQUE"):
        t.word("KEY", "INDEX")
        kind = "UNIQUE"
    else:
        return None
    while not t.done() and not t.sees("("):
        t.next()  # index name, USING BTREE
    return f"{kind} ({_names(t.group())})"


_ELEMENT_KEYWORDS = ELEMENT_KEYWORDS


class Translator:
    """Translates parsed MySQL DDL; unqualified names are taken to be in `default_schema`, spatial
    columns get the `spatial` form's type (`pg_type`)."""

    def __init__(self, default_schema: str, spatial: str = "wkb", partitions: str = "plain") -> None:
        self.default_schema = default_schema
        #: the target's form of spatial columns (`pg_type`)
        self.spatial = spatial
        #: the target's ``partitions`` option: ``plain`` (a partitioned table becomes a plain one)
        #: or ``refuse`` (``PARTITION BY`` stops the pipeline)
        self.partitions = partitions
        #: (table, why) of the last `translate`: statements exact only while the table has no rows
        #: (an ADD COLUMN whose DEFAULT fills existing rows with a value PostgreSQL would not give)
        self.needs_empty: list[tuple[str, str]] = []

    def table(self, ref: TableRef) -> str:
        return f"{ident(ref.schema or self.default_schema)}.{ident(ref.table)}"

    def translate(self, statement: Statement) -> list[str]:
        """The PostgreSQL statements that do what `statement` does (empty: nothing to do); see
        `needs_empty` for what holds only on an empty table. Raises `UnsupportedDdl` for what it
        cannot render, a statement cut short included."""
        self.needs_empty = []
        try:
            return self._translate(statement)
        except UnsupportedDdl:
            raise
        except ValueError as exc:  # a clause cut short (Reader: the statement ends too early)
            raise UnsupportedDdl(str(exc)) from exc

    def _translate(self, statement: Statement) -> list[str]:
        refs = statement.tables
        kind = statement.kind
        if statement.unparsed is not None:
            raise UnsupportedDdl(f"the statement cannot be read ({statement.unparsed})")
        if kind == "create_table":
            return self._create(statement)
        if kind == "alter_table":
            return self._alter(statement)
        if kind == "rename_table":
            return [s for old, new in zip(refs[::2], refs[1::2]) for s in self._rename(old, new)]
        if kind == "truncate_table":
            return [f"TRUNCATE TABLE {self.table(refs[0])}"]
        if kind == "drop_table":
            exists = " IF EXISTS" if list(statement.head[2:4]) == ["IF", "EXISTS"] else ""
            return [f"DROP TABLE{exists} {', '.join(self.table(r) for r in refs)}"]
        if kind in ("create_index", "drop_index"):
            return []
        raise UnsupportedDdl(f"{kind} statements are not translated")

    def _create(self, statement: Statement) -> list[str]:
        refs, words = statement.tables, statement.head
        name = self.table(refs[0])
        head = ["CREATE TABLE"]
        out = []
        if "REPLACE" in words:
            out.append(f"DROP TABLE IF EXISTS {name}")
        elif "EXISTS" in words:
            head.append("IF NOT EXISTS")
        if statement.like:
            if len(refs) < 2:
                raise UnsupportedDdl("CREATE TABLE ... LIKE names no table")
            return out + [f"{' '.join(head)} {name} (LIKE {self.table(refs[1])} INCLUDING ALL)"]
        elements = []
        for element in statement.elements:
            if element.word:
                constraint = _constraint(element.tokens)
                if constraint is not None:
                    elements.append(constraint)
            else:
                definition = render_column(element.columns[0], self.spatial)
                if not definition.period:
                    elements.append(definition.text())
        rest = Reader(statement.options)
        while not rest.done():  # table options: ENGINE=..., DEFAULT CHARSET=..., COMMENT='...'
            token = rest.next()
            if token.upper == "PARTITION":
                self._partitioned()
                break  # PARTITION BY ... (the last clause): a plain table holds the same rows
            if token.upper in ("AS", "SELECT", "IGNORE", "REPLACE"):
                raise UnsupportedDdl(f"CREATE TABLE ... {token.text} is not translated")
        if not statement.elements:
            raise UnsupportedDdl("CREATE TABLE without a column list is not translated")
        return out + [f"{' '.join(head)} {name} ({', '.join(elements)})"]

    def _partitioned(self) -> None:
        if self.partitions == "refuse":
            raise UnsupportedDdl(PARTITIONS_REFUSED)

    def _rename(self, old: TableRef, new: TableRef) -> list[str]:
        out = []
        old_schema, new_schema = old.schema or self.default_schema, new.schema or self.default_schema
        if old_schema != new_schema:
            out.append(f"ALTER TABLE {self.table(old)} SET SCHEMA {ident(new_schema)}")
        if old.table != new.table:
            out.append(f"ALTER TABLE {ident(new_schema)}.{ident(old.table)} RENAME TO {ident(new.table)}")
        return out

    def _alter(self, statement: Statement) -> list[str]:
        ref = statement.tables[0]
        name = self.table(ref)
        actions: list[str] = []
        later: list[str] = []  # renames, in order: PostgreSQL runs them as statements of their own
        current = ref
        new_names = iter([statement.tables[place] for place in statement.renames])  # RENAME [TO|AS] name
        for element in statement.elements:
            t = Reader(element.tokens)
            verb = t.next().upper
            if verb in ("ADD", "DROP") and (t.sees("SYSTEM") and t.sees("VERSIONING", 1) or t.sees("PERIOD")):
                continue  # system versioning is not replicated: PostgreSQL gets the current rows only
            if (verb in _ROWS_WITHOUT_EVENTS and t.sees("PARTITION")) or (
                    verb == "CONVERT" and (t.sees("PARTITION") or t.sees("TABLE"))):  # MariaDB 10.7+
                # The server removes or moves the rows of a partition without a row event: a plain
                # PostgreSQL table would keep them.
                raise UnsupportedDdl(f"ALTER TABLE ... {verb} PARTITION changes rows the binlog holds no row "
                                     "events for; apply it to the PostgreSQL table by hand, then resume")
            if verb == "PARTITION":
                self._partitioned()
            if verb == "PARTITION" or (verb == "REMOVE" and t.sees("PARTITIONING")) or (
                    verb in _PARTITION_UPKEEP and t.sees("PARTITION")):
                # partitioning is not replicated (a plain table); a partition clause ends the
                # statement, and its own commas (p1, p2) are no further clauses
                break
            if verb == "ADD":
                self._add(t, element.columns, actions, later, name)
            elif verb == "DROP":
                t.word("COLUMN")
                if t.word("PRIMARY"):
                    actions.append(f"DROP CONSTRAINT IF EXISTS {ident(pkey_name(pg_name(ref.table)))}")
                elif (token := t.peek()) is not None and token.kind != "ident" and token.upper in (
                        "INDEX", "KEY", "FOREIGN", "CHECK", "CONSTRAINT"):
                    continue
                else:
                    exists = " IF EXISTS" if t.word("IF") and t.word("EXISTS") else ""
                    actions.append(f"DROP COLUMN{exists} {ident(t.next().name)}")
            elif verb in ("MODIFY", "CHANGE"):
                t.word("COLUMN")
                if t.word("IF"):
                    t.word("EXISTS")
                old = t.next().name if verb == "CHANGE" else None
                definition = render_column(element.columns[0], self.spatial)
                target = ident(old or definition.name)
                if definition.period:
                    continue
                if definition.generated:
                    self.needs_empty.append((name, f"column {definition.name} becomes a generated column, "
                                                   "whose values the source computes without row events"))
                kind = definition.kind
                actions.append(f"ALTER COLUMN {target} TYPE {kind} USING {target}::{kind}")
                actions.append(f"ALTER COLUMN {target} {'SET' if definition.not_null else 'DROP'} NOT NULL")
                actions.append(f"ALTER COLUMN {target} " + (f"SET DEFAULT {definition.default}"
                                                             if definition.default is not None else "DROP DEFAULT"))
                if old is not None and old != definition.name:
                    later.append(f"ALTER TABLE {self.table(current)} RENAME COLUMN {target} "
                                 f"TO {ident(definition.name)}")
            elif verb == "ALTER":
                t.word("COLUMN")
                target = ident(t.next().name)
                if t.word("SET"):
                    t.word("DEFAULT")
                    default, _ = _default(expression(t))
                    if default is not None:
                        actions.append(f"ALTER COLUMN {target} SET DEFAULT {default}")
                elif t.word("DROP"):
                    t.word("DEFAULT")
                    actions.append(f"ALTER COLUMN {target} DROP DEFAULT")
                else:
                    raise UnsupportedDdl(f"ALTER COLUMN {target} {t.next().text} is not translated")
            elif verb == "RENAME":
                if t.word("COLUMN"):
                    old = t.next().name
                    t.word("TO")
                    later.append(f"ALTER TABLE {self.table(current)} RENAME COLUMN {ident(old)} "
                                 f"TO {ident(t.next().name)}")
                elif t.word("INDEX", "KEY"):
                    continue
                else:
                    target_ref = next(new_names, None)
                    if target_ref is None:
                        raise UnsupportedDdl("ALTER TABLE ... RENAME without a new table name")
                    later.extend(self._rename(current, target_ref))
                    current = target_ref
            elif verb in ("ENGINE", "ROW_FORMAT", "CHARSET", "CHARACTER", "COLLATE", "COMMENT",
                          "AUTO_INCREMENT", "ALGORITHM", "LOCK", "FORCE", "CONVERT", "DEFAULT",
                          "KEY_BLOCK_SIZE", "STATS_PERSISTENT", "PACK_KEYS", "CHECKSUM"):
                continue
            else:
                raise UnsupportedDdl(f"ALTER TABLE ... {verb} is not translated")
        out = [f"ALTER TABLE {name} {', '.join(actions)}"] if actions else []
        return out + later

    def _add(self, t: Reader, columns: Sequence[ColumnDef], actions: list[str], later: list[str],
             table: str) -> None:
        """ADD COLUMN (MySQL fills existing rows of a NOT NULL column without DEFAULT with its
        implicit default: so does the translation, dropping that default afterwards), or ADD
        PRIMARY KEY / UNIQUE; other ADDs (indexes, foreign keys) are left out."""
        t.word("COLUMN")
        exists = " IF NOT EXISTS" if t.word("IF") and t.word("NOT") and t.word("EXISTS") else ""
        token = t.peek()
        if token is None:
            raise UnsupportedDdl("ADD without a column")
        if token.kind != "ident" and token.upper in _ELEMENT_KEYWORDS | {"PARTITION"}:
            constraint = _constraint(t.rest())
            if constraint is not None:
                actions.append(f"ADD {constraint}")
            return
        for parsed in columns:
            definition = render_column(parsed, self.spatial)
            if definition.period:
                continue
            fill = None
            if definition.not_null and definition.default is None and not definition.key:
                fill = definition.implicit
            if definition.generated:
                self.needs_empty.append((table, f"generated column {definition.name} is a plain column on "
                                                "PostgreSQL, and existing rows would get no values"))
            elif definition.lost_default is not None:
                self.needs_empty.append((table, f"column {definition.name} DEFAULT "
                                                f"{definition.lost_default} has no PostgreSQL translation"))
            elif definition.default == "CURRENT_TIMESTAMP":
                self.needs_empty.append((table, f"column {definition.name} DEFAULT CURRENT_TIMESTAMP gives "
                                                "existing rows the time of the DDL on the source"))
            actions.append(f"ADD COLUMN{exists} {definition.text(default=fill)}")
            if fill is not None:
                later.insert(0, f"ALTER TABLE {table} ALTER COLUMN {ident(definition.name)} DROP DEFAULT")


def is_sequence_ddl(statement: Statement) -> bool:
    """Whether `statement` creates, alters or drops a sequence (CREATE [OR REPLACE] SEQUENCE, ALTER
    SEQUENCE, DROP SEQUENCE, or a CREATE TABLE with the table option SEQUENCE=1)."""
    words = [t.upper for t in statement.tokens if t.kind not in ("ws", "xcomment")]
    head = [w for w in words[:6] if w not in ("OR", "REPLACE", "TEMPORARY")]
    if len(head) >= 2 and head[0] in ("CREATE", "ALTER", "DROP") and head[1] == "SEQUENCE":
        return True
    return statement.is_sequence


def without_sequence_ddl(batch: Batch, pipeline: str, *, keep_sequences: bool = False) -> Batch:
    """`batch` without its sequence DDL (see `is_sequence_ddl`), each logged at INFO, and without
    the DEFAULTs of its other DDL that draw on a sequence (`setl.ddl.without_sequence_defaults`):
    sequences are not replicated, so the target has none to draw on. With `keep_sequences` (a
    MySQL target, which replicates sequences) the sequence DDL stays; the DEFAULTs still go: the
    rows carry the values the source drew, and a table never depends on a sequence being there."""
    kept: list[Change] = []
    changed = False
    for change in batch.changes:
        if isinstance(change, DdlChange):
            if is_sequence_ddl(change.ddl):
                if keep_sequences:
                    kept.append(change)
                    continue
                log.info("pipeline=%s stage=load table=%s position=%s: sequence DDL is not replicated: %s",
                         pipeline, change.qualified_table, change.position or batch.end, change.statement)
                changed = True
                continue
            model = without_sequence_defaults(change.ddl)
            if model is not change.ddl:
                log.info("pipeline=%s stage=load table=%s position=%s: a DEFAULT drawing on a sequence is left "
                         "out (the rows carry the values drawn): %s", pipeline, change.qualified_table,
                         change.position or batch.end, change.statement)
                change, changed = change.with_ddl(model), True
        kept.append(change)
    return batch.replace(tuple(kept)) if changed else batch


__all__ = ["Translator", "UnsupportedDdl", "is_sequence_ddl", "pg_type", "without_sequence_ddl"]
