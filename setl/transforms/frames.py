"""Row images to Arrow tables and back, column by column, keeping the values' types.

Arrow types are derived from the Python values of each column: Decimals keep
their precision and scale, datetimes their microseconds (naive stays naive),
bytes become binary, integers beyond BIGINT (unsigned BIGINT) a DECIMAL(20,0)
that comes back as int. What Arrow (or Spark) cannot hold natively is carried
as text with a *codec* and turned back on the way out: JSON documents (dict,
list), SET values, TIME values, and decimals wider than the target allows.
A DATE, DATETIME or TIMESTAMP column holding a zero or partial date (`InvalidDate`,
``0000-00-00``) is carried as text too, every value of it in ISO form (``2024-01-31``,
``2024-01-31 12:00:00``, ``0000-00-00``): a Spark transform sees a string column there, and
text that is no calendar date comes back as `InvalidDate`, the rest as dates and datetimes.
A spatial column (`setl.values.Geometry`) is carried as binary holding the server's own bytes
(SRID, then WKB) and comes back as `Geometry`, exactly as it went in.

Deriving a type scans a column's values, so a `TableTypes` remembers each
column's type per table and reuses it while a batch's values fit it (same
Python types, no overflow, same time zone awareness); a column that no longer
fits is derived again. Decimals then come back at the scale of the column's
type, which may be larger than the value's own (``1.5`` as ``1.50``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import pyarrow as pa

from setl.model import InvalidDate
from setl.values import Geometry

#: Widest decimal Spark holds; Parquet takes up to 76 digits (decimal256).
SPARK_MAX_PRECISION = 38
PARQUET_MAX_PRECISION = 76

JSON = "json"
DECIMAL_TEXT = "decimal"
INT_TEXT = "int"
SET = "set"
TIME = "time"
DATE_TEXT = "date"
GEOMETRY = "geometry"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NONE = type(None)
#: What a value that does not fit a remembered column type raises while converting.
_MISFIT = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError, decimal.InvalidOperation)


def _decimal_shape(values: Iterable[Any]) -> tuple[int, int] | None:
    """(integer digits, scale) covering every value, or None for NaN/Infinity."""
    int_digits, scale = 1, 0
    for v in values:
        if isinstance(v, decimal.Decimal):
            sign, digits, exp = v.as_tuple()
            if not isinstance(exp, int):
                return None
            scale = max(scale, -exp)
            int_digits = max(int_digits, len(digits) + exp)
        else:
            int_digits = max(int_digits, len(str(abs(v))))
    return int_digits, scale


def infer_type(
    values: Sequence[Any],
    *,
    max_precision: int = SPARK_MAX_PRECISION,
    widen_decimals: bool = False,
    kinds: set[type] | None = None,
) -> tuple[pa.DataType, str | None]:
    """The Arrow type for a column's values and the codec (None when stored natively).

    Decimal precision comes from the values; `widen_decimals` makes it the
    widest that holds them (38, or `max_precision`), so that files written
    from different batches share one type. `kinds` is the set of the values'
    Python types (without NoneType) when the caller has it already.
    """
    if kinds is None:
        kinds = _kinds(values)
    if not kinds:
        return pa.null(), None
    if kinds == {bool}:
        return pa.bool_(), None
    if kinds == {int}:
        present = [v for v in values if v is not None]
        low, high = min(present), max(present)
        if _INT64_MIN <= low and high <= _INT64_MAX:
            return pa.int64(), None
        digits = max(len(str(abs(low))), len(str(abs(high))))
        if digits <= max_precision:
            return _decimal_type(digits, 0), INT_TEXT
        return pa.string(), INT_TEXT
    if kinds <= {int, float}:
        return pa.float64(), None
    if decimal.Decimal in kinds and kinds <= {int, decimal.Decimal}:
        shape = _decimal_shape(v for v in values if v is not None)
        if shape is not None:
            int_digits, scale = shape
            precision = max(int_digits + scale, 1)
            if precision <= max_precision:
                if widen_decimals:
                    precision = 38 if precision <= 38 else max_precision
                return _decimal_type(precision, scale), None
        return pa.string(), DECIMAL_TEXT
    if kinds == {str}:
        return pa.string(), None
    if kinds <= {bytes, bytearray, memoryview}:
        return pa.binary(), None
    if kinds == {dt.datetime}:
        aware = _aware(values)
        if aware == {False}:
            return pa.timestamp("us"), None
        if aware == {True}:
            return pa.timestamp("us", tz="UTC"), None
    if kinds == {dt.date}:
        return pa.date32(), None
    if kinds == {dt.timedelta}:
        return pa.duration("us"), None
    if kinds == {dt.time}:
        return pa.string(), TIME
    if InvalidDate in kinds and kinds <= {InvalidDate, dt.date, dt.datetime}:
        return pa.string(), DATE_TEXT
    if kinds <= {dict, list, tuple}:
        return pa.string(), JSON
    if kinds <= {set, frozenset}:
        return pa.string(), SET
    if kinds == {Geometry}:
        return pa.binary(), GEOMETRY
    return pa.string(), None


def _decimal_type(precision: int, scale: int) -> pa.DataType:
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _encode(value: Any, codec: str | None) -> Any:
    if value is None:
        return None
    if codec == JSON:
        return json.dumps(value, ensure_ascii=False, default=str)
    if codec == SET:
        return ",".join(sorted(str(v) for v in value))
    if codec == TIME:
        return value.isoformat()
    if codec == DATE_TEXT:
        return str(value)
    if codec in (DECIMAL_TEXT, INT_TEXT):
        return str(value)
    if codec == GEOMETRY:
        return value.data
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def _decode(value: Any, codec: str) -> Any:
    if value is None:
        return None
    if codec == JSON:
        return json.loads(value) if isinstance(value, str) else value
    if codec == SET:
        return frozenset(value.split(",")) if value else frozenset()
    if codec == TIME:
        return dt.time.fromisoformat(value) if isinstance(value, str) else value
    if codec == DATE_TEXT:
        return _date_from_text(value) if isinstance(value, str) else value
    if codec == DECIMAL_TEXT:
        return decimal.Decimal(value) if isinstance(value, str) else value
    if codec == INT_TEXT:
        return int(value) if isinstance(value, (str, decimal.Decimal)) else value
    if codec == GEOMETRY:
        return Geometry(value) if isinstance(value, bytes) else value
    return value


def _date_from_text(text: str) -> dt.date | dt.datetime | InvalidDate:
    """A date (10 characters) or datetime from its ISO text; text no calendar has is an `InvalidDate`."""
    try:
        return dt.date.fromisoformat(text) if len(text) == 10 else dt.datetime.fromisoformat(text)
    except ValueError:
        return InvalidDate(text)


def _kinds(values: Sequence[Any]) -> set[type]:
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    return kinds


def _aware(values: Sequence[Any]) -> set[bool]:
    return {v.tzinfo is not None and v.utcoffset() is not None for v in values if v is not None}


@attrs.frozen
class ColumnType:
    """How one column is stored in Arrow: its type, its codec, and the Python kinds it was derived from."""

    type: pa.DataType
    codec: str | None
    kinds: frozenset[type]

    def fits(self, kinds: set[type], values: Sequence[Any]) -> bool:
        """Whether values of these kinds may be converted with this type (a failed conversion still may not)."""
        if kinds != self.kinds:
            return False
        if pa.types.is_timestamp(self.type):
            return _aware(values) <= {self.type.tz is not None}
        return True


def _convert(values: Sequence[Any], tp: pa.DataType, codec: str | None, kinds: set[type]) -> pa.Array:
    """The Arrow array of `values` as `tp`; raises one of `_MISFIT` when a value does not fit."""
    if codec == INT_TEXT:
        if pa.types.is_decimal(tp):
            values = [None if v is None else decimal.Decimal(v) for v in values]
        else:
            values = [None if v is None else str(v) for v in values]
    elif codec == JSON:
        dumps = json.dumps
        values = [None if v is None else dumps(v, ensure_ascii=False, default=str) for v in values]
    elif codec is not None:
        values = [_encode(v, codec) for v in values]
    elif pa.types.is_binary(tp):
        if not kinds <= {bytes}:
            values = [None if v is None else bytes(v) for v in values]
    elif pa.types.is_timestamp(tp) and tp.tz is not None:
        values = [None if v is None else v.astimezone(dt.timezone.utc) for v in values]
    elif pa.types.is_string(tp) and not kinds <= {str}:  # mixed kinds: keep their text
        values = [v if v is None or isinstance(v, str) else str(v) for v in values]
    return pa.array(values, type=tp)


def column_array(
    values: Sequence[Any],
    *,
    known: ColumnType | None = None,
    max_precision: int = SPARK_MAX_PRECISION,
    widen_decimals: bool = False,
) -> tuple[pa.Array, ColumnType | None]:
    """An Arrow array of one column's values, and the column type it used.

    `known` is the type remembered for the column: used when the values fit
    it (an all-NULL column takes it too), derived again from the values when
    they do not. The returned type is None only for an all-NULL column
    without a known type (stored as Arrow null).
    """
    kinds = _kinds(values)
    if not kinds:
        if known is not None:
            return pa.nulls(len(values), known.type), known
        return pa.nulls(len(values)), None
    if known is not None and known.fits(kinds, values):
        try:
            return _convert(values, known.type, known.codec, kinds), known
        except _MISFIT:
            pass
    tp, codec = infer_type(values, max_precision=max_precision, widen_decimals=widen_decimals, kinds=kinds)
    return _convert(values, tp, codec, kinds), ColumnType(tp, codec, frozenset(kinds))


class TableTypes:
    """The remembered column types of one table, shared by every batch of it.

    Safe to use from several threads: two batches deriving a column at once
    both store a type that is valid for their own values, and the next batch
    checks whichever it finds.
    """

    def __init__(self, *, max_precision: int = SPARK_MAX_PRECISION, widen_decimals: bool = False) -> None:
        self.max_precision = max_precision
        self.widen_decimals = widen_decimals
        self._columns: dict[str, ColumnType] = {}

    def get(self, column: str) -> ColumnType | None:
        return self._columns.get(column)

    def table(
        self,
        images: Sequence[Mapping[str, Any]],
        *,
        columns: Sequence[str] | None = None,
        extra: Mapping[str, pa.Array] | None = None,
    ) -> tuple[pa.Table, dict[str, str]]:
        """An Arrow table of row images (columns in first-seen order) plus `extra` columns.

        Returns the table and the codecs of the columns stored as text.
        """
        if columns is None:
            columns = list(dict.fromkeys(itertools.chain.from_iterable(images)))
        arrays, codecs = [], {}
        for name in columns:
            array, kind = column_array([image.get(name) for image in images], known=self._columns.get(name),
                                       max_precision=self.max_precision, widen_decimals=self.widen_decimals)
            if kind is not None:
                self._columns[name] = kind
                if kind.codec:
                    codecs[name] = kind.codec
            arrays.append(array)
        names = list(columns)
        for name, array in (extra or {}).items():
            arrays.append(array)
            names.append(name)
        if not names:
            return pa.table({"__empty": pa.nulls(len(images))}).drop(["__empty"]), codecs
        return pa.Table.from_arrays(arrays, names=names), codecs


class SchemaCache:
    """`TableTypes` per table name, created on first use."""

    def __init__(self, *, max_precision: int = SPARK_MAX_PRECISION, widen_decimals: bool = False) -> None:
        self.max_precision = max_precision
        self.widen_decimals = widen_decimals
        self._tables: dict[str, TableTypes] = {}
        self._lock = threading.Lock()

    def __getitem__(self, table: str) -> TableTypes:
        types = self._tables.get(table)
        if types is None:
            with self._lock:
                types = self._tables.setdefault(
                    table, TableTypes(max_precision=self.max_precision, widen_decimals=self.widen_decimals))
        return types


def rows_to_table(
    rows: Sequence[Mapping[str, Any]],
    *,
    columns: Sequence[str] | None = None,
    extra: Mapping[str, pa.Array] | None = None,
    max_precision: int = SPARK_MAX_PRECISION,
    widen_decimals: bool = False,
) -> tuple[pa.Table, dict[str, str]]:
    """An Arrow table of row images with every type derived from these rows alone (see `TableTypes.table`)."""
    types = TableTypes(max_precision=max_precision, widen_decimals=widen_decimals)
    return types.table(rows, columns=columns, extra=extra)


def _decoded(values: list[Any], codec: str) -> list[Any]:
    if codec == JSON:
        loads = json.loads
        return [loads(v) if isinstance(v, str) else v for v in values]
    if codec == INT_TEXT:
        return [int(v) if isinstance(v, (str, decimal.Decimal)) else v for v in values]
    return [_decode(v, codec) for v in values]


def _still_encoded(field: pa.Field, codec: str) -> bool:
    """Whether a codec column still holds its stored form (a transform may have cast it to something else)."""
    tp = field.type
    if codec == GEOMETRY:
        return pa.types.is_binary(tp) or pa.types.is_large_binary(tp)
    return pa.types.is_string(tp) or pa.types.is_large_string(tp) or (codec == INT_TEXT and pa.types.is_decimal(tp))


def pylist(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column's Python values, as `to_pylist` gives them, but faster for timestamps, dates and decimals.

    pyarrow builds those objects one by one in Python; numpy builds datetimes
    and dates in C, and Decimal parses Arrow's own decimal text faster than
    pyarrow assembles it.
    """
    tp = column.type
    if pa.types.is_timestamp(tp) and tp.unit in ("s", "ms", "us") and tp.tz in (None, "UTC", "+00:00"):
        values = column.to_numpy(zero_copy_only=False).tolist()
        if tp.tz is None:
            return values
        utc = dt.timezone.utc
        return [None if v is None else v.replace(tzinfo=utc) for v in values]
    if pa.types.is_date32(tp):
        return column.to_numpy(zero_copy_only=False).tolist()
    if pa.types.is_decimal(tp):
        texts = column.cast(pa.string()).to_pylist()
        if column.null_count == 0:
            return list(map(decimal.Decimal, texts))
        return [None if t is None else decimal.Decimal(t) for t in texts]
    return column.to_pylist()


def table_columns(table: pa.Table, codecs: Mapping[str, str] | None = None) -> list[list[Any]]:
    """The Python values of each column of an Arrow table, codec columns turned back into values."""
    codecs = codecs or {}
    out = []
    for field, column in zip(table.schema, table.columns):
        values = pylist(column)
        codec = codecs.get(field.name)
        if codec is not None and _still_encoded(field, codec):
            values = _decoded(values, codec)
        out.append(values)
    return out


def table_to_rows(table: pa.Table, codecs: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Python rows of an Arrow table, built column by column (see `table_columns`)."""
    names = table.column_names
    if not names:
        return [{} for _ in range(table.num_rows)]
    return [dict(zip(names, values)) for values in zip(*table_columns(table, codecs))]
