"""Rows events of tables no pipeline reads, passed over by length: counted, never decoded.

A split transaction's resume point (``LOG:OFFSET+ROW``) counts every row change the transaction
logged, those of unread tables included, so an unread table's rows event still needs its row count.
`skipped_rows` reads it from the row images' lengths alone (the column widths of the table map, the
null bitmaps, the length prefixes), compiled (`_rows.count_rows`, bounds-checked) or in Python,
and answers None for any event it cannot account for exactly (a column type it does not size, a
partial image, NDB or partition extra data, a size that does not add up): that event is then decoded
as before, so skipping never changes what a pipeline reads or where it resumes.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Sequence
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE

from setl.binlog_events import Header, SkippedRows

_compiled_count: Callable[[bytes, int, int, int, Any], int] | None
_full_bitmap: Callable[[bytes, int, int], bool] | None
try:
    from setl.sources.mysql_binlog._rows import count_rows as _compiled_count
    from setl.sources.mysql_binlog._rows import full_bitmap as _full_bitmap
except ImportError:  # not built (or SETL_PURE_PYTHON=1): the Python count below
    _compiled_count = _full_bitmap = None

#: rows event type -> (0 write / 1 update / 2 delete, post-header length)
ROWS_EVENTS: dict[int, tuple[int, int]] = {0x17: (0, 8), 0x18: (1, 8), 0x19: (2, 8),
                                          0x1E: (0, 10), 0x1F: (1, 10), 0x20: (2, 10)}
_FIXED = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3, FIELD_TYPE.LONG: 4, FIELD_TYPE.LONGLONG: 8,
          FIELD_TYPE.FLOAT: 4, FIELD_TYPE.DOUBLE: 8, FIELD_TYPE.YEAR: 1, FIELD_TYPE.DATE: 3}
_TEMPORAL2 = {FIELD_TYPE.TIMESTAMP2: 4, FIELD_TYPE.DATETIME2: 5, FIELD_TYPE.TIME2: 3}
_PREFIXED = {FIELD_TYPE.BLOB, FIELD_TYPE.JSON, FIELD_TYPE.GEOMETRY}
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def _width(column: Any) -> int | None:
    """Column's size in a row image (negative: the size of its length prefix); None: not sized here."""
    kind = column.type
    if kind in _FIXED:
        return _FIXED[kind]
    if kind in _TEMPORAL2:
        fsp = getattr(column, "fsp", None) or 0
        return _TEMPORAL2[kind] + (fsp + 1) // 2 if fsp in range(7) else None
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING):
        return -2 if column.max_length > 255 else -1
    if kind in _PREFIXED:
        size = getattr(column, "length_size", None)
        return -size if size in (1, 2, 3, 4) else None
    if kind == FIELD_TYPE.NEWDECIMAL:
        precision, decimals = column.precision, column.decimals
        if precision not in range(1, 66) or decimals not in range(min(precision, 30) + 1):
            return None
        integral = precision - decimals
        return (integral // 9) * 4 + _DIG2BYTES[integral % 9] + (decimals // 9) * 4 + _DIG2BYTES[decimals % 9]
    if kind in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
        size = getattr(column, "size", None)
        return size if size in range(1, 9) else None
    if kind == FIELD_TYPE.BIT:
        size = getattr(column, "bytes", None)
        return size if size in range(1, 9) else None
    return None


def unread(info: Any, reads: Callable[[str, str], bool] | None) -> bool:
    """Whether the rows events of table `info` (the assembler's `_TableInfo`) are passed over: a
    table `reads` refuses whose row count is that of its events (a system-versioned table's history
    rows are not counted, a sequence's not handed on: those are decoded as before)."""
    return reads is not None and info.period is None and not info.sequence and not info.sequence_shaped \
        and not reads(info.schema, info.table)


def widths(columns: Sequence[Any]) -> array.array[int] | None:
    """The row-image widths of a table map's columns (`count_rows`), or None when one is not sized here."""
    found = array.array("i")
    for column in columns:
        width = _width(column)
        if width is None:
            return None
        found.append(width)
    return found if found else None


class Truncated(ValueError):
    """A row image runs past its event (the pure count's `_rows.Truncated`)."""


def count_rows_py(data: bytes, pos: int, end: int, kind: int, sizes: Sequence[int]) -> int:
    """`_rows.count_rows` in Python: the row changes in the full images of `data[pos:end]`."""
    ncols = len(sizes)
    nbitmap = (ncols + 7) // 8
    if ncols < 1 or pos < 0 or end > len(data) or pos > end:
        raise Truncated(f"event: rows at {pos}-{end} of {len(data)} bytes")
    at, count = pos, 0
    images = 2 if kind == 1 else 1
    while at < end:
        for _ in range(images):
            bitmap = at
            if nbitmap > end - at:
                raise Truncated("null bitmap")
            at += nbitmap
            for i, width in enumerate(sizes):
                if data[bitmap + (i >> 3)] & (1 << (i & 7)):
                    continue
                if width > 0:
                    if width > end - at:
                        raise Truncated(f"column {i}")
                    at += width
                elif 0 < -width <= 4:
                    if -width > end - at:
                        raise Truncated(f"column {i}")
                    length = int.from_bytes(data[at:at - width], "little")
                    at -= width
                    if length > end - at:
                        raise Truncated(f"column {i}")
                    at += length
                else:
                    raise Truncated(f"column {i}: width {width}")
        count += 1
    return count


def full_bitmap_py(data: bytes, pos: int, ncols: int) -> bool:
    """`_rows.full_bitmap` in Python: whether the columns bitmap at `pos` names every column."""
    width = (ncols + 7) // 8
    if pos < 0 or pos + width > len(data):
        return False
    whole, rest = divmod(ncols, 8)
    return all(b == 0xFF for b in data[pos:pos + whole]) and (
        not rest or data[pos + whole] & ((1 << rest) - 1) == (1 << rest) - 1)


class RowCounter:
    """Counts the rows of an unread table's rows event (`skipped_rows`), compiled when built.

    `fast` False (or the compiled module not built) counts in Python. Widths are kept per table map
    object; `skipped` counts the events passed over, `decoded` those left to the decoders."""

    def __init__(self, fast: bool = True) -> None:
        self.count: Callable[[bytes, int, int, int, Any], int] = count_rows_py
        self.full: Callable[[bytes, int, int], bool] = full_bitmap_py
        if fast and _compiled_count is not None and _full_bitmap is not None:
            self.count, self.full = _compiled_count, _full_bitmap
        self._widths: dict[int, tuple[Any, array.array[int] | None]] = {}
        self.skipped = self.decoded = 0

    def widths_of(self, table: Any) -> array.array[int] | None:
        known = self._widths.get(id(table))
        if known is not None and known[0] is table:
            return known[1]
        found = widths(table.columns)
        if len(self._widths) > 4096:
            self._widths.clear()
        self._widths[id(table)] = (table, found)
        return found

    def skipped_rows(self, data: bytes, table_map: dict[int, Any], use_checksum: bool,
                     post_header_lengths: Any, header: Callable[[bytes], Any] | None = None) -> SkippedRows | None:
        """The skipped value of the rows event in packet `data` (the OK byte, the header, the body),
        or None when it must be decoded (see the module). The table map is the stream's."""
        found = self._count(data, table_map, use_checksum, post_header_lengths)
        if found is None:
            self.decoded += 1
            return None
        kind, table_id, table, count = found
        self.skipped += 1
        head = header(data) if header is not None else Header.of(data)
        return SkippedRows(head, kind, table_id, table.schema, table.table, count)

    def _count(self, data: bytes, table_map: dict[int, Any], use_checksum: bool, post_header_lengths: Any
               ) -> tuple[int, int, Any, int] | None:
        if len(data) < 30:
            return None
        event_type = data[5]
        kind, post_header = ROWS_EVENTS[event_type]
        if post_header_lengths and len(post_header_lengths) >= event_type and \
                post_header_lengths[event_type - 1] != post_header:
            return None
        event_size = int.from_bytes(data[10:14], "little")
        if event_size + 1 != len(data):
            return None
        table_id = int.from_bytes(data[20:26], "little")
        table = table_map.get(table_id)
        if table is None:
            return None
        pos = 28
        if post_header == 10:
            if int.from_bytes(data[28:30], "little") != 2:  # NDB or partition information
                return None
            pos = 30
        if pos >= len(data):
            return None
        ncols = data[pos]
        if ncols >= 251 or ncols != len(table.columns):
            return None
        pos += 1
        sizes = self.widths_of(table)
        if sizes is None:
            return None
        width = (ncols + 7) // 8
        for _ in range(2 if kind == 1 else 1):
            if not self.full(data, pos, ncols):
                return None  # a partial image: its null bitmaps count only the columns present
            pos += width
        end = len(data) - (4 if use_checksum else 0)
        try:
            count = self.count(data, pos, end, kind, sizes)
        except ValueError:  # it does not add up: the decoder reads it (and names what is wrong)
            return None
        return kind, table_id, table, count
