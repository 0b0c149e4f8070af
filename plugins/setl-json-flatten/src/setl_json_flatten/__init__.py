"""setl transform ``json_flatten``: parse a JSON text column and spread its fields over columns."""

from setl_json_flatten.transform import flat_columns, json_flatten

__all__ = ["json_flatten", "flat_columns"]
