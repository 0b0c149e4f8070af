"""setl transform ``currency``: convert amount columns between currencies using a small rate table."""

from setl_currency.transform import currency, load_rates

__all__ = ["currency", "load_rates"]
