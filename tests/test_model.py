"""The model's named constructors: `TableName.parse` reads the SCHEMA.TABLE words operators write."""

from __future__ import annotations

import pytest

from setl.model import TableName


@pytest.mark.parametrize(("text", "schema", "table"), [
    ("shop.orders", "shop", "orders"),
    ("shop.orders.2024", "shop", "orders.2024"),
    ("`a`.b", "`a`", "b"),
])
def test_parse_splits_at_the_first_dot(text, schema, table):
    """A SCHEMA.TABLE word becomes the pair split at its first dot, and prints back as the same word."""
    name = TableName.parse(text)
    assert name == TableName(schema, table)
    assert str(name) == text


@pytest.mark.parametrize("text", ["orders", ".orders", "shop.", ".", ""])
def test_parse_refuses_a_word_without_both_sides(text):
    """A word with no dot, or an empty schema or table, is a ValueError naming the word."""
    with pytest.raises(ValueError, match=r"is not SCHEMA\.TABLE") as caught:
        TableName.parse(text)
    assert repr(text) in str(caught.value)
