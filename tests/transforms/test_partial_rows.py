"""The Spark Transform stage refuses a partial row image (binlog_row_image NOBLOB/MINIMAL) of a table with
transforms before any Spark work: Spark sees whole rows only."""

from __future__ import annotations

import pytest

from setl.config import TransformStep
from setl.model import Batch, Op, PartialImage, Position, RowChange
from setl.plugins import load_registry
from setl.transforms.stage import PartialRowRefused, SparkTransform

AT = Position("mysql-bin.000003", 120)


def no_spark() -> None:
    raise AssertionError("no Spark session may be started for a refused batch")


def test_a_partial_change_of_a_transformed_table_pauses_without_spark() -> None:
    """A partial update of a table with a transform chain is refused in one non-retryable line naming the fix."""
    step = load_registry().validate(TransformStep("drop_columns", {"columns": ["note"]}), index=0)
    stage = SparkTransform({"shop.orders": [step]}, pipeline="p1", session=no_spark)
    change = RowChange(Op.UPDATE, "shop", "orders", ("id",), PartialImage(id=1), PartialImage(amount=2), AT)
    with pytest.raises(PartialRowRefused) as caught:
        stage.transform(Batch("p1", 3, 1, Position("mysql-bin.000003", 4), AT, (change,)))
    text = str(caught.value)
    assert not caught.value.retryable and "\n" not in text
    assert "pipeline=p1 stage=transform table=shop.orders" in text and f"position={AT}" in text
    assert "transforms, which need whole rows" in text and "SET GLOBAL binlog_row_image=FULL" in text
