"""The ``currency`` transform: amounts times a per-currency factor, rounded to a fixed scale.

Rates are "units per 1 EUR" in a CSV file (``currency,per_eur``); the bundled
``rates.csv`` is a static example table, and ``rates:`` points at your own.
"""

from __future__ import annotations

import csv
import decimal
import io
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from setl.plugins import Param, ParamError, TransformContext, transform

FACTOR_SCALE = 12


def load_rates(path: str | None = None) -> dict[str, decimal.Decimal]:
    """Currency code -> units per EUR, from `path` or the bundled table."""
    if path is None:
        text = resources.files("setl_currency").joinpath("rates.csv").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    rates = {}
    for row in csv.DictReader(io.StringIO(text)):
        rate = decimal.Decimal(row["per_eur"])
        if rate <= 0:
            raise ValueError(f"rate of {row['currency']} must be positive")
        rates[row["currency"].strip().upper()] = rate
    return rates


def _factors(rates: Mapping[str, decimal.Decimal], to: str) -> dict[str, decimal.Decimal]:
    quantum = decimal.Decimal(1).scaleb(-FACTOR_SCALE)
    return {code: (rates[to] / rate).quantize(quantum) for code, rate in rates.items()}


def _check(params: Mapping[str, Any]) -> None:
    if not params["columns"]:
        raise ParamError("columns", "columns must name at least one amount column")
    if (params["from"] is None) == (params["currency_column"] is None):
        raise ParamError("from", "give exactly one of 'from' (a fixed currency) or 'currency_column'")
    if params["rates"] is not None and not Path(params["rates"]).is_file():
        raise ParamError("rates", f"rate file {params['rates']!r} does not exist")
    try:
        rates = load_rates(params["rates"])
    except (ValueError, KeyError, decimal.InvalidOperation) as exc:
        raise ParamError("rates", f"cannot read the rate table: {exc}") from exc
    for name in ("to", "from"):
        code = params[name]
        if code is not None and code.upper() not in rates:
            raise ParamError(name, f"unknown currency {code!r} (known: {', '.join(sorted(rates))})")
    if not 0 <= params["scale"] <= 18:
        raise ParamError("scale", "scale must be between 0 and 18")


@transform(
    "currency",
    params={
        "columns": Param(list[str], help="amount columns to convert"),
        "to": Param(str, help="currency to convert into, e.g. EUR"),
        "from": Param(str | None, default=None, help="the amounts' currency, when it is the same for every row"),
        "currency_column": Param(str | None, default=None, help="column holding each row's currency code"),
        "rates": Param(str | None, default=None, help="CSV of currency,per_eur (default: the bundled table)"),
        "scale": Param(int, default=2, help="decimal places of the result"),
        "suffix": Param(str | None, default=None, help="write to COLUMN+SUFFIX instead of replacing COLUMN"),
        "on_unknown": Param(Literal["null", "error"], default="null", help="what an unknown currency code gives"),
    },
    check=_check,
)
def currency(df: Any, params: Mapping[str, Any], context: TransformContext) -> Any:
    """Convert amount columns into one currency with a static rate table."""
    from pyspark.sql import functions as F

    factors = _factors(load_rates(params["rates"]), params["to"].upper())
    factor_type = f"decimal({FACTOR_SCALE + 8},{FACTOR_SCALE})"
    if params["from"] is not None:
        factor = F.lit(str(factors[params["from"].upper()])).cast(factor_type)
        code = F.lit(params["from"].upper())
    else:
        code = F.upper(F.trim(F.col(params["currency_column"])))
        mapping = F.create_map(*[item for c, f in factors.items()
                                 for item in (F.lit(c), F.lit(str(f)).cast(factor_type))])
        factor = mapping[code]
    result_type = f"decimal(38,{params['scale']})"
    converted = {}
    for column in params["columns"]:
        amount = F.col(column)
        value = F.round(amount.cast("decimal(38,10)") * factor, params["scale"]).cast(result_type)
        if params["on_unknown"] == "error":
            value = F.when(amount.isNotNull() & factor.isNull(),
                           F.raise_error(F.concat(F.lit("currency: unknown currency code "),
                                                  F.coalesce(code, F.lit("NULL"))))
                           ).otherwise(value)
        converted[column + (params["suffix"] or "")] = value
    return df.withColumns(converted)
