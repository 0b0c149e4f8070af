"""setl's row-image decoder in Python: the same rows as the compiled `_rows.RowDecoder`, from the same
table map and bytes, for a tree that was not built (or ``SETL_PURE_PYTHON=1``) and as the reference the
compiled decoder is tested against (tests/sources/test_fast_decoder.py).

Every column type MariaDB 10.11 and MySQL 8 write into a rows event is read here, and partial images
(``binlog_row_image`` NOBLOB or MINIMAL: a column the event leaves out is None with the none source
``cols_bitmap``). MySQL's binary JSON is the one value read through the library
(`setl.adapters.replication.json_value`). Every length and index is checked against the event's bytes
and the table map: an image they cannot account for raises `Corrupt` naming the column.
"""

from __future__ import annotations

import codecs
import datetime
import decimal
import struct
from collections.abc import Callable, Sequence
from typing import Any

from pymysqlreplication.constants import NONE_SOURCE

from setl.model import InvalidDate

# field types (pymysqlreplication.constants.FIELD_TYPE)
T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP = 0, 1, 2, 3, 4, 5, 6, 7
T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR, T_VARCHAR, T_BIT = 8, 9, 10, 11, 12, 13, 15, 16
T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 17, 18, 19
T_JSON, T_NEWDECIMAL, T_ENUM, T_SET, T_BLOB, T_STRING, T_GEOMETRY = 245, 246, 247, 248, 252, 254, 255

#: the column types a rows event of MariaDB 10.11 or MySQL 8 holds (the JSON one needs `json_value`)
SUPPORTED = frozenset({T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_TIMESTAMP, T_LONGLONG, T_INT24, T_DATE,
                       T_TIME, T_DATETIME, T_YEAR, T_VARCHAR, T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2, T_JSON,
                       T_NEWDECIMAL, T_ENUM, T_SET, T_BLOB, T_STRING, T_GEOMETRY})
#: the pre-5.6 TIME, DATETIME and TIMESTAMP (MySQL 5.5's, without fractions; MariaDB logs its own
#: fractional formats under the same types: `fast.RowDecoders` gives their precision, `hires_fsp`)
OLD_TEMPORALS = frozenset({T_TIME, T_DATETIME, T_TIMESTAMP})
#: MariaDB's pre-10.1 fractional TIME, DATETIME and TIMESTAMP (``Field_*_hires``): bytes by precision 1-6
TIME_HIRES_BYTES = (3, 4, 4, 5, 5, 5, 6)
DATETIME_HIRES_BYTES = (5, 6, 6, 7, 7, 7, 8)
TIMESTAMP_HIRES_BYTES = (4, 5, 5, 6, 6, 7, 7)
#: a fractional TIME's bias (``zero_point``): TIME's largest value, 838:59:59, plus one second, in micros
_TIME_ZERO = 3_020_400 * 1_000_000
_INTS = {T_TINY: 1, T_SHORT: 2, T_INT24: 3, T_LONG: 4, T_LONGLONG: 8}
_COMPRESSED_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_NULL = NONE_SOURCE.NULL
_ABSENT = NONE_SOURCE.COLS_BITMAP
_EMPTY_SET = NONE_SOURCE.EMPTY_SET
_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")
_HEADER = struct.Struct("<IBIIIH")


class Corrupt(ValueError):
    """A row image its table map cannot account for (a corrupt event): an ENUM index or SET member out
    of range, a value that runs past the event, a value no column of its type holds."""


class Truncated(Corrupt):
    """A row image ends before its columns do (a corrupt or cut event)."""


class Unreadable(LookupError):
    """A table map with a column setl cannot decode (its type or metadata); names the column."""


def time2_value(data: bytes, fsp: int) -> datetime.timedelta:
    """The TIME(fsp) packed in `data` (3 bytes and the fraction's (fsp + 1) // 2), as MySQL packs it
    (``my_time_packed_from_binary``): a negative TIME's fraction borrows from its whole part."""
    nfrac = (fsp + 1) // 2
    if nfrac == 3:
        packed = int.from_bytes(data, "big") - (0x800000 << 24)
    else:
        intpart = int.from_bytes(data[:3], "big") - 0x800000
        frac = int.from_bytes(data[3:], "big")
        if intpart < 0 and frac:
            intpart, frac = intpart + 1, frac - (1 << (8 * nfrac))
        packed = (intpart << 24) + frac * (10_000 if nfrac == 1 else 100)
    sign, packed = (-1 if packed < 0 else 1), abs(packed)
    hms, micros = packed >> 24, packed % (1 << 24)
    return sign * datetime.timedelta(hours=(hms >> 12) % 1024, minutes=(hms >> 6) % 64, seconds=hms % 64,
                                     microseconds=micros)


def hires_time_value(packed: int, fsp: int) -> datetime.timedelta:
    """A TIME(fsp) of MariaDB's pre-10.1 format (``Field_time_hires``): its big-endian bytes hold the
    microseconds (negative below zero) divided by 10^(6-fsp), plus the bias `_TIME_ZERO` so divided."""
    scale = 10 ** (6 - fsp)
    return datetime.timedelta(microseconds=(packed - _TIME_ZERO // scale) * scale)


def hires_timestamp_value(seconds: int, micros: int, fsp: int) -> datetime.datetime | InvalidDate:
    """A TIMESTAMP(fsp) of MariaDB's pre-10.1 format (``Field_timestamp_hires``) from its seconds since
    the epoch and its microseconds: a zero TIMESTAMP as `InvalidDate` with the server's text."""
    if not seconds and not micros:
        return InvalidDate("0000-00-00 00:00:00." + "0" * fsp)
    moment = datetime.datetime.utcfromtimestamp(seconds)
    return moment.replace(microsecond=micros) if micros > 0 else moment


def hires_datetime_parts(packed: int, fsp: int) -> tuple[int, int, int, int, int, int, int]:
    """A DATETIME(fsp) of MariaDB's pre-10.1 format (``Field_datetime_hires``, ``pack_time``): year,
    month, day, hour, minute, second, microseconds."""
    rest, micros = divmod(packed * 10 ** (6 - fsp), 1_000_000)
    rest, second = divmod(rest, 60)
    rest, minute = divmod(rest, 60)
    rest, hour = divmod(rest, 24)
    rest, day = divmod(rest, 32)
    year, month = divmod(rest, 13)
    return year, month, day, hour, minute, second, micros


def bit_value(data: bytes, bits: int) -> str:
    """BIT(bits) as the string of its bits, most significant first (what setl's images turn into an int)."""
    return format(int.from_bytes(data, "big") & ((1 << bits) - 1), f"0{bits}b")


def old_time_value(raw: int) -> datetime.timedelta:
    """TIME of the old format (a signed 3-byte hhmmss)."""
    if raw >= 1 << 23:
        raw -= 1 << 24
    sign, raw = (-1 if raw < 0 else 1), abs(raw)
    return sign * datetime.timedelta(hours=raw // 10000, minutes=raw // 100 % 100, seconds=raw % 100)


class _Column:
    """One column's reader settings, checked once per table map."""

    __slots__ = ("name", "kind", "unsigned", "size", "fsp", "precision", "decimals", "encoding", "raw",
                 "values", "bits")

    def __init__(self, column: Any, charset_to_encoding: Callable[[str], str], json: bool) -> None:
        kind = column.type
        name = column.name
        if not name:
            raise Unreadable(f"column of type {kind} has no name in the table map (binlog_row_metadata=FULL "
                             "names every column)")
        if kind not in SUPPORTED or (kind == T_JSON and not json):
            raise Unreadable(f"{name}: column type {kind} is not one setl decodes")
        self.name, self.kind = name, kind
        self.unsigned = bool(getattr(column, "unsigned", False))
        self.size = self.fsp = self.precision = self.decimals = self.bits = 0
        self.encoding: str | None = None
        self.raw = False
        self.values: Sequence[str] = ()
        if kind in (T_VARCHAR, T_STRING):
            self.size = 2 if column.max_length > 255 else 1
        elif kind in (T_BLOB, T_GEOMETRY, T_JSON):
            if column.length_size not in (1, 2, 3, 4):
                raise Unreadable(f"{name}: length size {column.length_size}")
            self.size = column.length_size
        elif kind in OLD_TEMPORALS:  # MariaDB's fractional formats carry it beside the table map
            if (getattr(column, "hires_fsp", 0) or 0) not in range(7):
                raise Unreadable(f"{name}: fractional seconds {column.hires_fsp}")
            self.fsp = getattr(column, "hires_fsp", 0) or 0
        elif kind in (T_DATETIME2, T_TIMESTAMP2, T_TIME2):
            if (column.fsp or 0) not in range(7):
                raise Unreadable(f"{name}: fractional seconds {column.fsp}")
            self.fsp = column.fsp or 0
        elif kind == T_NEWDECIMAL:
            if column.precision not in range(1, 66) or column.decimals not in range(min(column.precision, 30) + 1):
                raise Unreadable(f"{name}: DECIMAL({column.precision},{column.decimals})")
            self.precision, self.decimals = column.precision, column.decimals
        elif kind == T_ENUM:
            if column.size not in (1, 2) or not column.enum_values:
                raise Unreadable(f"{name}: ENUM of {column.size} bytes, values {column.enum_values!r}")
            self.size, self.values = column.size, tuple(column.enum_values)
        elif kind == T_SET:
            if column.size not in range(1, 9) or not column.set_values or len(column.set_values) > 8 * column.size:
                raise Unreadable(f"{name}: SET of {column.size} bytes, values {column.set_values!r}")
            self.size, self.values = column.size, tuple(column.set_values)
        elif kind == T_BIT:
            if column.bits not in range(1, 65) or column.bytes != (column.bits + 7) // 8:
                raise Unreadable(f"{name}: BIT({column.bits}) of {column.bytes} bytes")
            self.bits, self.size = column.bits, column.bytes
        if kind in (T_VARCHAR, T_STRING, T_BLOB):
            charset = column.character_set_name
            self.encoding = charset_to_encoding(charset) if charset is not None else "utf-8"
            try:
                codecs.lookup(self.encoding)
            except LookupError:  # no such codec (MySQL's swe7, binary): the bytes as they are
                self.raw = True


def _be_signed(data: bytes | bytearray) -> int:
    return int.from_bytes(data, "big", signed=True)


class RowDecoder:
    """The column readers of one table map (the library's `Table.columns`): `decode` turns the row
    images of a WRITE/UPDATE/DELETE_ROWS body into setl's rows."""

    def __init__(self, columns: Sequence[Any], charset_to_encoding: Callable[[str], str],
                 time2: Callable[[bytes, int], Any], make_date: Callable[[int, int, int], Any],
                 make_datetime: Callable[..., Any], json_value: Callable[[bytes], Any] | None = None) -> None:
        if not columns:
            raise Unreadable("a table map without columns")
        self.columns = [_Column(c, charset_to_encoding, json_value is not None) for c in columns]
        self.ncols = len(self.columns)
        self.time2, self.make_date, self.make_datetime, self.json_value = time2, make_date, make_datetime, json_value

    def decode(self, data: bytes, pos: int, end: int, kind: int, present: tuple[bytes, bytes] | None = None
               ) -> list[dict[str, Any]]:
        """The rows of one event body: `data[pos:end]` holds the row images (after the bitmaps).

        kind: 0 WRITE, 1 UPDATE, 2 DELETE; `present`: the columns-present bitmaps (before, after) of a
        partial image, None for full images. Returns a list of row dicts (``values``/``none_sources``;
        an update's ``before_*``/``after_*``)."""
        if pos < 0 or end > len(data) or pos > end:
            raise Truncated(f"event: rows at {pos}-{end} of {len(data)} bytes")
        before, after = present if present is not None else (None, None)
        rows: list[dict[str, Any]] = []
        at = [pos]
        try:
            while at[0] < end:
                nones: dict[str, str] = {}
                if kind == 1:
                    after_nones: dict[str, str] = {}
                    old = self._image(data, at, end, nones, before)
                    new = self._image(data, at, end, after_nones, after)
                    rows.append({"before_values": old, "before_none_sources": nones,
                                 "after_values": new, "after_none_sources": after_nones})
                else:
                    rows.append({"values": self._image(data, at, end, nones, before), "none_sources": nones})
        except Corrupt:
            raise
        except (ValueError, ArithmeticError, LookupError, TypeError, IndexError) as exc:  # no column holds it
            raise Corrupt(f"{type(exc).__name__}: {exc}") from exc
        return rows

    def _image(self, data: bytes, at: list[int], end: int, nones: dict[str, str], present: bytes | None
               ) -> dict[str, Any]:
        columns = self.columns
        if present is None:
            logged = self.ncols
        else:
            logged = sum(1 for i in range(self.ncols) if present[i >> 3] & (1 << (i & 7)))
        bitmap = at[0]
        at[0] = bitmap + (logged + 7) // 8
        if at[0] > end:
            raise Truncated("null bitmap")
        values: dict[str, Any] = {}
        index = 0
        for i, column in enumerate(columns):
            name = column.name
            if present is not None and not present[i >> 3] & (1 << (i & 7)):
                values[name] = None
                nones[name] = _ABSENT
                continue
            if data[bitmap + (index >> 3)] & (1 << (index & 7)):
                values[name] = None
                nones[name] = _NULL
            else:
                value = values[name] = self._value(column, data, at, end)
                if value is None:  # an empty SET, a JSON of no bytes
                    nones[name] = _EMPTY_SET if column.kind == T_SET else _NULL
            index += 1
        return values

    def _take(self, column: _Column, at: list[int], n: int, end: int) -> int:
        pos = at[0]
        if pos + n > end:
            raise Truncated(column.name)
        at[0] = pos + n
        return pos

    def _value(self, column: _Column, data: bytes, at: list[int], end: int) -> Any:
        kind = column.kind
        n = _INTS.get(kind)
        if n is not None:
            pos = self._take(column, at, n, end)
            return int.from_bytes(data[pos:pos + n], "little", signed=not column.unsigned)
        if kind in (T_VARCHAR, T_STRING, T_BLOB, T_GEOMETRY, T_JSON):
            pos = self._take(column, at, column.size, end)
            length = int.from_bytes(data[pos:pos + column.size], "little")
            pos = self._take(column, at, length, end)
            value = data[pos:pos + length]
            if kind == T_GEOMETRY:
                return value
            if kind == T_JSON:
                assert self.json_value is not None
                return self.json_value(value) if length else None
            if column.raw:
                return value if length else ""
            assert column.encoding is not None
            return value.decode(column.encoding, "strict")
        if kind == T_FLOAT:
            pos = self._take(column, at, 4, end)
            return _FLOAT.unpack_from(data, pos)[0]
        if kind == T_DOUBLE:
            pos = self._take(column, at, 8, end)
            return _DOUBLE.unpack_from(data, pos)[0]
        if kind == T_YEAR:
            pos = self._take(column, at, 1, end)
            return data[pos] + 1900
        if kind == T_DATE:
            pos = self._take(column, at, 3, end)
            raw = int.from_bytes(data[pos:pos + 3], "little")
            return self.make_date(raw >> 9, (raw >> 5) & 15, raw & 31)
        if kind == T_DATETIME2:
            pos = self._take(column, at, 5, end)
            raw = int.from_bytes(data[pos:pos + 5], "big")
            year_month = (raw >> 22) & ((1 << 17) - 1)
            micros = self._fsp(column, data, at, end)
            return self.make_datetime(year_month // 13, year_month % 13, (raw >> 17) & 31, (raw >> 12) & 31,
                                      (raw >> 6) & 63, raw & 63, micros, column.fsp)
        if kind == T_TIMESTAMP2:
            pos = self._take(column, at, 4, end)
            moment = datetime.datetime.utcfromtimestamp(_be_signed(data[pos:pos + 4]))
            micros = self._fsp(column, data, at, end)
            return moment.replace(microsecond=micros) if micros > 0 else moment
        if kind == T_TIME2:
            n = 3 + (column.fsp + 1) // 2
            pos = self._take(column, at, n, end)
            return self.time2(data[pos:pos + n], column.fsp)
        if kind == T_NEWDECIMAL:
            return self._decimal(column, data, at, end)
        if kind == T_ENUM:
            pos = self._take(column, at, column.size, end)
            index = int.from_bytes(data[pos:pos + column.size], "little")
            if index >= len(column.values):
                raise Corrupt(f"{column.name}: ENUM index {index} out of range (the table map lists "
                              f"{len(column.values) - 1} values)")
            return column.values[index]
        if kind == T_SET:
            pos = self._take(column, at, column.size, end)
            mask = int.from_bytes(data[pos:pos + column.size], "little")
            if mask >> len(column.values):
                raise Corrupt(f"{column.name}: SET bits {mask:#x} name members beyond the table map's "
                              f"{len(column.values)}")
            members = {value for i, value in enumerate(column.values) if mask & (1 << i)}
            return members or None
        if kind == T_BIT:
            pos = self._take(column, at, column.size, end)
            return bit_value(data[pos:pos + column.size], column.bits)
        if column.fsp and kind in OLD_TEMPORALS:
            return self._hires(column, data, at, end)
        if kind == T_TIMESTAMP:
            pos = self._take(column, at, 4, end)
            return datetime.datetime.utcfromtimestamp(int.from_bytes(data[pos:pos + 4], "little"))
        if kind == T_DATETIME:
            pos = self._take(column, at, 8, end)
            date, time_ = divmod(int.from_bytes(data[pos:pos + 8], "little"), 1_000_000)
            return self.make_datetime(date // 10000, date // 100 % 100, date % 100, time_ // 10000,
                                      time_ // 100 % 100, time_ % 100, 0, 0)
        if kind == T_TIME:
            pos = self._take(column, at, 3, end)
            return old_time_value(int.from_bytes(data[pos:pos + 3], "little"))
        raise Corrupt(f"{column.name}: column type {kind}")

    def _hires(self, column: _Column, data: bytes, at: list[int], end: int) -> Any:
        """A TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 fractional formats (sql/field.cc)."""
        fsp, kind = column.fsp, column.kind
        if kind == T_TIMESTAMP:  # seconds, then the fraction divided by 10^(6-fsp), both big-endian
            n = TIMESTAMP_HIRES_BYTES[fsp]
            pos = self._take(column, at, n, end)
            micros = int.from_bytes(data[pos + 4:pos + n], "big") * 10 ** (6 - fsp)
            if micros >= 1_000_000:
                raise Corrupt(f"{column.name}: a fraction of {micros} microseconds")
            return hires_timestamp_value(int.from_bytes(data[pos:pos + 4], "big"), micros, fsp)
        n = (TIME_HIRES_BYTES if kind == T_TIME else DATETIME_HIRES_BYTES)[fsp]
        pos = self._take(column, at, n, end)
        packed = int.from_bytes(data[pos:pos + n], "big")
        if kind == T_TIME:
            return hires_time_value(packed, fsp)
        return self.make_datetime(*hires_datetime_parts(packed, fsp), fsp)

    def _fsp(self, column: _Column, data: bytes, at: list[int], end: int) -> int:
        """The fraction of a temporal value in microseconds."""
        n = (column.fsp + 1) // 2
        if not n:
            return 0
        pos = self._take(column, at, n, end)
        value = _be_signed(data[pos:pos + n])
        if column.fsp % 2:
            value = int(value / 10)
        micros = value * 10 ** (6 - column.fsp)
        if not 0 <= micros < 1_000_000:
            raise Corrupt(f"{column.name}: a fraction of {micros} microseconds")
        return micros

    def _decimal(self, column: _Column, data: bytes, at: list[int], end: int) -> decimal.Decimal:
        """DECIMAL(precision, decimals) as MySQL packs it (``decimal2bin``), digit for digit."""
        integral = column.precision - column.decimals
        uncomp_integral, comp_integral = divmod(integral, 9)
        uncomp_fractional, comp_fractional = divmod(column.decimals, 9)
        size_i, size_f = _COMPRESSED_BYTES[comp_integral], _COMPRESSED_BYTES[comp_fractional]
        total = size_i + 4 * (uncomp_integral + uncomp_fractional) + size_f
        pos = self._take(column, at, total, end)
        buf = bytearray(data[pos:pos + total])
        mask, parts = (0, []) if buf[0] & 0x80 else (-1, ["-"])
        buf[0] ^= 0x80
        pos = 0
        if size_i:
            parts.append(str(_be_signed(buf[:size_i]) ^ mask))
            pos = size_i
        for _ in range(uncomp_integral):
            parts.append(f"{_be_signed(buf[pos:pos + 4]) ^ mask:09d}")
            pos += 4
        parts.append(".")
        for _ in range(uncomp_fractional):
            parts.append(f"{_be_signed(buf[pos:pos + 4]) ^ mask:09d}")
            pos += 4
        if size_f:
            parts.append(f"{_be_signed(buf[pos:pos + size_f]) ^ mask:0{comp_fractional}d}")
        return decimal.Decimal("".join(parts))


def full_bitmap(data: bytes, pos: int, ncols: int) -> bool:
    """Whether the columns-present bitmap at `pos` names every one of `ncols` columns."""
    width = (ncols + 7) // 8
    if pos < 0 or ncols < 0 or pos + width > len(data):
        return False
    return all(data[pos + (i >> 3)] & (1 << (i & 7)) for i in range(ncols))


class EventHeader:
    """An event's header, read from an OK packet's payload (the OK byte, then the 19-byte header)."""

    __slots__ = ("timestamp", "event_type", "server_id", "event_size", "log_pos", "flags", "event")

    def __init__(self, data: bytes) -> None:
        if len(data) < 20:
            raise Truncated("event header")
        self.timestamp, self.event_type, self.server_id, self.event_size, self.log_pos, self.flags = \
            _HEADER.unpack_from(data, 1)
        self.event: Any = None


def le_int(data: bytes, pos: int, size: int) -> int:
    """The unsigned little-endian integer of `size` (1-8) bytes at `pos` of `data`."""
    if pos < 0 or size < 0 or size > 8 or pos + size > len(data):
        raise Truncated("integer")
    return int.from_bytes(data[pos:pos + size], "little")


def equal_at(data: bytes, pos: int, size: int, other: bytes) -> bool:
    """Whether `data[pos:pos + size]` equals `other`."""
    if len(other) != size or pos < 0 or size < 0 or pos + size > len(data):
        return False
    return data[pos:pos + size] == other
