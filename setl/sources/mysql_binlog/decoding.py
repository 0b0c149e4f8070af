"""Row images as setl hands them on: a table map's names and key, value fixes, table kinds.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

import attrs
from pymysqlreplication.constants import FIELD_TYPE, NONE_SOURCE

from setl import values as canonical
from setl.binlog_events import DELETE, WRITE, Rows, TableLayout
from setl.model import InvalidDate, Op, PartialImage, partial_like

#: A prepared XA transaction's identity: (formatID, gtrid, bqual).
XaKey = tuple[int, bytes, bytes]
#: A row change (or a statement logged inside a transaction) as the assembler holds it.
_Item = tuple[Any, Any, Any, Any]


def _row_items(event: Rows, info: "_TableInfo") -> list[_Item]:
    """The row changes of one rows event, with setl's images (of a system-versioned table: its
    current rows only)."""
    items = _raw_row_items(event, info)
    if info.period is None:
        return items
    return [current for current in map(info.current, items) if current is not None]


def _raw_row_items(event: Rows, info: "_TableInfo") -> list[_Item]:
    kind = event.kind
    if not info.fixes:  # the decoded values are setl's: no image to fix
        if kind == WRITE:
            return [(Op.INSERT, info, None, _logged(row["values"], row["none_sources"])) for row in event.rows]
        if kind == DELETE:
            return [(Op.DELETE, info, _logged(row["values"], row["none_sources"]), None) for row in event.rows]
        return [(Op.UPDATE, info, _logged(row["before_values"], row["before_none_sources"]),
                 _logged(row["after_values"], row["after_none_sources"])) for row in event.rows]
    if kind == WRITE:
        return [(Op.INSERT, info, None, info.image(row["values"], row["none_sources"])) for row in event.rows]
    if kind == DELETE:
        return [(Op.DELETE, info, info.image(row["values"], row["none_sources"]), None) for row in event.rows]
    return [(Op.UPDATE, info, info.image(row["before_values"], row["before_none_sources"]),
             info.image(row["after_values"], row["after_none_sources"])) for row in event.rows]


def _logged(values: dict[str, Any], none_sources: Mapping[str, str]) -> dict[str, Any]:
    """`values` without the columns the event's column bitmap leaves out (a session with
    ``binlog_row_image`` NOBLOB or MINIMAL), as a `PartialImage`; `values` itself when it has all.
    The library puts None (NULL) for such a column: handing that on would overwrite the target's
    value with NULL."""
    if not none_sources or _ABSENT not in none_sources.values():
        return values
    for name, why in none_sources.items():
        if why == _ABSENT:
            del values[name]
    return PartialImage(values)


_ABSENT = NONE_SOURCE.COLS_BITMAP


#: The row end of a system-versioned table's current rows: TIMESTAMP's maximum, or the largest
#: transaction id (WITH SYSTEM VERSIONING over BIGINT UNSIGNED trx ids).
_TIMESTAMP_MAX = datetime.datetime(2038, 1, 19, 3, 14, 7)
_TRX_ID_MAX = (1 << 64) - 1


@attrs.frozen
class TableKind:
    """What information_schema says about a table the binlog's table map does not."""

    sequence: bool = False
    #: a sequence's ``SHOW CREATE SEQUENCE`` (None when not asked for or not shown)
    definition: str | None = None
    #: False when the source has no such table now (dropped later in the binlog): then a table
    #: map with exactly a sequence's columns is taken for a sequence (`SEQUENCE_COLUMNS`)
    found: bool = True
    period: tuple[str, str] | None = None
    #: columns whose binlog bytes are handed on as text (`setl.values.TEXT_TYPES`) -> DATA_TYPE;
    #: the table map shows them as BINARY(16) or BINARY(4)
    texts: Mapping[str, str] = attrs.field(factory=dict)


#: The columns of a MariaDB sequence's table, in order.
SEQUENCE_COLUMNS = ("next_not_cached_value", "minimum_value", "maximum_value", "start_value", "increment",
                    "cache_size", "cycle_option", "cycle_count")

_PERIOD = re.compile(r"PERIOD\s+FOR\s+SYSTEM_TIME\s*\(\s*(`(?:[^`]|``)+`|\w+)\s*,\s*(`(?:[^`]|``)+`|\w+)\s*\)", re.I)

#: A TIMESTAMP of 0 ('0000-00-00 00:00:00') decodes as the epoch, which a TIMESTAMP cannot hold.
_ZERO_TIMESTAMP = datetime.datetime(1970, 1, 1)


@attrs.frozen
class _TableInfo:
    """What a rows event needs from its table map: names, key, and per-column value fixes."""

    schema: str
    table: str
    primary_key: tuple[str, ...]
    sets: frozenset[str]
    bits: frozenset[str]
    years: frozenset[str]
    binaries: frozenset[str]
    binary_widths: Mapping[str, int]
    timestamps: Mapping[str, int] = attrs.field(factory=dict)  # TIMESTAMP columns and their fsp
    sequence: bool = False  # a SEQUENCE's state row: handed on only to a target that applies it
    definition: str | None = None  # a SEQUENCE's SHOW CREATE SEQUENCE, when known
    period: tuple[str, str] | None = None  # a system-versioned table's (row start, row end) columns
    #: column -> how its bytes become setl's value (UUID, INET6, INET4: `setl.values`)
    texts: Mapping[str, Any] = attrs.field(factory=dict)
    #: spatial columns: their bytes are handed on as `setl.values.Geometry`
    geometries: frozenset[str] = frozenset()
    #: whether the table map shows exactly a sequence's columns and no key
    sequence_shaped: bool = False
    #: whether `image` changes anything (a column of one of the kinds above)
    fixes: bool = attrs.field(init=False)

    @fixes.default
    def _has_fixes(self) -> bool:
        return bool(self.sets or self.bits or self.years or self.binaries or self.binary_widths or self.timestamps
                    or self.texts or self.geometries)

    def with_kind(self, kind: "TableKind") -> "_TableInfo":
        texts = {name: canonical.FROM_BINLOG[of] for name, of in kind.texts.items() if of in canonical.FROM_BINLOG}
        if kind.period is None:
            sequence = kind.sequence or (not kind.found and self.sequence_shaped)
            return attrs.evolve(self, sequence=sequence, definition=kind.definition, texts=texts)
        key = tuple(c for c in self.primary_key if c not in kind.period)  # the server adds row end to it
        return attrs.evolve(self, sequence=kind.sequence, period=kind.period, primary_key=key, texts=texts)

    def current(self, item: _Item) -> _Item | None:
        """A system-versioned table's row change as a change of its current rows, without the
        period columns; None for a change to history rows only."""
        assert self.period is not None
        op, _, before, after = item
        start, end = self.period

        def live(image: Mapping[str, Any] | None) -> bool:
            value = image.get(end) if image is not None else None
            return (isinstance(value, datetime.datetime) and value >= _TIMESTAMP_MAX) or value == _TRX_ID_MAX

        def strip(image: Mapping[str, Any] | None) -> dict[str, Any] | None:
            return None if image is None else partial_like(
                image, {k: v for k, v in image.items() if k not in (start, end)})

        was, now = live(before), live(after)
        if was and now:
            return (op, self, strip(before), strip(after))
        if was:
            return (Op.DELETE, self, strip(before), None)
        if now:
            return (Op.INSERT, self, None, strip(after))
        return None

    @classmethod
    def from_table_map(cls, layout: TableLayout) -> "_TableInfo":
        columns = layout.columns
        key = layout.primary_key
        return cls(
            layout.schema, layout.table, key,
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.SET),
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.BIT),
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.YEAR),
            frozenset(c.name for c in columns if c.character_set_name == "binary"),
            # BINARY(n) arrives with its trailing zero bytes stripped
            {c.name: c.max_length for c in columns
             if c.type == FIELD_TYPE.STRING and c.character_set_name == "binary"},
            {c.name: getattr(c, "fsp", 0) or 0 for c in columns
             if c.type in (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2)},
            geometries=frozenset(c.name for c in columns if c.type == FIELD_TYPE.GEOMETRY),
            sequence_shaped=not key and tuple(c.name for c in columns) == SEQUENCE_COLUMNS,
        )

    def image(self, values: dict[str, Any], none_sources: Mapping[str, str]) -> dict[str, Any]:
        """The row as setl hands it on: the library's values, with its lossy spots undone (and
        without the columns the event left out: `_logged`)."""
        values = _logged(values, none_sources)
        for name in self.sets:  # frozensets: a SET may be (part of) a key, and keys are hashed
            value = values.get(name)
            if value is None:
                if none_sources.get(name) == NONE_SOURCE.EMPTY_SET:
                    values[name] = frozenset()
            else:
                values[name] = frozenset(value)
        for name in self.bits:
            if values.get(name) is not None:
                values[name] = int(values[name], 2)
        for name in self.years:
            if values.get(name) == 1900:  # YEAR 0000 decodes as 1900, which YEAR cannot hold
                values[name] = 0
        for name in self.binaries:
            if values.get(name) == "":  # an empty value skips the (failing) decode and stays str
                values[name] = b""
        for name, fsp in self.timestamps.items():
            if values.get(name) == _ZERO_TIMESTAMP:
                values[name] = InvalidDate("0000-00-00 00:00:00" + ("." + "0" * fsp if fsp else ""))
        for name, width in self.binary_widths.items():
            value = values.get(name)
            if isinstance(value, bytes) and len(value) < width:
                values[name] = value.ljust(width, b"\0")
        for name, to_text in self.texts.items():  # after the padding: the bytes are whole
            value = values.get(name)
            if value is not None:
                values[name] = to_text(value)
        for name in self.geometries:
            value = values.get(name)
            if value is not None:
                values[name] = canonical.geometry(value)
        return values
