# cython: language_level=3, boundscheck=True, wraparound=False, cdivision=True
"""The binlog source's hot path in C: packet framing, event headers, and row images of ROWS events.

`Framer` reads the binlog stream's packets from a PyMySQL connection's socket buffer, as PyMySQL
frames them; `EventHeader` holds an event's 19-byte header (what the library's packet wrapper
keeps of it).

`RowDecoder` is built once per table map from python-mysql-replication's `Table` (column types,
metadata, names, charsets) and turns the body of a WRITE/UPDATE/DELETE_ROWS event into exactly the
rows of setl's Python decoder (`rowcodec.RowDecoder`): the same dicts of ``values`` and
``none_sources``, the same Python types and values (the exactness tests compare both decoders on
real servers, type by type). It reads every column type MariaDB 10.11 and MySQL 8 write, and
partial images (``binlog_row_image`` NOBLOB or MINIMAL: `present` bitmaps); MySQL's binary JSON
value is read by the `json_value` it is given. A table map it cannot read (a column type no rows
event holds, metadata out of MySQL's ranges, a column without a name) raises `rowcodec.Unreadable`.

No input crashes the process: every index and length read from an event is checked against the
event's bytes and the table map (ENUM indexes, length prefixes, the bitmaps, DECIMAL and temporal
sizes; a table map with metadata out of MySQL's ranges is left to the library), and an image the
table map cannot account for raises `Corrupt` (a ValueError) naming the column.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcmp, memcpy

import codecs
import datetime
import decimal

import pymysql
from pymysql.constants import CR
from pymysqlreplication.constants import NONE_SOURCE

from setl.sources.mysql_binlog.rowcodec import (
    DATETIME_HIRES_BYTES,
    TIME_HIRES_BYTES,
    TIMESTAMP_HIRES_BYTES,
    Corrupt,
    Truncated,
    Unreadable,
    bit_value,
    hires_datetime_parts,
    hires_timestamp_value,
    hires_time_value,
    old_time_value,
)

# field types (pymysqlreplication.constants.FIELD_TYPE), and how a string column's bytes become its
# value: S_DECODE bytes.decode(encoding, "strict"); S_RAW no such codec, the bytes as they are
# (an empty value stays "")
cdef enum:
    T_DECIMAL = 0
    T_TINY = 1
    T_SHORT = 2
    T_LONG = 3
    T_FLOAT = 4
    T_DOUBLE = 5
    T_TIMESTAMP = 7
    T_LONGLONG = 8
    T_INT24 = 9
    T_DATE = 10
    T_TIME = 11
    T_DATETIME = 12
    T_YEAR = 13
    T_VARCHAR = 15
    T_BIT = 16
    T_TIMESTAMP2 = 17
    T_DATETIME2 = 18
    T_TIME2 = 19
    T_JSON = 245
    T_NEWDECIMAL = 246
    T_ENUM = 247
    T_SET = 248
    T_BLOB = 252
    T_STRING = 254
    T_GEOMETRY = 255
    S_DECODE = 0
    S_RAW = 1

_SUPPORTED = frozenset({T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_TIMESTAMP, T_LONGLONG, T_INT24, T_DATE,
                        T_TIME, T_DATETIME, T_YEAR, T_VARCHAR, T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2, T_JSON,
                        T_NEWDECIMAL, T_ENUM, T_SET, T_BLOB, T_STRING, T_GEOMETRY})
_COMPRESSED_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_NULL = NONE_SOURCE.NULL
_ABSENT = NONE_SOURCE.COLS_BITMAP
_EMPTY_SET = NONE_SOURCE.EMPTY_SET
_Decimal = decimal.Decimal
_date = datetime.date
_datetime_cls = datetime.datetime
_utcfromtimestamp = datetime.datetime.utcfromtimestamp


cdef inline unsigned long long _le(const unsigned char* p, int n):
    cdef unsigned long long v = 0
    cdef int i
    for i in range(n - 1, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline unsigned long long _be_unsigned(const unsigned char* p, int n):
    cdef unsigned long long v = 0
    cdef int k
    for k in range(n):
        v = (v << 8) | p[k]
    return v


cdef inline long long _be_signed(const unsigned char* p, int n):
    """A big-endian integer of n (1-4) bytes, signed as the library reads it (read_int_be_by_size)."""
    cdef unsigned long long v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    if v >= (1ULL << (8 * n - 1)):
        return <long long>v - <long long>(1ULL << (8 * n))
    return <long long>v


cdef class RowDecoder:
    """The precompiled column readers of one table map."""

    cdef int ncols
    cdef int[:] types
    cdef int[:] unsigned_
    cdef int[:] p1          # length prefix size / fsp / precision / enum or set size / bit bytes
    cdef int[:] p2          # string mode / decimals / bits
    cdef tuple names
    cdef list encodings
    cdef list enums         # ENUM and SET values
    cdef object time2
    cdef object make_date
    cdef object make_datetime
    cdef object json_value

    def __init__(self, columns, charset_to_encoding, time2, make_date, make_datetime, json_value=None):
        import array
        n = len(columns)
        if n < 1:
            raise Unreadable("a table map without columns")
        self.ncols = n
        types, unsigned_, p1, p2 = array.array("i", [0] * n), array.array("i", [0] * n), \
            array.array("i", [0] * n), array.array("i", [0] * n)
        names, encodings, enums = [], [], []
        for i, column in enumerate(columns):
            kind = column.type
            if not column.name:
                raise Unreadable(f"column of type {kind} has no name in the table map (binlog_row_metadata=FULL "
                                 "names every column)")
            if kind not in _SUPPORTED or (kind == T_JSON and json_value is None):
                raise Unreadable(f"{column.name}: column type {kind} is not one setl decodes")
            types[i] = kind
            unsigned_[i] = 1 if getattr(column, "unsigned", False) else 0
            names.append(column.name)
            encoding = None
            enum_values = None
            # metadata out of MySQL's ranges (a corrupt table map) is refused
            if kind in (T_VARCHAR, T_STRING):
                p1[i] = 2 if column.max_length > 255 else 1
            elif kind in (T_BLOB, T_GEOMETRY, T_JSON):
                if column.length_size not in (1, 2, 3, 4):
                    raise Unreadable(f"{column.name}: length size {column.length_size}")
                p1[i] = column.length_size
            elif kind in (T_TIME, T_DATETIME, T_TIMESTAMP):  # MariaDB's fractional formats: beside the map
                if (getattr(column, "hires_fsp", 0) or 0) not in range(7):
                    raise Unreadable(f"{column.name}: fractional seconds {column.hires_fsp}")
                p1[i] = getattr(column, "hires_fsp", 0) or 0
            elif kind in (T_DATETIME2, T_TIMESTAMP2, T_TIME2):
                if (column.fsp or 0) not in range(7):
                    raise Unreadable(f"{column.name}: fractional seconds {column.fsp}")
                p1[i] = column.fsp or 0
            elif kind == T_NEWDECIMAL:
                if column.precision not in range(1, 66) or column.decimals not in range(min(column.precision, 30) + 1):
                    raise Unreadable(f"{column.name}: DECIMAL({column.precision},{column.decimals})")
                p1[i], p2[i] = column.precision, column.decimals
            elif kind == T_ENUM:
                if column.size not in (1, 2) or not column.enum_values:
                    raise Unreadable(f"{column.name}: ENUM of {column.size} bytes, values {column.enum_values!r}")
                p1[i] = column.size
                enum_values = tuple(column.enum_values)
            elif kind == T_SET:
                if column.size not in range(1, 9) or not column.set_values \
                        or len(column.set_values) > 8 * column.size:
                    raise Unreadable(f"{column.name}: SET of {column.size} bytes, values {column.set_values!r}")
                p1[i] = column.size
                enum_values = tuple(column.set_values)
            elif kind == T_BIT:
                if column.bits not in range(1, 65) or column.bytes != (column.bits + 7) // 8:
                    raise Unreadable(f"{column.name}: BIT({column.bits}) of {column.bytes} bytes")
                p1[i], p2[i] = column.bytes, column.bits
            if kind in (T_VARCHAR, T_STRING, T_BLOB):
                name = column.character_set_name
                encoding = charset_to_encoding(name) if name is not None else "utf-8"
                try:
                    codecs.lookup(encoding)
                    p2[i] = S_DECODE
                except LookupError:
                    p2[i] = S_RAW
            encodings.append(encoding)
            enums.append(enum_values)
        self.types, self.unsigned_, self.p1, self.p2 = types, unsigned_, p1, p2
        self.names, self.encodings, self.enums = tuple(names), encodings, enums
        self.time2, self.make_date, self.make_datetime = time2, make_date, make_datetime
        self.json_value = json_value

    cdef object _value(self, int i, const unsigned char* p, Py_ssize_t* at, Py_ssize_t end):
        cdef int kind = self.types[i]
        cdef Py_ssize_t pos = at[0]
        cdef Py_ssize_t length
        cdef int n
        cdef long long sv
        cdef unsigned long long uv
        cdef float f
        cdef double d
        cdef object value
        if kind == T_TINY:
            n = 1
        elif kind == T_SHORT:
            n = 2
        elif kind == T_INT24:
            n = 3
        elif kind == T_LONG or kind == T_FLOAT:
            n = 4
        elif kind == T_LONGLONG or kind == T_DOUBLE:
            n = 8
        elif kind == T_YEAR:
            n = 1
        elif kind == T_DATE:
            n = 3
        elif kind == T_TIMESTAMP:
            if self.p1[i]:
                return self._hires(i, p, at, end)
            n = 4
        elif kind == T_TIME:
            if self.p1[i]:
                return self._hires(i, p, at, end)
            n = 3
        elif kind == T_DATETIME:
            if self.p1[i]:
                return self._hires(i, p, at, end)
            n = 8
        else:
            n = 0
        if n:
            if pos + n > end:
                raise Truncated(self.names[i])
            at[0] = pos + n
            if kind == T_FLOAT:
                memcpy(&f, p + pos, 4)
                return <double>f
            if kind == T_DOUBLE:
                memcpy(&d, p + pos, 8)
                return d
            uv = _le(p + pos, n)
            if kind == T_YEAR:
                return <long>uv + 1900
            if kind == T_DATE:
                return self.make_date(<long>(uv >> 9), <long>((uv >> 5) & 15), <long>(uv & 31))
            if kind == T_TIMESTAMP:
                return _utcfromtimestamp(uv)
            if kind == T_TIME:
                return old_time_value(uv)
            if kind == T_DATETIME:
                sv = <long long>(uv // 1000000)
                uv = uv % 1000000
                return self.make_datetime(<long>(sv // 10000), <long>(sv // 100 % 100), <long>(sv % 100),
                                          <long>(uv // 10000), <long>(uv // 100 % 100), <long>(uv % 100), 0, 0)
            if self.unsigned_[i] or (uv >> (8 * n - 1)) == 0:
                return uv
            if n == 8:
                return <long long>uv
            return <long long>uv - <long long>(1ULL << (8 * n))
        if kind == T_VARCHAR or kind == T_STRING or kind == T_BLOB or kind == T_GEOMETRY or kind == T_JSON:
            n = self.p1[i]
            if pos + n > end:
                raise Truncated(self.names[i])
            length = <Py_ssize_t>_le(p + pos, n)  # n <= 4: never negative
            pos += n
            if length > end - pos:
                raise Truncated(self.names[i])
            at[0] = pos + length
            value = p[pos:pos + length]
            if kind == T_GEOMETRY:
                return value
            if kind == T_JSON:
                return self.json_value(value) if length else None
            if self.p2[i] == S_DECODE:
                return value.decode(self.encodings[i], "strict")
            return value if length else ""
        if kind == T_DATETIME2:
            return self._datetime2(i, p, at, end)
        if kind == T_TIMESTAMP2:
            if pos + 4 > end:
                raise Truncated(self.names[i])
            sv = _be_signed(p + pos, 4)
            at[0] = pos + 4
            value = _utcfromtimestamp(sv)
            uv = self._fsp(i, p, at, end)
            if uv > 0:
                value = value.replace(microsecond=uv)
            return value
        if kind == T_TIME2:
            n = 3 + (self.p1[i] + 1) // 2
            if pos + n > end:
                raise Truncated(self.names[i])
            at[0] = pos + n
            return self.time2(p[pos:pos + n], self.p1[i])
        if kind == T_NEWDECIMAL:
            return self._decimal(i, p, at, end)
        if kind == T_ENUM:
            n = self.p1[i]
            if pos + n > end:
                raise Truncated(self.names[i])
            uv = _le(p + pos, n)
            at[0] = pos + n
            enum_values = self.enums[i]
            if uv >= <unsigned long long>len(enum_values):
                raise Corrupt(f"{self.names[i]}: ENUM index {uv} out of range (the table map lists "
                              f"{len(enum_values) - 1} values)")
            return enum_values[uv]
        if kind == T_SET:
            n = self.p1[i]
            if pos + n > end:
                raise Truncated(self.names[i])
            uv = _le(p + pos, n)
            at[0] = pos + n
            set_values = self.enums[i]
            if len(set_values) < 64 and (uv >> len(set_values)):
                raise Corrupt(f"{self.names[i]}: SET bits {uv:#x} name members beyond the table map's "
                              f"{len(set_values)}")
            members = set()
            for n in range(len(set_values)):
                if uv & (1ULL << n):
                    members.add(set_values[n])
            return members or None
        if kind == T_BIT:
            n = self.p1[i]
            if pos + n > end:
                raise Truncated(self.names[i])
            at[0] = pos + n
            return bit_value(p[pos:pos + n], self.p2[i])
        raise Corrupt(f"{self.names[i]}: column type {kind}")

    cdef object _hires(self, int i, const unsigned char* p, Py_ssize_t* at, Py_ssize_t end):
        """A TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 fractional formats (as `rowcodec`)."""
        cdef int fsp = self.p1[i]
        cdef int kind = self.types[i]
        cdef Py_ssize_t pos = at[0]
        cdef int n
        cdef unsigned long long micros
        cdef int k
        if kind == T_TIMESTAMP:
            n = TIMESTAMP_HIRES_BYTES[fsp]
        elif kind == T_TIME:
            n = TIME_HIRES_BYTES[fsp]
        else:
            n = DATETIME_HIRES_BYTES[fsp]
        if pos + n > end:
            raise Truncated(self.names[i])
        at[0] = pos + n
        if kind == T_TIMESTAMP:
            micros = _be_unsigned(p + pos + 4, n - 4)
            for k in range(6 - fsp):
                micros *= 10
            if micros >= 1000000:
                raise Corrupt(f"{self.names[i]}: a fraction of {micros} microseconds")
            return hires_timestamp_value(_be_unsigned(p + pos, 4), micros, fsp)
        if kind == T_TIME:
            return hires_time_value(_be_unsigned(p + pos, n), fsp)
        return self.make_datetime(*hires_datetime_parts(_be_unsigned(p + pos, n), fsp), fsp)

    cdef unsigned long long _fsp(self, int i, const unsigned char* p, Py_ssize_t* at, Py_ssize_t end):
        """The fraction of a temporal value in microseconds (the library's ``__read_fsp``)."""
        cdef int fsp = self.p1[i]
        cdef int n = (fsp + 1) // 2
        cdef long long v
        cdef long long scale = 1
        cdef int k
        if n == 0:
            return 0
        if at[0] + n > end:
            raise Truncated(self.names[i])
        v = _be_signed(p + at[0], n)
        at[0] += n
        if fsp % 2:
            v = <long long>(<double>v / 10)  # int(microsecond / 10), as the library computes it
        for k in range(6 - fsp):
            scale *= 10
        v *= scale
        if v < 0 or v >= 1000000:
            raise Corrupt(f"{self.names[i]}: a fraction of {v} microseconds")
        return <unsigned long long>v

    cdef object _datetime2(self, int i, const unsigned char* p, Py_ssize_t* at, Py_ssize_t end):
        cdef Py_ssize_t pos = at[0]
        cdef unsigned long long data, year_month, micros
        if pos + 5 > end:
            raise Truncated(self.names[i])
        data = (<unsigned long long>p[pos] << 32) | (<unsigned long long>p[pos + 1] << 24) | \
            (<unsigned long long>p[pos + 2] << 16) | (<unsigned long long>p[pos + 3] << 8) | p[pos + 4]
        at[0] = pos + 5
        year_month = (data >> 22) & ((1 << 17) - 1)
        micros = self._fsp(i, p, at, end)
        return self.make_datetime(<long>(year_month // 13), <long>(year_month % 13), <long>((data >> 17) & 31),
                                  <long>((data >> 12) & 31), <long>((data >> 6) & 63), <long>(data & 63),
                                  <long>micros, self.p1[i])

    cdef object _decimal(self, int i, const unsigned char* p, Py_ssize_t* at, Py_ssize_t end):
        """DECIMAL(precision, decimals): the library's ``__read_new_decimal``, digit for digit."""
        cdef int precision = self.p1[i]
        cdef int decimals = self.p2[i]
        cdef int integral = precision - decimals
        cdef int uncomp_integral = integral // 9
        cdef int uncomp_fractional = decimals // 9
        cdef int comp_integral = integral - uncomp_integral * 9
        cdef int comp_fractional = decimals - uncomp_fractional * 9
        cdef int size_i = _COMPRESSED_BYTES[comp_integral]
        cdef int size_f = _COMPRESSED_BYTES[comp_fractional]
        cdef Py_ssize_t total = size_i + 4 * (uncomp_integral + uncomp_fractional) + size_f
        cdef Py_ssize_t pos = at[0]
        cdef unsigned char buf[64]
        cdef long long mask
        cdef long long v
        cdef int k
        cdef list parts
        if total == 0 or total > 64:  # RowDecoder() refuses such a column
            raise Corrupt(f"{self.names[i]}: DECIMAL({precision},{decimals}) of {total} bytes")
        if pos + total > end:
            raise Truncated(self.names[i])
        memcpy(buf, p + pos, total)
        at[0] = pos + total
        if buf[0] & 0x80:
            mask = 0
            parts = []
        else:
            mask = -1
            parts = ["-"]
        buf[0] ^= 0x80
        pos = 0
        if size_i:
            v = _be_signed(buf, size_i) ^ mask
            parts.append(str(v))
            pos = size_i
        for k in range(uncomp_integral):
            v = _be_signed(buf + pos, 4) ^ mask
            parts.append(f"{v:09d}")
            pos += 4
        parts.append(".")
        for k in range(uncomp_fractional):
            v = _be_signed(buf + pos, 4) ^ mask
            parts.append(f"{v:09d}")
            pos += 4
        if size_f:
            v = _be_signed(buf + pos, size_f) ^ mask
            parts.append(f"{v:0{comp_fractional}d}")
        return _Decimal("".join(parts))

    cdef object _image(self, const unsigned char* p, Py_ssize_t* at, Py_ssize_t end, dict nones,
                       const unsigned char* present):
        cdef int logged = self.ncols
        cdef int nbitmap
        cdef Py_ssize_t bitmap = at[0]
        cdef dict values = {}
        cdef int i
        cdef int index = 0
        if present != NULL:
            logged = 0
            for i in range(self.ncols):
                if present[i >> 3] & (1 << (i & 7)):
                    logged += 1
        nbitmap = (logged + 7) // 8
        if bitmap + nbitmap > end:
            raise Truncated("null bitmap")
        at[0] = bitmap + nbitmap
        for i in range(self.ncols):
            name = self.names[i]
            if present != NULL and not (present[i >> 3] & (1 << (i & 7))):
                values[name] = None
                nones[name] = _ABSENT
                continue
            if p[bitmap + (index >> 3)] & (1 << (index & 7)):
                values[name] = None
                nones[name] = _NULL
            else:
                value = values[name] = self._value(i, p, at, end)
                if value is None:  # an empty SET, a JSON of no bytes
                    nones[name] = _EMPTY_SET if self.types[i] == T_SET else _NULL
            index += 1
        return values

    def decode(self, bytes data, Py_ssize_t pos, Py_ssize_t end, int kind, present=None):
        """The rows of one event body: `data[pos:end]` holds the row images (after the bitmaps).

        kind: 0 WRITE, 1 UPDATE, 2 DELETE; `present`: the columns-present bitmaps (before, after: bytes)
        of a partial image, None for full images. Returns the list of row dicts.
        """
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t at = pos
        cdef bytes before = None
        cdef bytes after = None
        if pos < 0 or end > PyBytes_GET_SIZE(data) or pos > end:
            raise Truncated(f"event: rows at {pos}-{end} of {PyBytes_GET_SIZE(data)} bytes")
        if present is not None:
            before, after = present
            if PyBytes_GET_SIZE(before) < (self.ncols + 7) // 8 or PyBytes_GET_SIZE(after) < (self.ncols + 7) // 8:
                raise Truncated("columns-present bitmap")
        try:
            return self._rows(p, at, end, kind, before, after)
        except Corrupt:
            raise
        except (ValueError, ArithmeticError, LookupError, TypeError, IndexError) as exc:  # a value no column holds
            raise Corrupt(f"{type(exc).__name__}: {exc}") from exc

    cdef list _rows(self, const unsigned char* p, Py_ssize_t at, Py_ssize_t end, int kind, bytes before_map,
                    bytes after_map):
        cdef list rows = []
        cdef dict nones, after_nones
        cdef const unsigned char* first = NULL
        cdef const unsigned char* second = NULL
        if before_map is not None:
            first = <const unsigned char*>PyBytes_AS_STRING(before_map)
            second = <const unsigned char*>PyBytes_AS_STRING(after_map)
        while at < end:
            nones = {}
            if kind == 1:
                after_nones = {}
                before = self._image(p, &at, end, nones, first)
                after = self._image(p, &at, end, after_nones, second)
                rows.append({"before_values": before, "before_none_sources": nones,
                             "after_values": after, "after_none_sources": after_nones})
            else:
                values = self._image(p, &at, end, nones, first)
                rows.append({"values": values, "none_sources": nones})
        return rows


def full_bitmap(bytes data, Py_ssize_t pos, int ncols):
    """Whether the columns-present bitmap at `pos` names every one of `ncols` columns."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef int i
    if pos < 0 or ncols < 0 or pos + (ncols + 7) // 8 > PyBytes_GET_SIZE(data):
        return False
    for i in range(ncols):
        if not (p[pos + (i >> 3)] & (1 << (i & 7))):
            return False
    return True


_LOST = "Lost connection to MySQL server during query"  # PyMySQL's words, which setl's reconnect knows


cdef class Framer:
    """The packets of a PyMySQL connection, read from its buffered socket file as PyMySQL's
    `_read_packet` reads them, through `setl.adapters.pymysql.PacketIO` (`io`): the sequence number
    checked (and kept here: `sync()` writes it back), payloads of 16 MiB and more joined, a lost
    connection force-closed and raised as PyMySQL raises it (OperationalError 2013)."""

    cdef object io, read
    cdef int seq

    def __init__(self, io):
        self.io = io
        self.read = io.read
        self.seq = io.seq

    def sync(self):
        """Write the sequence number back to the connection (before PyMySQL reads from it)."""
        self.io.seq = self.seq

    cdef bytes _bytes(self, Py_ssize_t size):
        while True:
            try:
                data = self.read(size)
                break
            except InterruptedError:
                continue
            except OSError as exc:
                self.io.force_close()
                raise pymysql.err.OperationalError(CR.CR_SERVER_LOST, f"{_LOST} ({exc})") from exc
            except BaseException:
                self.io.force_close()
                raise
        if data is None or PyBytes_GET_SIZE(data) < size:
            self.io.force_close()
            raise pymysql.err.OperationalError(CR.CR_SERVER_LOST, _LOST)
        return data

    def packet(self):
        """The next packet's payload (bytes)."""
        cdef bytes header
        cdef const unsigned char* h
        cdef Py_ssize_t size
        cdef list parts = None
        while True:
            header = self._bytes(4)
            h = <const unsigned char*>PyBytes_AS_STRING(header)
            size = h[0] | (h[1] << 8) | (h[2] << 16)
            if h[3] != self.seq:
                self.io.force_close()
                if h[3] == 0:  # MariaDB sends an error packet numbered 0 when it shuts down
                    raise pymysql.err.OperationalError(CR.CR_SERVER_LOST, _LOST)
                raise pymysql.err.InternalError(f"Packet sequence number wrong - got {h[3]} expected {self.seq}")
            self.seq = (self.seq + 1) % 256
            data = self._bytes(size)
            if size < 0xFFFFFF:
                if parts is None:
                    return data
                parts.append(data)
                return b"".join(parts)
            if parts is None:
                parts = []
            parts.append(data)


cdef class EventHeader:
    """An event's header, read from an OK packet's payload (the OK byte, then the 19-byte header);
    it stands for the library's packet wrapper as `event.packet` (`log_pos`, `event_size`)."""

    cdef public unsigned long timestamp
    cdef public int event_type
    cdef public unsigned long server_id
    cdef public unsigned long event_size
    cdef public unsigned long log_pos
    cdef public int flags
    cdef public object event

    def __init__(self, bytes data):
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
        if PyBytes_GET_SIZE(data) < 20:
            raise Truncated("event header")
        self.timestamp = <unsigned long>_le(p + 1, 4)
        self.event_type = p[5]
        self.server_id = <unsigned long>_le(p + 6, 4)
        self.event_size = <unsigned long>_le(p + 10, 4)
        self.log_pos = <unsigned long>_le(p + 14, 4)
        self.flags = <int>_le(p + 18, 2)
        self.event = None


def le_int(bytes data, Py_ssize_t pos, int size):
    """The unsigned little-endian integer of `size` (1-8) bytes at `pos` of `data`."""
    if pos < 0 or size < 0 or size > 8 or pos + size > PyBytes_GET_SIZE(data):
        raise Truncated("integer")
    return _le(<const unsigned char*>PyBytes_AS_STRING(data) + pos, size)


def equal_at(bytes data, Py_ssize_t pos, Py_ssize_t size, bytes other):
    """Whether `data[pos:pos + size]` equals `other`, without slicing."""
    if PyBytes_GET_SIZE(other) != size or pos < 0 or size < 0 or pos + size > PyBytes_GET_SIZE(data):
        return False
    return memcmp(PyBytes_AS_STRING(data) + pos, PyBytes_AS_STRING(other), size) == 0


def count_rows(bytes data, Py_ssize_t pos, Py_ssize_t end, int kind, const int[:] widths):
    """How many row changes the full row images in `data[pos:end]` hold, read by length only: no
    value is built (`skipping`: the rows events of tables no pipeline reads). `widths[i]` is column
    i's size in bytes when positive, the size of its length prefix when negative; kind 1 (UPDATE)
    has two images a row. An image that runs past `end` raises `Truncated`."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t ncols = widths.shape[0]
    cdef Py_ssize_t nbitmap = (ncols + 7) // 8
    cdef Py_ssize_t at = pos
    cdef Py_ssize_t bitmap, length
    cdef Py_ssize_t count = 0
    cdef int images = 2 if kind == 1 else 1
    cdef int image, w
    cdef Py_ssize_t i
    if ncols < 1 or pos < 0 or end > PyBytes_GET_SIZE(data) or pos > end:
        raise Truncated(f"event: rows at {pos}-{end} of {PyBytes_GET_SIZE(data)} bytes")
    while at < end:
        for image in range(images):
            bitmap = at
            if nbitmap > end - at:
                raise Truncated("null bitmap")
            at += nbitmap
            for i in range(ncols):
                if p[bitmap + (i >> 3)] & (1 << (i & 7)):
                    continue
                w = widths[i]
                if w > 0:
                    if w > end - at:
                        raise Truncated(f"column {i}")
                    at += w
                elif w < 0 and -w <= 4:
                    if -w > end - at:
                        raise Truncated(f"column {i}")
                    length = <Py_ssize_t>_le(p + at, -w)
                    at += -w
                    if length > end - at:
                        raise Truncated(f"column {i}")
                    at += length
                else:
                    raise Corrupt(f"column {i}: width {w}")
        count += 1
    return count
