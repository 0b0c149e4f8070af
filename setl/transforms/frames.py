"""Row images to Arrow tables and back, keeping the values' types.

Arrow types are derived from the Python values of each column: Decimals keep
their precision and scale, datetimes their microseconds (naive stays naive),
bytes become binary. What Arrow (or Spark) cannot hold natively is carried as
text with a *codec* and turned back on the way out: JSON documents (dict,
list), SET values, TIME values, and decimals wider than the target allows.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

#: Widest decimal Spark holds; Parquet takes up to 76 digits (decimal256).
SPARK_MAX_PRECISION = 38
PARQUET_MAX_PRECISION = 76

JSON = "json"
DECIMAL_TEXT = "decimal"
INT_TEXT = "int"
SET = "set"
TIME = "time"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
    values: Sequence[Any], *, max_precision: int = SPARK_MAX_PRECISION, widen_decimals: bool = False,
) -> tuple[pa.DataType, str | None]:
    """The Arrow type for a column's values and the codec (None when stored natively).

    Decimal precision comes from the values; `widen_decimals` makes it the
    widest that holds them (38, or `max_precision`), so that files written
    from different batches share one type.
    """
    kinds = {type(v) for v in values if v is not None}
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
        aware = {v.tzinfo is not None and v.utcoffset() is not None for v in values if v is not None}
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
    if kinds <= {dict, list, tuple}:
        return pa.string(), JSON
    if kinds <= {set, frozenset}:
        return pa.string(), SET
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
    if codec in (DECIMAL_TEXT, INT_TEXT):
        return str(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def _decode(value: Any, codec: str) -> Any:
    if value is None:
        return None
    if codec == JSON:
        return json.loads(value) if isinstance(value, str) else value
    if codec == SET:
        return set(value.split(",")) if value else set()
    if codec == TIME:
        return dt.time.fromisoformat(value) if isinstance(value, str) else value
    if codec == DECIMAL_TEXT:
        return decimal.Decimal(value) if isinstance(value, str) else value
    if codec == INT_TEXT:
        return int(value) if isinstance(value, (str, decimal.Decimal)) else value
    return value


def column_array(
    values: Sequence[Any], *, max_precision: int = SPARK_MAX_PRECISION, widen_decimals: bool = False,
) -> tuple[pa.Array, str | None]:
    """An Arrow array of one column's values, and its codec."""
    tp, codec = infer_type(values, max_precision=max_precision, widen_decimals=widen_decimals)
    if codec == INT_TEXT:
        as_decimal = pa.types.is_decimal(tp)
        values = [None if v is None else (decimal.Decimal(v) if as_decimal else str(v)) for v in values]
    elif codec is not None:
        values = [_encode(v, codec) for v in values]
    elif tp == pa.binary():
        values = [_encode(v, None) for v in values]
    elif pa.types.is_timestamp(tp) and tp.tz is not None:
        values = [None if v is None else v.astimezone(dt.timezone.utc) for v in values]
    elif tp == pa.string():
        try:
            return pa.array(values, type=tp), None
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # mixed kinds: keep their text
            values = [v if v is None or isinstance(v, str) else str(v) for v in values]
    return pa.array(values, type=tp), codec


def rows_to_table(
    rows: Sequence[Mapping[str, Any]],
    *,
    columns: Sequence[str] | None = None,
    extra: Mapping[str, pa.Array] | None = None,
    max_precision: int = SPARK_MAX_PRECISION,
    widen_decimals: bool = False,
) -> tuple[pa.Table, dict[str, str]]:
    """An Arrow table of row images (columns in first-seen order) plus `extra` columns.

    Returns the table and the codecs of the columns stored as text.
    """
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            for name in row:
                seen.setdefault(name, None)
        columns = list(seen)
    arrays, names, codecs = [], [], {}
    for name in columns:
        array, codec = column_array([row.get(name) for row in rows], max_precision=max_precision,
                                    widen_decimals=widen_decimals)
        arrays.append(array)
        names.append(name)
        if codec:
            codecs[name] = codec
    for name, array in (extra or {}).items():
        arrays.append(array)
        names.append(name)
    if not names:
        return pa.table({"__empty": pa.nulls(len(rows))}).drop(["__empty"]), codecs
    return pa.Table.from_arrays(arrays, names=names), codecs


def table_to_rows(table: pa.Table, codecs: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Python rows of an Arrow table, turning codec columns that are still text back into values."""
    rows = table.to_pylist()
    active = {
        name: codec for name, codec in (codecs or {}).items()
        if name in table.column_names and (
            pa.types.is_string(table.schema.field(name).type)
            or pa.types.is_large_string(table.schema.field(name).type)
            or codec == INT_TEXT and pa.types.is_decimal(table.schema.field(name).type)
        )
    }
    if active:
        for row in rows:
            for name, codec in active.items():
                row[name] = _decode(row[name], codec)
    return rows
