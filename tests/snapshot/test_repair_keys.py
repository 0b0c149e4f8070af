"""Repair keys (`setl.snapshot.repair`): canonical texts back to the values the snapshot reader hands
on, and which requested keys a read did not find."""

from __future__ import annotations

import datetime
import decimal

import pytest

from setl.snapshot.repair import RepairRefused, absent, key_value, typed_keys


def test_key_texts_become_the_readers_values():
    """Each covered key type reads back from its canonical text (setl.verify.canonical's forms)."""
    assert key_value("bigint", "-12") == -12
    assert key_value("decimal", "1.500") == decimal.Decimal("1.500")
    assert key_value("date", "2024-02-29") == datetime.date(2024, 2, 29)
    assert key_value("datetime", "2024-01-02 03:04:05.000007") == datetime.datetime(2024, 1, 2, 3, 4, 5, 7)
    assert key_value("varchar", "a b ") == "a b "
    assert key_value("varbinary", "00FF") == b"\x00\xff"
    assert key_value("uuid", "123E4567-E89B-12D3-A456-426614174000") == "123e4567-e89b-12d3-a456-426614174000"
    assert typed_keys({"a": "int", "b": "char"}, ("a", "b"), [("1", "x"), ("2", "y")]) == [(1, "x"), (2, "y")]


def test_a_key_type_without_an_exact_text_or_a_bad_text_is_refused():
    """A float or JSON key, or a text that is not a value of its type, is refused (the table is copied whole)."""
    with pytest.raises(RepairRefused, match="double"):
        key_value("double", "1.5")
    with pytest.raises(RepairRefused, match="not a int value"):
        key_value("int", "x")


def test_absent_keys_ignore_what_the_collation_finds_equal():
    """A key the read found, exactly or as a case- and trailing-space-insensitive collation compares
    it, is not deleted; the others are."""
    wanted = [(1, "a"), (2, "B "), (3, "c")]
    assert absent(wanted, [(1, "a"), (2, "b")]) == [(3, "c")]
    assert absent(wanted, []) == wanted
