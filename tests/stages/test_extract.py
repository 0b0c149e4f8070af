"""The table-rule Extract: table selection, columns, names and row filters."""

from __future__ import annotations

import attrs
import pytest

from setl.config import ColumnsConfig, TableRule
from setl.errors import ExtractError
from setl.model import Batch, DdlChange, Op, Position
from setl.stages import TableExtract
from setl.testing.harness import delete, insert, read, update


def batch(*changes) -> Batch:
    return Batch("p", 7, 1, Position("log", 0), Position("log", 10), tuple(changes))


def test_first_matching_rule_wins_and_unmatched_or_excluded_tables_are_skipped():
    """Rules are tried in order; an excluded or unmatched table's changes are dropped."""
    extract = TableExtract([TableRule(source=r"shop\.audit", exclude=True), TableRule(source=r"shop\..*")])
    out = extract.extract(batch(insert("audit", {"id": 1}, schema="shop"), insert("orders", {"id": 1}, schema="shop"),
                                insert("orders", {"id": 2}, schema="other")))
    assert [(c.schema, c.table) for c in out.changes] == [("shop", "orders")]


def test_target_template_columns_and_rename_are_applied_to_both_images():
    """Target names come from the template; include and rename reshape before and after images."""
    rule = TableRule(source=r"shop\.orders", target="replica.o_{table}",
                     columns=ColumnsConfig(include=("id", "amount")), rename={"amount": "amount_eur"})
    out = TableExtract([rule]).extract(batch(update("orders", {"id": 1, "amount": 1, "secret": "x"},
                                                    {"id": 1, "amount": 2, "secret": "y"}, schema="shop")))
    change = out.changes[0]
    assert (change.schema, change.table) == ("replica", "o_orders")
    assert change.before == {"id": 1, "amount_eur": 1} and change.after == {"id": 1, "amount_eur": 2}


def test_dropping_a_primary_key_column_is_an_error_naming_the_table_and_batch():
    """Excluding a key column fails the batch with pipeline, table, batch and position named."""
    rule = TableRule(source=r".*", columns=ColumnsConfig(exclude=("id",)))
    with pytest.raises(ExtractError) as info:
        TableExtract([rule], pipeline="p").extract(batch(insert("orders", {"id": 1, "v": 2}, schema="shop")))
    text = str(info.value)
    assert "pipeline=p" in text and "table=shop.orders" in text and "batch=7" in text and "'id'" in text


@pytest.mark.parametrize(
    "before, after, expected",
    [
        ({"id": 1, "s": "ok"}, {"id": 1, "s": "ok2"}, Op.UPDATE),
        ({"id": 1, "s": "ok"}, {"id": 1, "s": "test"}, Op.DELETE),
        ({"id": 1, "s": "test"}, {"id": 1, "s": "ok"}, Op.INSERT),
        ({"id": 1, "s": "test"}, {"id": 1, "s": "test"}, None),
    ],
)
def test_an_update_crossing_the_filter_becomes_a_delete_or_an_insert(before, after, expected):
    """With a row filter, the target holds exactly the matching rows: updates across it change op."""
    extract = TableExtract([TableRule(source=r".*", filter="s != 'test'")])
    out = extract.extract(batch(update("t", before, after)))
    assert [c.op for c in out.changes] == ([expected] if expected else [])


def test_filter_applies_to_inserts_and_deletes():
    """Inserts and deletes of rows outside the filter are dropped; others kept."""
    extract = TableExtract([TableRule(source=r".*", filter="v > 1")])
    out = extract.extract(batch(insert("t", {"id": 1, "v": 1}), insert("t", {"id": 2, "v": 2}),
                                delete("t", {"id": 3, "v": 0}), delete("t", {"id": 4, "v": 5})))
    assert [(c.op, c.key) for c in out.changes] == [(Op.INSERT, (2,)), (Op.DELETE, (4,))]


def test_a_failing_filter_names_the_rule_and_the_error():
    """A filter that raises on a row is an ExtractError naming the rule, not a silent drop."""
    extract = TableExtract([TableRule(source=r".*", filter="v > 1")], pipeline="p")
    with pytest.raises(ExtractError, match=r"filter of rule tables\[0\] failed: NameError"):
        extract.extract(batch(insert("t", {"id": 1})))


DROP_RULES = [
    TableRule(source=r"shop\.orders", target="dw.purchases"),
    TableRule(source=r"shop\.tmp_.*", exclude=True),
    TableRule(source=r"shop\..*", target="{schema}_copy.{table}"),
]


@pytest.mark.parametrize("template", ["DROP TABLE {name}", "DROP TABLE IF EXISTS {name}"])
def test_drop_database_as_drop_tables_routes_each_like_a_plain_drop_table(template):
    """DROP DATABASE, delivered as one DROP TABLE DdlChange per table, is routed table by table exactly as
    a plain DROP TABLE of that table (renamed target, excluded table left out, dotted name kept whole)."""
    extract = TableExtract(DROP_RULES, pipeline="p")
    tables = ["orders", "tmp_1", "a.b", "back`tick"]
    # As the source expands DROP DATABASE shop: qualified, from any session database.
    expanded = [DdlChange("shop", t, template.format(name=f"`shop`.`{t.replace('`', '``')}`"), Position("log", 5))
                for t in tables]
    out = extract.extract(batch(*expanded)).changes
    # The same tables dropped one by one with plain DROP TABLE statements in `USE shop`.
    plain = [extract.extract(batch(DdlChange("shop", t, template.format(name=f"`{t.replace('`', '``')}`"),
                                             Position("log", 5)))).changes for t in tables]
    assert list(out) == [c for changes in plain for c in changes]
    if_exists = " IF EXISTS" if "IF EXISTS" in template else ""
    assert [(c.schema, c.table, c.statement) for c in out] == [
        ("dw", "purchases", f"DROP TABLE{if_exists} `dw`.`purchases`"),
        ("shop_copy", "a.b", f"DROP TABLE{if_exists} `shop_copy`.`a.b`"),
        ("shop_copy", "back`tick", f"DROP TABLE{if_exists} `shop_copy`.`back``tick`"),
    ]


def test_reads_are_routed_reshaped_and_filtered_like_inserts_and_stay_reads():
    """A snapshot read goes through routing, target names, column include/exclude, renames and the row
    filter as an insert does (a read the filter rejects is dropped), and comes out as a read."""
    rules = [TableRule(source=r"shop\.audit", exclude=True),
             TableRule(source=r"shop\.orders", target="replica.o_{table}", filter="amount > 1",
                       columns=ColumnsConfig(exclude=("secret",)), rename={"amount": "amount_eur"})]
    out = TableExtract(rules).extract(batch(
        read("audit", {"id": 9}, schema="shop"),
        read("orders", {"id": 1, "amount": 5, "secret": "x"}, schema="shop"),
        read("orders", {"id": 2, "amount": 1, "secret": "y"}, schema="shop"),
        insert("orders", {"id": 3, "amount": 7, "secret": "z"}, schema="shop"),
    ))
    assert [(c.op, c.schema, c.table, c.before, c.after, c.primary_key) for c in out.changes] == [
        (Op.READ, "replica", "o_orders", None, {"id": 1, "amount_eur": 5}, ("id",)),
        (Op.INSERT, "replica", "o_orders", None, {"id": 3, "amount_eur": 7}, ("id",)),
    ]
    assert all(c.source is not None and c.source.table == "orders" for c in out.changes)


@pytest.mark.parametrize("rule", [
    TableRule(source=r"shop\..*", target="replica.{table}"),
    TableRule(source=r"shop\..*", target="replica.{table}", columns=ColumnsConfig(exclude=("secret",)),
              rename={"amount": "amount_eur"}),
    TableRule(source=r"shop\..*", target="replica.{table}", columns=ColumnsConfig(include=("id", "amount"))),
    TableRule(source=r"shop\..*", target="replica.{table}", filter="amount > 1"),
], ids=["plain", "reshaped", "included", "filtered"])
def test_runs_of_reads_are_mapped_as_each_read_alone(rule):
    """Runs of snapshot reads (a chunk, mapped together) come out exactly as each read mapped on its
    own: same target, key, image, position and source, runs broken by another table, another key, an
    insert or an excluded table, in batch order."""
    rules = [TableRule(source=r"shop\.audit", exclude=True), rule]
    at = Position("log", 5)

    def row(i: int) -> dict:
        return {"id": i, "amount": i % 3, "secret": f"s{i}"}

    changes = [
        *(read("orders", row(i), schema="shop") for i in range(5)),
        read("audit", {"id": 1}, schema="shop"),
        *(read("items", row(i), schema="shop", key=("id", "amount")) for i in range(3)),
        read("orders", row(9), schema="shop", key=("amount", "id")),
        insert("orders", row(10), schema="shop"),
        *(read("orders", row(i), schema="shop") for i in range(11, 14)),
    ]
    changes = [attrs.evolve(c, position=at, commit_time=12.5) for c in changes]
    extract = TableExtract(rules)
    out = extract.extract(batch(*changes)).changes
    one_by_one = []
    for change in changes:
        route = extract.route(change.schema, change.table)
        mapped = extract._map(change, route) if route is not None else None
        if mapped is not None:
            one_by_one.append(mapped)
    assert out == tuple(one_by_one)
    assert [c.source for c in out] == [c.source for c in one_by_one]
    assert len(out) == (13 if rule.filter is None else 3)
    assert all(c.schema == "replica" and c.position == at and c.commit_time == 12.5 for c in out)


def test_a_run_of_reads_dropping_its_key_names_the_table_and_batch():
    """A chunk whose rule drops a key column fails like a single change: table, batch and position named."""
    extract = TableExtract([TableRule(source=r"shop\..*", columns=ColumnsConfig(exclude=("id",)))])
    with pytest.raises(ExtractError) as caught:
        extract.extract(batch(read("orders", {"id": 1, "v": 2}, schema="shop"),
                              read("orders", {"id": 2, "v": 3}, schema="shop")))
    assert caught.value.context["table"] == "shop.orders" and caught.value.context["batch"] == 7
    assert "primary-key column 'id'" in str(caught.value)
