"""The json_flatten transform on a local Spark."""

from __future__ import annotations

from importlib import metadata

import pytest
from setl_json_flatten import json_flatten

from setl.errors import PluginError
from setl.testing.spark import run_transform

ROWS = [
    {"id": 1, "doc": {"name": "ann", "age": 31, "address": {"city": "Lyon", "zip": "69001"}}},
    {"id": 2, "doc": '{"name": "bob", "address": {"city": "Oslo"}}'},
    {"id": 3, "doc": "not json"},
    {"id": 4, "doc": None},
]
SCHEMA = "name STRING, age INT, address STRUCT<city: STRING, zip: STRING>"


def test_flattens_nested_fields_into_typed_columns(spark):
    """Nested fields become prefixed columns with their types; missing or bad JSON gives NULL."""
    rows = [ROWS[0], ROWS[2], ROWS[3]]
    out = run_transform(json_flatten, rows, {"column": "doc", "schema": SCHEMA}, primary_key=["id"], spark=spark)
    assert out[0] == {"id": 1, "doc_name": "ann", "doc_age": 31, "doc_address_city": "Lyon",
                      "doc_address_zip": "69001"}
    assert out[1] == {"id": 3, "doc_name": None, "doc_age": None, "doc_address_city": None,
                      "doc_address_zip": None}
    assert out[2]["doc_name"] is None


def test_json_text_and_prefix_options(spark):
    """JSON given as text is parsed too; prefix, separator and drop_source are honoured."""
    out = run_transform(json_flatten, [ROWS[1]], {"column": "doc", "schema": SCHEMA, "prefix": "p.",
                                                  "separator": "", "drop_source": False},
                        primary_key=["id"], spark=spark)
    assert out[0]["p.addresscity"] == "Oslo" and out[0]["p.age"] is None
    assert out[0]["doc"] == ROWS[1]["doc"]


def test_clashing_column_fails(spark):
    """A flattened name that already exists is an error rather than a silent overwrite."""
    from setl.errors import TransformError

    with pytest.raises(TransformError, match="already exist"):
        run_transform(json_flatten, [{"id": 1, "doc": "{}", "doc_name": "x"}],
                      {"column": "doc", "schema": "name STRING"},
                      primary_key=["id"], spark=spark)


def test_empty_schema_is_refused():
    """An empty schema is a PluginError naming the parameter."""
    with pytest.raises(PluginError) as info:
        run_transform(json_flatten, ROWS, {"column": "doc", "schema": " "})
    assert info.value.context["param"] == "schema"


def test_registered_through_the_entry_point():
    """Once installed, the package provides 'json_flatten' in the setl.transforms group."""
    try:
        metadata.distribution("setl-json-flatten")
    except metadata.PackageNotFoundError:
        pytest.skip("setl-json-flatten is not installed (pip install -e plugins/setl-json-flatten)")
    names = {ep.name: ep.value for ep in metadata.entry_points(group="setl.transforms")}
    assert names["json_flatten"] == "setl_json_flatten:json_flatten"
