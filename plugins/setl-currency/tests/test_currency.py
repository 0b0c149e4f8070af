"""The currency transform on a local Spark."""

from __future__ import annotations

import decimal
from importlib import metadata

import pytest
from setl_currency import currency, load_rates

from setl.errors import PluginError, TransformError
from setl.testing.spark import run_transform

D = decimal.Decimal
ROWS = [
    {"id": 1, "amount": D("100.00"), "fee": D("1.00"), "cur": "USD"},
    {"id": 2, "amount": D("50.00"), "fee": None, "cur": "gbp"},
    {"id": 3, "amount": D("10.00"), "fee": D("0.10"), "cur": "XYZ"},
]


def expected(amount, code, to="EUR", scale=2):
    rates = load_rates()
    factor = (rates[to] / rates[code]).quantize(D(1).scaleb(-12))
    return (amount * factor).quantize(D(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)


def test_bundled_rates_are_readable():
    """The bundled rate table loads, with EUR as the unit."""
    rates = load_rates()
    assert rates["EUR"] == 1 and rates["USD"] > 0


def test_fixed_source_currency(spark):
    """With 'from', every amount is converted by one factor and rounded to the scale."""
    out = run_transform(currency, ROWS, {"columns": ["amount", "fee"], "from": "USD", "to": "EUR"},
                        primary_key=["id"], spark=spark)
    assert [r["amount"] for r in out] == [expected(D("100.00"), "USD"), expected(D("50.00"), "USD"),
                                          expected(D("10.00"), "USD")]
    assert out[1]["fee"] is None


def test_per_row_currency_column_and_suffix(spark):
    """With currency_column each row uses its own code; unknown codes give NULL; suffix keeps the original."""
    out = run_transform(currency, ROWS, {"columns": ["amount"], "currency_column": "cur", "to": "EUR",
                                         "suffix": "_eur", "scale": 3}, primary_key=["id"], spark=spark)
    assert [r["amount_eur"] for r in out] == [expected(D("100.00"), "USD", scale=3),
                                              expected(D("50.00"), "GBP", scale=3), None]
    assert out[0]["amount"] == D("100.00")


def test_unknown_currency_can_fail_the_batch(spark):
    """With on_unknown: error, an unknown code fails the batch naming the plugin."""
    with pytest.raises(TransformError, match="unknown currency code XYZ") as info:
        run_transform(currency, ROWS, {"columns": ["amount"], "currency_column": "cur", "to": "EUR",
                                       "on_unknown": "error"}, primary_key=["id"], spark=spark)
    assert info.value.context["plugin"] == "currency"


@pytest.mark.parametrize("params, param", [
    ({"columns": ["amount"], "to": "EUR"}, "from"),
    ({"columns": ["amount"], "to": "EUR", "from": "USD", "currency_column": "cur"}, "from"),
    ({"columns": ["amount"], "to": "XXX", "from": "USD"}, "to"),
    ({"columns": ["amount"], "to": "EUR", "from": "USD", "rates": "/no/such.csv"}, "rates"),
    ({"columns": [], "to": "EUR", "from": "USD"}, "columns"),
])
def test_bad_params_are_refused_at_startup(params, param):
    """Inconsistent parameters are a PluginError naming the parameter."""
    with pytest.raises(PluginError) as info:
        run_transform(currency, ROWS, params)
    assert info.value.context["param"] == param


def test_custom_rate_file(spark, tmp_path):
    """A rates file replaces the bundled table."""
    rates = tmp_path / "rates.csv"
    rates.write_text("currency,per_eur\nEUR,1\nABC,4\n")
    out = run_transform(currency, [{"id": 1, "amount": D("8")}],
                        {"columns": ["amount"], "from": "ABC", "to": "EUR", "rates": str(rates)}, spark=spark)
    assert out == [{"id": 1, "amount": D("2.00")}]


def test_registered_through_the_entry_point():
    """Once installed, the package provides 'currency' in the setl.transforms group."""
    try:
        metadata.distribution("setl-currency")
    except metadata.PackageNotFoundError:
        pytest.skip("setl-currency is not installed (pip install -e plugins/setl-currency)")
    names = {ep.name: ep.value for ep in metadata.entry_points(group="setl.transforms")}
    assert names["currency"] == "setl_currency:currency"
