"""Planning a target table from a source definition through a route (no server needed)."""

from __future__ import annotations

import pytest

from setl.config import ColumnsConfig, TableRule
from setl.errors import ExtractError
from setl.model import ColumnSchema, TableName, TableSchema
from setl.routing import RoutingPlan
from setl.schema.plan import target_table
from setl.transforms.stage import OutputColumn

SOURCE = TableSchema(TableName("s", "t"), (ColumnSchema("id", "int(11)", False), ColumnSchema("v", "varchar(5)"),
                                           ColumnSchema("x", "text")), ("id",))


def route(**options: object):
    plan = RoutingPlan.compile([TableRule(source=r"s\.t", target="d.u", **options)])  # type: ignore[arg-type]
    found = plan.route("s", "t")
    assert found is not None
    return found


def test_rename_and_exclude() -> None:
    """Kept columns in source order under their target names; the key renamed and NOT NULL."""
    table = target_table(route(columns=ColumnsConfig(exclude=("x",)), rename={"id": "key"}), SOURCE)
    assert table.table == TableName("d", "u") and table.names == ("key", "v") and table.primary_key == ("key",)
    assert [c.nullable for c in table.columns] == [False, True]
    assert table.columns[1].source == SOURCE.columns[1]


def test_chain_output_adds_and_renames() -> None:
    """A chain's output: carried columns keep the source definition (a key renamed by a step too),
    an added column gets its Spark type, a dropped one is gone."""
    output = [OutputColumn("ident", "int", "id"), OutputColumn("v", "string", "v"), OutputColumn("n", "bigint")]
    table = target_table(route(), SOURCE, output)
    assert table.names == ("ident", "v", "n") and table.primary_key == ("ident",)
    assert table.columns[0].source == SOURCE.columns[0] and table.columns[2].spark_type == "bigint"


def test_dropped_key_column_is_an_error() -> None:
    """A column rule that drops a key column cannot be planned (the rows could not be applied)."""
    with pytest.raises(ExtractError, match="primary-key column 'id'"):
        target_table(route(columns=ColumnsConfig(exclude=("id",))), SOURCE)
