"""The scans of a batch's row images (`setl.sinks.sql_rows`): the compiled forms (`_images.pyx`)
give what the Python forms give, for any images, and grouping keeps each shape's rows in order."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from setl.model import Batch, DdlChange, InvalidDate, Op, PartialImage, Position, RowChange
from setl.sinks import sql_rows

pytestmark = pytest.mark.timeout(120)

AT = Position("mysql-bin.000001", 4)
COLUMNS = ["id", "k", "c", "pad", "d"]
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.binary(max_size=3), st.floats(allow_nan=False),
                   st.builds(InvalidDate, st.sampled_from(["0000-00-00", "2024-00-15"])),
                   st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
                   st.frozensets(st.text(max_size=2), max_size=2))


@st.composite
def images(draw: Any) -> Mapping[str, Any]:
    """A row image: a dict, a partial image or a read-only mapping, of some columns in some order."""
    columns = draw(st.permutations(COLUMNS))[:draw(st.integers(1, len(COLUMNS)))]
    image = {column: draw(VALUES) for column in columns}
    kind = draw(st.sampled_from(["dict", "partial", "proxy"]))
    return image if kind == "dict" else PartialImage(image) if kind == "partial" else types.MappingProxyType(image)


@st.composite
def changes(draw: Any) -> Any:
    op = draw(st.sampled_from(list(Op)))
    if draw(st.integers(0, 9)) == 0:
        return DdlChange("sb", "t", "ALTER TABLE t ADD COLUMN x INT", AT)
    before = None if op in (Op.INSERT, Op.READ) else draw(images())
    after = None if op is Op.DELETE else draw(images())
    return RowChange(op, "sb", "t", ("id",), before, after, AT)


def batch_of(items: list[Any]) -> Batch:
    return Batch("p1", 1, 0, AT, AT, tuple(items))


@settings(max_examples=300, deadline=None)
@given(st.lists(changes(), max_size=12))
def test_the_compiled_scans_of_changes_give_what_python_gives(items):
    for kind in (InvalidDate, list, dict, int, bytes, type(None)):
        assert sql_rows._holds_type(items, RowChange, kind) is sql_rows._python_holds_type(items, RowChange, kind)
    assert sql_rows._only_reads(items, RowChange, Op.READ) is sql_rows._python_only_reads(items, RowChange, Op.READ)
    assert sql_rows.reads_only(batch_of(items)) is sql_rows._python_only_reads(items, RowChange, Op.READ)


@settings(max_examples=300, deadline=None)
@given(st.lists(images(), max_size=8), st.booleans())
def test_the_compiled_shape_and_type_scans_of_images_give_what_python_gives(found, same):
    if same and found:  # most batches: every image of one shape
        found = [dict(zip(tuple(found[0]), image.values())) for image in found if len(image) == len(found[0])]
    assert sql_rows.one_shape(found) == sql_rows._one_shape(found)
    rows = [tuple(image.values()) if n % 2 else list(image.values()) for n, image in enumerate(found)]
    kinds = frozenset({dict, list, set, frozenset})
    assert sql_rows.holds_one_of(rows, kinds) is sql_rows._python_holds_one_of(rows, kinds)


@settings(max_examples=200, deadline=None)
@given(st.lists(images(), max_size=10))
def test_grouping_by_columns_keeps_every_image_once_under_its_own_column_order(found):
    groups = sql_rows.group_by_columns(iter(found))
    assert sum(map(len, groups.values())) == len(found)
    for columns, members in groups.items():
        assert all(tuple(image) == columns for image in members)
        assert members == [image for image in found if tuple(image) == columns]  # in their order


def test_a_batch_holding_an_invalid_date_anywhere_is_found_and_one_without_is_not():
    clean = RowChange(Op.UPDATE, "sb", "t", ("id",), {"id": 1, "d": "2024-01-01"}, {"id": 1, "d": "2024-01-02"}, AT)
    before = RowChange(Op.UPDATE, "sb", "t", ("id",), {"id": 2, "d": InvalidDate("0000-00-00")},
                       {"id": 2, "d": None}, AT)
    ddl = DdlChange("sb", "t", "TRUNCATE TABLE t", AT)
    assert not sql_rows.holds_type(batch_of([clean, ddl, clean]), InvalidDate)
    assert sql_rows.holds_type(batch_of([clean, ddl, before]), InvalidDate)
    assert sql_rows.holds_type(batch_of([RowChange(Op.READ, "sb", "t", ("id",), None,
                                                   PartialImage({"id": 3, "d": InvalidDate("2024-00-15")}), AT)]),
                               InvalidDate)
    assert sql_rows.group_by_columns([]) == {}
    assert sql_rows.one_shape([{"a": 1, "b": 2}, {"b": 2, "a": 1}]) is None  # the same columns in another order
