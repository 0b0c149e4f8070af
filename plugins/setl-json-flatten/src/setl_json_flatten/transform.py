"""The ``json_flatten`` transform.

``schema`` is a Spark DDL string of the fields to extract, nested structs
included (``"name STRING, address STRUCT<city: STRING, zip: STRING>"``). Each
leaf becomes a column named PREFIX + path joined by SEPARATOR
(``doc_address_city``). Fields missing from a document, and rows whose JSON is
NULL or malformed, give NULL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from setl.plugins import Param, ParamError, TransformContext, transform


def flat_columns(data_type: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The leaf paths of a (possibly nested) Spark struct type."""
    from pyspark.sql.types import StructType

    if not isinstance(data_type, StructType):
        return [path]
    leaves: list[tuple[str, ...]] = []
    for field in data_type.fields:
        leaves.extend(flat_columns(field.dataType, path + (field.name,)))
    return leaves


def _check(params: Mapping[str, Any]) -> None:
    if not params["schema"].strip():
        raise ParamError("schema", "schema must list at least one field, e.g. 'name STRING, age INT'")
    if params["column"].startswith("_setl_"):
        raise ParamError("column", "column must not be one of setl's metadata columns")
    if not re.fullmatch(r"[A-Za-z0-9_]*", params["separator"]):
        raise ParamError("separator", "separator must be letters, digits or '_'")


@transform(
    "json_flatten",
    params={
        "column": Param(str, help="the column holding JSON text"),
        "schema": Param(str, help="Spark DDL of the fields to extract, e.g. 'a INT, b STRUCT<c: STRING>'"),
        "prefix": Param(str | None, default=None, help="prefix of the new columns (default: COLUMN + separator)"),
        "separator": Param(str, default="_", help="joins nested field names"),
        "drop_source": Param(bool, default=True, help="remove the JSON column afterwards"),
    },
    check=_check,
)
def json_flatten(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Parse a JSON text column and spread its (nested) fields over typed columns."""
    from pyspark.sql import functions as F

    column, sep = params["column"], params["separator"]
    prefix = params["prefix"] if params["prefix"] is not None else column + sep
    parsed_name = f"__json_flatten_{column}"
    parsed = df.withColumn(parsed_name, F.from_json(F.col(column).cast("string"), params["schema"],
                                                    {"mode": "PERMISSIVE"}))
    leaves = flat_columns(parsed.schema[parsed_name].dataType)
    new_columns = []
    for path in leaves:
        expr = F.col(parsed_name)
        for name in path:
            expr = expr.getField(name)
        new_columns.append(expr.alias(prefix + sep.join(path)))
    kept = [c for c in df.columns if not (params["drop_source"] and c == column)]
    names = [prefix + sep.join(path) for path in leaves]
    taken = [n for n in names if n in kept]
    if taken:
        raise ValueError(f"json_flatten: columns {', '.join(taken)} already exist")
    return parsed.select(*kept, *new_columns)
