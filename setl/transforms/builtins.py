"""The built-in transforms. They register through the ``setl.transforms`` entry points in setup.cfg,
exactly as third-party plugins do.

Every transform keeps the ``_setl_*`` metadata columns the stage adds; `filter`
keeps delete rows unless its step says ``may_drop_deletes: true``.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from setl.plugins import Param, ParamError, TransformContext, transform

META_PREFIX = "_setl_"


def _F() -> Any:
    from pyspark.sql import functions

    return functions


def _require_columns(df: Any, columns: Any, what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"{what}: no column {', '.join(map(repr, missing))} (columns: {', '.join(df.columns)})")


def _no_meta(columns: Any, param: str) -> None:
    touched = [c for c in columns if str(c).startswith(META_PREFIX)]
    if touched:
        raise ParamError(param, f"{param} must not name setl's metadata columns ({', '.join(touched)})")


def _non_empty(param: str) -> Callable[[Mapping[str, Any]], None]:
    def check(params: Mapping[str, Any]) -> None:
        if not params[param]:
            raise ParamError(param, f"{param} must not be empty")
        _no_meta(params[param], param)

    return check


# --- column shape -----------------------------------------------------------------------------


def _check_rename(params: Mapping[str, Any]) -> None:
    columns = params["columns"]
    if not columns:
        raise ParamError("columns", "columns must map at least one old name to a new name")
    _no_meta(list(columns) + list(columns.values()), "columns")
    targets = list(columns.values())
    if len(set(targets)) != len(targets):
        raise ParamError("columns", "two columns are renamed to the same name")


@transform(
    "rename",
    params={"columns": Param(dict[str, str], help="mapping of old column name to new name")},
    renames=lambda params: params["columns"],
    check=_check_rename,
)
def rename(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Rename columns (primary-key columns included; the stage follows the rename)."""
    _require_columns(df, params["columns"], "rename")
    return df.withColumnsRenamed(dict(params["columns"]))


@transform(
    "drop_columns",
    params={
        "columns": Param(list[str], help="columns to remove"),
        "ignore_missing": Param(bool, default=False, help="do not fail when a column is absent"),
    },
    check=_non_empty("columns"),
)
def drop_columns(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Remove columns."""
    if not params["ignore_missing"]:
        _require_columns(df, params["columns"], "drop_columns")
    return df.drop(*params["columns"])


@transform(
    "keep_columns",
    params={"columns": Param(list[str], help="the columns to keep, in this order")},
    check=_non_empty("columns"),
)
def keep_columns(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Keep only the listed columns (setl's metadata columns always stay)."""
    _require_columns(df, params["columns"], "keep_columns")
    meta = [c for c in df.columns if c.startswith(META_PREFIX) and c not in params["columns"]]
    return df.select(*params["columns"], *meta)


def _check_cast(params: Mapping[str, Any]) -> None:
    if not params["columns"]:
        raise ParamError("columns", "columns must map at least one column to a type")
    _no_meta(params["columns"], "columns")
    for column, type_name in params["columns"].items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\s*(\(\s*\d+\s*(,\s*\d+\s*)?\))?|[A-Za-z]+<.+>", type_name.strip()):
            raise ParamError("columns", f"column {column!r}: {type_name!r} is not a Spark SQL type")


@transform(
    "cast",
    params={"columns": Param(dict[str, str], help="mapping of column to Spark SQL type, e.g. decimal(12,2)")},
    check=_check_cast,
)
def cast(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Cast columns to Spark SQL types."""
    F = _F()
    _require_columns(df, params["columns"], "cast")
    return df.withColumns({c: F.col(c).cast(t) for c, t in params["columns"].items()})


@transform(
    "add_column",
    params={
        "name": Param(str, help="name of the new (or replaced) column"),
        "expr": Param(str, help="Spark SQL expression computing it"),
    },
    check=lambda params: _no_meta([params["name"]], "name"),
)
def add_column(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Add a column computed by a Spark SQL expression (replaces a column of the same name)."""
    return df.withColumn(params["name"], _F().expr(params["expr"]))


# --- rows -----------------------------------------------------------------------------------


@transform(
    "filter",
    params={"condition": Param(str, help="Spark SQL boolean expression; rows where it is true are kept")},
)
def filter_rows(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Keep the rows matching a condition; delete rows are kept unless the step may drop deletes.

    An update whose new image fails the condition while its old image passed
    becomes a delete, and the reverse an insert, so the target keeps exactly
    the matching rows.
    """
    F = _F()
    condition = F.coalesce(F.expr(params["condition"]), F.lit(False))
    if not context.may_drop_deletes:
        condition = condition | (F.col("_setl_op") == F.lit("delete"))
    return df.filter(condition)


def _check_sql(params: Mapping[str, Any]) -> None:
    if not _BATCH_REF.search(_strip_literals(params["query"])) and "{batch}" not in params["query"]:
        raise ParamError("query", "query must read FROM batch (the table's rows in this batch)")


_BATCH_REF = re.compile(r"(?i)\b(from|join)(\s+)(`?)batch\3(?![\w.])")
_LITERAL = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"")


def _strip_literals(query: str) -> str:
    return _LITERAL.sub(lambda m: " " * len(m.group(0)), query)


def substitute_batch(query: str, view: str) -> str:
    """Point ``FROM batch`` / ``JOIN batch`` (and ``{batch}``) at `view`, leaving string literals alone."""
    blanked = _strip_literals(query)
    parts, last = [], 0
    for match in _BATCH_REF.finditer(blanked):
        start = match.start(3)
        parts.append(query[last:start])
        parts.append(f"`{view}`")
        last = match.end()
    parts.append(query[last:])
    return "".join(parts).replace("{batch}", f"`{view}`")


@transform(
    "sql",
    params={"query": Param(str, help="a Spark SQL SELECT over the view `batch`; keep _setl_* columns (SELECT *, ...)")},
    check=_check_sql,
)
def sql(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Run a Spark SQL query over the table's rows in this batch, visible as `batch`."""
    spark = df.sparkSession
    # A unique view per call: concurrent batches share one session and its temp views.
    view = f"setl_batch_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(view)
    try:
        result = spark.sql(substitute_batch(params["query"], view))
        missing = [c for c in ("_setl_seq", "_setl_image") if c not in result.columns]
        if missing:
            raise KeyError(
                f"the query dropped setl's columns {', '.join(missing)}; select them too (SELECT *, ... FROM batch)"
            )
        return result
    finally:
        spark.catalog.dropTempView(view)


# --- PII ------------------------------------------------------------------------------------


@transform(
    "mask",
    params={
        "columns": Param(list[str], help="columns to mask (as text)"),
        "keep_last": Param(int, default=4, help="how many trailing characters stay visible"),
        "char": Param(str, default="*", help="the masking character"),
    },
    check=lambda params: _check_mask(params),
)
def mask(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Replace all but the last N characters of columns with a mask character."""
    F = _F()
    _require_columns(df, params["columns"], "mask")
    keep, char = params["keep_last"], _sql_quote(params["char"])
    exprs = {}
    for column in params["columns"]:
        text = f"cast({_ident(column)} as string)"
        exprs[column] = F.expr(
            f"CASE WHEN {text} IS NULL THEN NULL ELSE concat("
            f"repeat('{char}', greatest(length({text}) - {keep}, 0)), right({text}, {keep})) END"
        )
    return df.withColumns(exprs)


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _sql_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _check_mask(params: Mapping[str, Any]) -> None:
    _non_empty("columns")(params)
    if params["keep_last"] < 0:
        raise ParamError("keep_last", "keep_last must not be negative")
    if len(params["char"]) != 1:
        raise ParamError("char", "char must be a single character")


@transform(
    "hash",
    params={
        "columns": Param(list[str], help="columns to replace by their SHA-256 (hex)"),
        "salt": Param(str | None, default=None, help="text prepended before hashing"),
    },
    check=_non_empty("columns"),
)
def hash_columns(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Replace columns by the hex SHA-256 of their value (text, or raw bytes for binary), optionally salted."""
    from pyspark.sql.types import BinaryType

    F = _F()
    _require_columns(df, params["columns"], "hash")
    types = {f.name: f.dataType for f in df.schema.fields}
    salt = F.lit((params["salt"] or "").encode("utf-8"))
    exprs = {}
    for column in params["columns"]:
        value = F.col(column)
        raw = value if isinstance(types[column], BinaryType) else value.cast("string").cast("binary")
        exprs[column] = F.when(value.isNull(), None).otherwise(F.sha2(F.concat(salt, raw), 256))
    return df.withColumns(exprs)


# --- lookup ---------------------------------------------------------------------------------


def _lookup_format(params: Mapping[str, Any]) -> str:
    if params["format"]:
        return params["format"]
    return "parquet" if Path(params["path"]).suffix.lower() in (".parquet", ".pq") else "csv"


def _check_lookup(params: Mapping[str, Any]) -> None:
    if not Path(params["path"]).is_file():
        raise ParamError("path", f"dimension file {params['path']!r} does not exist")
    if not params["on"]:
        raise ParamError("on", "on must name at least one key column")


_dimensions: dict[tuple[int, str, int, int], Any] = {}
_dimensions_lock = threading.Lock()


def load_dimension(spark: Any, path: str, fmt: str, keys: list[str]) -> Any:
    """A cached DataFrame of a dimension file, read once per file version and session."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    key = (id(spark), str(resolved), stat.st_mtime_ns, stat.st_size)
    with _dimensions_lock:
        frame = _dimensions.get(key)
        if frame is not None:
            return frame
        import pyarrow.compute as pc

        if fmt == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(resolved)
        else:
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(resolved)
        missing = [k for k in keys if k not in table.column_names]
        if missing:
            raise KeyError(f"dimension {path} has no column {', '.join(missing)}")
        if table.num_rows:
            counts = table.group_by(keys).aggregate([([], "count_all")])
            dupes = counts.filter(pc.greater(counts["count_all"], 1))
            if dupes.num_rows:
                raise ValueError(f"dimension {path} has {dupes.num_rows} duplicate keys on {keys}; "
                                 "a lookup must not multiply rows")
        from setl.spark import from_arrow

        frame = from_arrow(spark, table).cache()
        for stale in [k for k in _dimensions if k[:2] == key[:2]]:
            _dimensions.pop(stale).unpersist()
        _dimensions[key] = frame
        return frame


@transform(
    "lookup",
    params={
        "path": Param(str, help="CSV (with header) or Parquet file of the dimension"),
        "on": Param(list[str], help="key columns present in both the rows and the dimension"),
        "columns": Param(list[str] | None, default=None, help="dimension columns to add (default: all but the keys)"),
        "format": Param(Literal["csv", "parquet"] | None, default=None, help="file format (default: by extension)"),
    },
    check=_check_lookup,
)
def lookup(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Left-join a static dimension file on key columns, adding its columns to every row."""
    F = _F()
    keys = list(params["on"])
    _require_columns(df, keys, "lookup")
    dim = load_dimension(df.sparkSession, params["path"], _lookup_format(params), keys)
    wanted = params["columns"] or [c for c in dim.columns if c not in keys]
    _require_columns(dim, wanted, f"lookup dimension {params['path']}")
    clash = [c for c in wanted if c in df.columns]
    if clash:
        raise KeyError(f"lookup: dimension columns {', '.join(clash)} already exist in the rows")
    joined = df.join(F.broadcast(dim.select(*keys, *wanted)), on=keys, how="left")
    return joined.select(*df.columns, *wanted)

