"""The table-rule Extract with partial row images (binlog_row_image NOBLOB/MINIMAL): kept partial through
column mapping, refused (pausing, one line) where a transform or a filter would need the whole row."""

from __future__ import annotations

import pytest

from setl.config import ColumnsConfig, TableRule, TransformStep
from setl.errors import RefusedExtractError
from setl.model import Batch, Op, PartialImage, Position, RowChange
from setl.plugins import load_registry
from setl.routing import RoutingPlan
from setl.stages import TableExtract

AT = Position("mysql-bin.000002", 900)


def batch(*changes: RowChange) -> Batch:
    return Batch("p", 7, 1, Position("mysql-bin.000002", 0), AT, tuple(changes))


def partial_update(before: dict, after: dict) -> RowChange:
    return RowChange(Op.UPDATE, "shop", "orders", ("id",), PartialImage(before), PartialImage(after), AT)


def test_column_mapping_keeps_images_partial() -> None:
    """Include and rename reshape a partial image into a partial image of the target's names."""
    rule = TableRule(source=r"shop\.orders", target="replica.o", columns=ColumnsConfig(include=("id", "amount")),
                     rename={"amount": "eur"})
    out = TableExtract([rule]).extract(batch(partial_update({"id": 1}, {"amount": 5, "note": "x"})))
    (change,) = out.changes
    assert isinstance(change, RowChange) and change.partial
    assert dict(change.after or {}) == {"eur": 5} and type(change.after) is PartialImage


def test_a_rule_with_transforms_refuses_a_partial_change() -> None:
    """A partial change of a table whose rule has a transform pauses the pipeline with one line naming the fix."""
    rule = TableRule(source=r"shop\.orders", target="replica.orders",
                     transforms=(TransformStep("drop_columns", {"columns": ["note"]}),))
    plan = RoutingPlan.compile([rule], pipeline="p", registry=load_registry())
    with pytest.raises(RefusedExtractError) as caught:
        TableExtract(pipeline="p", plan=plan).extract(batch(partial_update({"id": 1}, {"amount": 5})))
    text = str(caught.value)
    assert not caught.value.retryable and "\n" not in text
    assert "pipeline=p stage=extract table=shop.orders" in text and f"position={AT}" in text
    assert "transforms, which need whole rows" in text and "SET GLOBAL binlog_row_image=FULL" in text


def test_a_filter_reading_an_absent_column_refuses_and_one_reading_present_columns_routes() -> None:
    """A filter over a column the partial image lacks refuses; one over present columns decides exactly."""
    on_amount = TableExtract([TableRule(source=r"shop\.orders", filter="amount > 1")], pipeline="p")
    with pytest.raises(RefusedExtractError) as caught:
        on_amount.extract(batch(partial_update({"id": 1}, {"amount": 5})))  # MINIMAL: the before-image lacks it
    assert "filter of rule tables[0] reads a column the image lacks" in str(caught.value)
    on_id = TableExtract([TableRule(source=r"shop\.orders", filter="id > 0")], pipeline="p")
    (change,) = on_id.extract(batch(partial_update({"id": 1, "amount": 2}, {"id": 1, "amount": 5}))).changes
    assert isinstance(change, RowChange) and change.partial and change.op is Op.UPDATE
