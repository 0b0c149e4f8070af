"""The Spark Transform stage: Arrow round trip, chains, deletes, keys, errors, and skipping Spark."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import subprocess
import sys
import threading

import pytest

from setl.config import NodeSettings, PipelineConfig, SparkConfig, TableRule, TransformStep, load_pipeline
from setl.connectors import registry
from setl.errors import PluginError, TransformError
from setl.model import Batch, DdlChange, Op, Position, RowChange, TableName
from setl.plugins import Param, Registry, transform
from setl.stages.extract import TableExtract
from setl.stages.transform import Transform
from setl.testing.spark import make_batch
from setl.transforms.stage import SparkTransform, StepAnalysisError, build_transform
from setl.values import Geometry

#: POINT(1.5 -2.25) with SRID 4326, as MariaDB stores it
POINT = Geometry(bytes.fromhex("e6100000") + bytes.fromhex("0101000000000000000000f83f00000000000002c0"))


def steps(registry, *specs):
    return [registry.validate(TransformStep(use, params), index=i) for i, (use, params) in enumerate(specs)]


def stage_for(spark, registry, table, *specs):
    return SparkTransform({table: steps(registry, *specs)}, pipeline="p1", session=lambda: spark)


def test_types_survive_the_round_trip(spark, registry):
    """Decimals, microsecond datetimes, dates, bytes, JSON, big ints, sets, spatial values and NULLs come back
    unchanged."""
    rows = [
        {
            "id": 1,
            "price": decimal.Decimal("12345678.123456789012345678901234567890"),
            "huge": decimal.Decimal("1" * 40 + "." + "5" * 30),
            "at": dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
            "on": dt.date(1999, 12, 31),
            "blob": b"\x00\x01\xfe\xff",
            "doc": {"a": [1, 2, {"b": None}], "c": "ü"},
            "tags": frozenset({"x", "y"}),  # SET values are frozensets (a key may hold one)
            "unsigned": 18446744073709551615,
            "ratio": 0.25,
            "flag": True,
            "took": dt.timedelta(hours=-3, microseconds=7),
            "alarm": dt.time(7, 30, 0, 123),
            "shape": POINT,
            "nothing": None,
        },
        {
            "id": 2, "price": None, "huge": None, "at": None, "on": None, "blob": None, "doc": [1, "two"],
            "tags": frozenset(), "unsigned": None, "ratio": None, "flag": None, "took": None, "alarm": None,
            "shape": None, "nothing": None,
        },
    ]
    batch = make_batch("demo.t", rows, primary_key=["id"])
    stage = SparkTransform({"demo.t": [swap_registry().validate(TransformStep("swap"))]}, pipeline="p1",
                           session=lambda: spark)
    out = stage.transform(batch)
    images = [dict(c.after) for c in out.changes]
    # Each row now holds the other's values: every column that differs was converted back from Arrow.
    for original, image in zip(reversed(rows), images):
        image["id"] = original["id"]
        assert image == original
        assert {k: type(v) for k, v in image.items()} == {k: type(v) for k, v in original.items()}
    assert images[1]["price"].as_tuple().exponent == -30


def swap_registry() -> Registry:
    """A registry with `swap`: two rows trade the values of every column but ``id``."""
    @transform("swap", params={})
    def swap(df, params, context):
        from pyspark.sql import functions as F

        data = [c for c in df.columns if c != "id" and not c.startswith("_setl_")]
        other = df.select(F.col("id").alias("other_id"), *[F.col(c).alias(f"other_{c}") for c in data])
        joined = df.join(other, F.col("id") != F.col("other_id"))
        return joined.select(*[F.col(f"other_{c}").alias(c) if c in data else F.col(c) for c in df.columns])

    registry = Registry()
    registry.register(swap, "test")
    return registry


def test_columns_a_chain_leaves_alone_keep_the_changes_own_values(spark, registry):
    """Unchanged columns are not converted back from Arrow: they keep the very objects the changes held."""
    price, at = decimal.Decimal("12.50"), dt.datetime(2024, 1, 2, 3, 4, 5, 6)
    batch = make_batch("demo.t", [({"id": 1, "price": price, "at": at, "qty": 2},
                                   {"id": 1, "price": price, "at": at, "qty": 3})],
                       primary_key=["id"], op="update")
    stage = stage_for(spark, registry, "demo.t",
                      ("add_column", {"name": "total", "expr": "qty * price"}),
                      ("add_column", {"name": "qty", "expr": "qty + 10"}))
    (change,) = stage.transform(batch).changes
    assert change.before == {"id": 1, "price": price, "at": at, "qty": 12, "total": decimal.Decimal("25.00")}
    assert change.after == {"id": 1, "price": price, "at": at, "qty": 13, "total": decimal.Decimal("37.50")}
    assert change.after["price"] is price and change.after["at"] is at
    assert change.after is not batch.changes[0].after  # a new dict: the change's own image is never mutated
    assert list(change.after) == ["id", "price", "at", "qty", "total"]


def test_rows_keep_their_own_columns_when_a_batch_holds_two_table_shapes(spark, registry):
    """Rows from before and after an ADD COLUMN in one batch keep their own keys through a chain."""
    rows = [{"id": 1, "name": "a"}, {"id": 2, "name": "b", "added": 7}]
    stage = stage_for(spark, registry, "demo.t", ("add_column", {"name": "up", "expr": "upper(name)"}))
    out = stage.transform(make_batch("demo.t", rows, primary_key=["id"]))
    assert [c.after for c in out.changes] == [{"id": 1, "name": "a", "up": "A"},
                                              {"id": 2, "name": "b", "added": 7, "up": "B"}]


def test_unchanged_columns_follow_their_rows_through_filters_and_reorders(spark, registry):
    """With rows filtered out and the rest reordered and renamed, each row's values still come from its own change."""
    rows = [{"id": n, "name": f"n{n}", "at": dt.datetime(2024, 1, 1, 0, 0, n)} for n in range(6)]

    @transform("reverse", params={})
    def reverse(df, params, context):
        return df.orderBy(df["_setl_seq"].desc())

    reg = Registry()
    reg.register(reverse, "test")
    chain = steps(registry, ("filter", {"condition": "id % 2 = 0"}), ("rename", {"columns": {"name": "label"}}))
    stage = SparkTransform({"demo.t": [*chain, reg.validate(TransformStep("reverse"), index=2)]}, pipeline="p1",
                           session=lambda: spark)
    out = stage.transform(make_batch("demo.t", rows, primary_key=["id"]))
    assert [c.after for c in out.changes] == [{"id": n, "label": f"n{n}", "at": rows[n]["at"]} for n in (0, 2, 4)]
    assert all(c.after["at"] is rows[c.after["id"]]["at"] for c in out.changes)


def test_naive_datetimes_stay_wall_clock_whatever_the_session_zone(spark, registry):
    """A naive DATETIME keeps its wall-clock value and SQL sees the same hour."""
    batch = make_batch("demo.t", [{"id": 1, "at": dt.datetime(2024, 6, 1, 3, 4, 5, 6)}], primary_key=["id"])
    stage = stage_for(spark, registry, "demo.t", ("add_column", {"name": "h", "expr": "hour(at)"}))
    (change,) = stage.transform(batch).changes
    assert change.after == {"id": 1, "at": dt.datetime(2024, 6, 1, 3, 4, 5, 6), "h": 3}


def test_tables_without_transforms_never_touch_spark(registry):
    """A batch with no table that has transforms is returned as is, and no session is asked for."""
    def no_spark():
        raise AssertionError("Spark was asked for")

    stage = SparkTransform({"demo.other": steps(registry, ("rename", {"columns": {"a": "b"}}))},
                           session=no_spark)
    batch = make_batch("demo.t", [{"id": 1}], primary_key=["id"])
    assert stage.transform(batch) is batch


def test_pipeline_without_transforms_builds_no_spark_stage(tmp_path):
    """build_transform gives the identity stage when no rule has transforms."""
    config = PipelineConfig(name="p", source=None, target=None, tables=(TableRule(source=".*"),))  # type: ignore[arg-type]
    stage = build_transform(NodeSettings(), config)
    assert type(stage) is Transform


def test_only_tables_with_transforms_are_rewritten(spark, registry):
    """Changes to other tables and DDL keep their place and identity; the batch keeps its ids."""
    t1 = make_batch("demo.a", [{"id": 1, "v": "x"}], primary_key=["id"]).changes[0]
    t2 = make_batch("demo.b", [{"id": 1, "v": "y"}], primary_key=["id"]).changes[0]
    t3 = make_batch("demo.a", [{"id": 2, "v": "z"}], primary_key=["id"]).changes[0]
    batch = Batch("p1", 4, 2, Position("f", 0), Position("f", 3), (t1, t2, t3))
    stage = stage_for(spark, registry, "demo.a", ("add_column", {"name": "u", "expr": "upper(v)"}))
    out = stage.transform(batch)
    assert (out.id, out.epoch, out.start, out.end) == (4, 2, Position("f", 0), Position("f", 3))
    assert out.changes[1] is t2
    assert [c.after.get("u") for c in out.changes] == ["X", None, "Z"]
    assert [c.position for c in out.changes] == [t1.position, t2.position, t3.position]


def test_order_of_changes_is_kept_across_a_join(spark, registry, tmp_path):
    """Changes come back in batch order even when Spark reorders rows (a join)."""
    dim = tmp_path / "d.csv"
    dim.write_text("k,label\n" + "".join(f"{i},L{i}\n" for i in range(50)))
    rows = [{"id": i, "k": (i * 7) % 50} for i in range(200)]
    batch = make_batch("demo.t", rows, primary_key=["id"])
    stage = stage_for(spark, registry, "demo.t", ("lookup", {"path": str(dim), "on": ["k"]}))
    out = stage.transform(batch)
    assert [c.after["id"] for c in out.changes] == list(range(200))
    assert all(c.after["label"] == f"L{c.after['k']}" for c in out.changes)


def test_deletes_survive_a_filter(spark, registry):
    """A filter keeps delete rows even when their image fails the condition."""
    batch = make_batch("demo.t", [{"id": 1, "amount": 5}, {"id": 2, "amount": 50}, {"id": 3, "amount": 1}],
                       primary_key=["id"], op=["insert", "insert", "delete"])
    stage = stage_for(spark, registry, "demo.t", ("filter", {"condition": "amount > 10"}))
    out = stage.transform(batch)
    assert [(c.op, c.key) for c in out.changes] == [(Op.INSERT, (2,)), (Op.DELETE, (3,))]


def test_filter_may_drop_deletes_when_declared(spark, registry):
    """A filter step declared may_drop_deletes applies its condition to deletes too."""
    batch = make_batch("demo.t", [{"id": 1, "amount": 5}], primary_key=["id"], op="delete")
    stage = stage_for(spark, registry, "demo.t",
                      ("filter", {"condition": "amount > 10", "may_drop_deletes": True}))
    assert stage.transform(batch).changes == ()


def test_updates_crossing_a_filter_become_inserts_or_deletes(spark, registry):
    """An update leaving the filtered set becomes a delete, one entering it an insert."""
    rows = [
        ({"id": 1, "amount": 50}, {"id": 1, "amount": 60}),  # stays in: update
        ({"id": 2, "amount": 50}, {"id": 2, "amount": 1}),  # leaves: delete
        ({"id": 3, "amount": 1}, {"id": 3, "amount": 50}),  # enters: insert
        ({"id": 4, "amount": 1}, {"id": 4, "amount": 2}),  # never in: dropped
    ]
    batch = make_batch("demo.t", rows, primary_key=["id"], op="update")
    stage = stage_for(spark, registry, "demo.t", ("filter", {"condition": "amount > 10"}))
    out = stage.transform(batch)
    assert [(c.op, c.key) for c in out.changes] == [(Op.UPDATE, (1,)), (Op.DELETE, (2,)), (Op.INSERT, (3,))]
    assert out.changes[0].before == {"id": 1, "amount": 50}
    assert out.changes[1].before == {"id": 2, "amount": 50}


def test_a_transform_that_drops_deletes_fails_the_batch(spark, registry):
    """A step that silently removes deletes fails the batch instead of losing them."""
    batch = make_batch("demo.t", [{"id": 1}, {"id": 2}], primary_key=["id"], op=["insert", "delete"])
    stage = stage_for(spark, registry, "demo.t", ("sql", {"query": "SELECT * FROM batch WHERE _setl_op = 'insert'"}))
    with pytest.raises(TransformError, match="removed 1 delete"):
        stage.transform(batch)


def test_renamed_primary_key_is_followed(spark, registry):
    """A rename of key columns gives changes whose primary_key and before images use the new names."""
    batch = make_batch("demo.t", [({"id": 1, "v": "a"}, {"id": 2, "v": "b"})], primary_key=["id"], op="update")
    stage = stage_for(spark, registry, "demo.t", ("rename", {"columns": {"id": "key"}}),
                      ("hash", {"columns": ["v"]}))
    (change,) = stage.transform(batch).changes
    assert change.primary_key == ("key",)
    assert change.old_key == (1,) and change.key == (2,)


def test_dropping_a_primary_key_column_names_the_step(spark, registry):
    """A step whose result lacks a key column raises TransformError naming plugin, table and batch."""
    batch = make_batch("demo.t", [{"id": 1, "v": "a"}], primary_key=["id"], batch_id=42)
    stage = stage_for(spark, registry, "demo.t", ("drop_columns", {"columns": ["id"]}))
    with pytest.raises(TransformError) as info:
        stage.transform(batch)
    ctx = info.value.context
    assert (ctx["plugin"], ctx["table"], ctx["batch"], ctx["pipeline"]) == ("drop_columns", "demo.t", 42, "p1")
    assert "primary-key column id" in str(info.value)


def test_a_raising_plugin_becomes_a_transform_error(spark):
    """A transform that raises fails the batch with a TransformError naming plugin, table and batch."""
    @transform("explode_now", params={})
    def explode_now(df, params, context):
        raise RuntimeError("kaboom")

    registry = Registry()
    registry.register(explode_now, "test")
    stage = SparkTransform({"demo.t": [registry.validate(TransformStep("explode_now"))]}, pipeline="p1",
                           session=lambda: spark)
    with pytest.raises(TransformError, match="kaboom") as info:
        stage.transform(make_batch("demo.t", [{"id": 1}], primary_key=["id"], batch_id=9))
    assert str(info.value).startswith("pipeline=p1 stage=transform table=demo.t batch=9 plugin=explode_now")


def test_a_failure_at_collect_time_is_traced_to_its_step(spark, registry):
    """A runtime error surfacing only when Spark computes the result still names the failing step."""
    batch = make_batch("demo.t", [{"id": 1, "v": "not a number"}], primary_key=["id"])
    stage = stage_for(spark, registry, "demo.t",
                      ("add_column", {"name": "w", "expr": "v"}),
                      ("add_column", {"name": "n", "expr": "assert_true(id < 0, 'bad id')"}),
                      ("rename", {"columns": {"w": "z"}}))
    with pytest.raises(TransformError, match="bad id") as info:
        stage.transform(batch)
    assert info.value.context["plugin"] == "add_column"
    assert "step 2" in str(info.value)


def test_a_non_dataframe_result_is_an_error(spark):
    """A transform returning something that is not a DataFrame fails the batch clearly."""
    @transform("returns_none", params={})
    def returns_none(df, params, context):
        return None

    registry = Registry()
    registry.register(returns_none)
    stage = SparkTransform({"demo.t": [registry.validate(TransformStep("returns_none"))]}, session=lambda: spark)
    with pytest.raises(TransformError, match="returns_none"):
        stage.transform(make_batch("demo.t", [{"id": 1}], primary_key=["id"]))


def test_context_describes_where_the_transform_runs(spark):
    """The context carries pipeline, tables, batch id, epoch, params and the session."""
    seen = []

    @transform("spy", params={"x": Param(int, default=3)})
    def spy(df, params, context):
        seen.append(context)
        return df

    registry = Registry()
    registry.register(spy)
    rules = [TableRule(source=r"shop\.orders", target="dw.{table}", transforms=(TransformStep("spy"),))]
    stage = SparkTransform.from_rules(rules, registry, pipeline="p1", session=lambda: spark)
    batch = make_batch("shop.orders", [{"id": 1}], primary_key=["id"], batch_id=5, epoch=2)
    stage.transform(TableExtract(pipeline="p1", plan=stage.routing).extract(batch))
    (ctx,) = seen
    assert (ctx.pipeline, ctx.source_table, ctx.target_table, ctx.batch_id, ctx.epoch) == (
        "p1", "shop.orders", "dw.orders", 5, 2)
    assert ctx.params == {"x": 3} and ctx.spark is spark
    with pytest.raises(AttributeError):
        ctx.batch_id = 6  # type: ignore[misc]


def test_rules_resolve_source_tables_first_match_wins(registry):
    """from_rules gives each source table the chain of the first rule matching it; excluded tables none."""
    rules = [
        TableRule(source=r"shop\.tmp_.*", exclude=True),
        TableRule(source=r"shop\.audit", target="{schema}.{table}"),
        TableRule(source=r"shop\..*", target="{schema}.{table}",
                  transforms=(TransformStep("rename", {"columns": {"a": "b"}}),)),
        TableRule(source=r"crm\.people", target="dw.persons", transforms=(TransformStep("hash", {"columns": ["a"]}),)),
    ]
    stage = SparkTransform.from_rules(rules, registry, session=lambda: None)
    assert stage.plan_for_source(TableName("shop", "orders")).names == "rename"
    assert stage.plan_for_source(TableName("shop", "orders")).source == "shop.orders"
    assert stage.plan_for_source(TableName("shop", "audit")) is None
    assert stage.plan_for_source(TableName("shop", "tmp_x")) is None
    assert stage.plan_for_source(TableName("crm", "people")).names == "hash"
    assert stage.plan_for_source(TableName("crm", "people")).target == "dw.persons"
    assert stage.plan_for("dw.persons") is None  # no chain is found by inverting a target name


def test_build_transform_validates_steps_at_startup(tmp_path):
    """A pipeline file with a bad step fails build_transform with the file, key path, plugin and param."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "p1.yaml").write_text(
        "source: {type: file, path: x.jsonl}\n"
        "target: {type: parquet, path: out}\n"
        "tables:\n"
        "  - source: 'demo\\..*'\n"
        "    transforms:\n"
        "      - {use: cast, columns: {a: int}}\n"
        "      - {use: mask, columns: [a], keep_last: many}\n"
    )
    config = load_pipeline(tmp_path, "p1", registry())
    with pytest.raises(PluginError) as info:
        build_transform(NodeSettings(conf_dir=str(tmp_path)), config)
    text = str(info.value)
    assert "pipeline=p1" in text and "key=tables[0].transforms[1]" in text
    assert "plugin=mask" in text and "param=keep_last" in text


def test_build_transform_uses_node_spark_settings_lazily(tmp_path):
    """build_transform returns a SparkTransform without starting Spark."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "p1.yaml").write_text(
        "source: {type: file, path: x.jsonl}\n"
        "target: {type: parquet, path: out}\n"
        "tables:\n"
        "  - {source: 'demo\\..*', transforms: [{use: filter, condition: 'id > 1'}]}\n"
    )
    node = NodeSettings(conf_dir=str(tmp_path), spark=SparkConfig(master="local[1]"))
    stage = build_transform(node, load_pipeline(tmp_path, "p1", registry()))
    assert isinstance(stage, SparkTransform)
    assert stage.plan_for_source(TableName("demo", "x")).names == "filter"


def test_ddl_changes_pass_through(spark, registry):
    """A DDL change in a batch passes through untouched."""
    ddl = DdlChange("demo", "t", "ALTER TABLE t ADD c INT", Position("f", 1))
    batch = Batch("p1", 1, 1, Position("f", 0), Position("f", 1), (ddl,))
    stage = stage_for(spark, registry, "demo.t", ("rename", {"columns": {"a": "b"}}))
    assert stage.transform(batch).changes == (ddl,)


def test_concurrent_batches_do_not_mix(spark, registry):
    """Batches transformed on several threads at once each get their own rows back."""
    stage = stage_for(spark, registry, "demo.t",
                      ("add_column", {"name": "tag", "expr": "concat('b', cast(id as string))"}),
                      ("sql", {"query": "SELECT * FROM batch WHERE id >= 0"}))
    outs, errors = {}, []

    def work(n):
        try:
            batch = make_batch("demo.t", [{"id": n * 10 + i} for i in range(4)], primary_key=["id"], batch_id=n)
            outs[n] = [c.after["tag"] for c in stage.transform(batch).changes]
        except Exception as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,), name=f"transform-{n}") for n in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert outs == {n: [f"b{n * 10 + i}" for i in range(4)] for n in range(1, 4)}


def test_tables_without_key_are_transformed(spark, registry):
    """Rows of a table without a primary key go through the chain as well."""
    batch = make_batch("demo.log", [{"msg": "a"}, {"msg": "b"}])
    stage = stage_for(spark, registry, "demo.log", ("add_column", {"name": "n", "expr": "length(msg)"}))
    out = stage.transform(batch)
    assert [dict(c.after) for c in out.changes] == [{"msg": "a", "n": 1}, {"msg": "b", "n": 1}]
    assert all(isinstance(c, RowChange) and c.primary_key == () for c in out.changes)


def spy_stage(spark, seen):
    """A stage whose one step returns its frame untouched and records the frame's Spark schema."""
    @transform("identity_spy", params={})
    def identity_spy(df, params, context):
        seen.append({f.name: f.dataType.simpleString() for f in df.schema.fields})
        return df

    registry = Registry()
    registry.register(identity_spy)
    return SparkTransform({"demo.t": [registry.validate(TransformStep("identity_spy"))]}, pipeline="p1",
                          session=lambda: spark)


def test_an_identity_transform_returns_every_type_unchanged_and_spark_sees_sql_types(spark):
    """Decimals, microsecond datetimes, binary, JSON, unsigned BIGINT max, spatial values and NULLs pass an
    identity step unchanged, and Spark sees them as DECIMAL, TIMESTAMP_NTZ, BINARY, STRING, DECIMAL(20,0)
    and BINARY (the server's bytes)."""
    rows = [
        {"id": 1, "price": decimal.Decimal("-12.345"), "at": dt.datetime(1999, 12, 31, 23, 59, 59, 1),
         "blob": b"\x00\xff\x00", "doc": {"k": ["v", 1, None]}, "unsigned": 2**64 - 1, "shape": POINT,
         "nothing": None},
        {"id": 2, "price": None, "at": None, "blob": None, "doc": None, "unsigned": 0, "shape": None,
         "nothing": None},
    ]
    seen: list[dict] = []
    out = spy_stage(spark, seen).transform(make_batch("demo.t", rows, primary_key=["id"], op=["insert", "delete"]))
    assert [c.op for c in out.changes] == [Op.INSERT, Op.DELETE]
    assert [dict(c.image) for c in out.changes] == rows
    assert [{k: type(v) for k, v in c.image.items()} for c in out.changes] == [
        {k: type(v) for k, v in r.items()} for r in rows]
    (types,) = seen
    assert {k: types[k] for k in rows[0]} == {
        "id": "bigint", "price": "decimal(5,3)", "at": "timestamp_ntz", "blob": "binary", "doc": "string",
        "unsigned": "decimal(20,0)", "shape": "binary", "nothing": "void"}


def test_column_types_are_remembered_per_table_and_derived_again_when_values_do_not_fit(spark):
    """A later batch reuses a table's column types (an all-NULL column keeps its type) and a value that
    does not fit (wider decimal, BIGINT overflow, an aware datetime) makes the column's type be derived again."""
    seen: list[dict] = []
    stage = spy_stage(spark, seen)
    first = [{"id": 1, "amount": decimal.Decimal("1.25"), "name": "a", "at": dt.datetime(2024, 1, 1, 0, 0, 0, 5)}]
    second = [{"id": 2**63, "amount": decimal.Decimal("123456.125"), "name": None,
               "at": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)}]
    third = [{"id": 3, "amount": decimal.Decimal("2.5"), "name": "c", "at": None}]
    outs = [[dict(c.after) for c in stage.transform(make_batch("demo.t", rows, primary_key=["id"])).changes]
            for rows in (first, second, third)]
    assert outs == [first, second, third]
    assert outs[2][0]["id"] == 3 and type(outs[2][0]["id"]) is int
    assert [(t["id"], t["amount"], t["name"], t["at"]) for t in seen] == [
        ("bigint", "decimal(3,2)", "string", "timestamp_ntz"),
        ("decimal(19,0)", "decimal(9,3)", "string", "timestamp"),
        ("decimal(19,0)", "decimal(9,3)", "string", "timestamp"),
    ]


def test_setl_start_without_java_is_one_clear_line_before_anything_runs(tmp_path):
    """A pipeline with transforms on a machine without Java exits 2 at startup, naming pipeline and stage."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "x.jsonl").write_text("")
    (tmp_path / "pipelines" / "p1.yaml").write_text(
        "source: {type: file, path: x.jsonl}\n"
        "target: {type: parquet, path: out}\n"
        "tables:\n"
        "  - {source: 'demo\\..*', transforms: [{use: filter, condition: 'id > 1'}]}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path / "empty")
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(tmp_path), "start", "--pipeline", "p1",
                             "--until-caught-up"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("setl: error:") and "pipeline=p1" in line and "stage=transform" in line
    assert "Spark needs Java" in line
    assert not (tmp_path / "out").exists()  # nothing was written


def test_fan_in_rows_keep_their_own_rules_chain(spark, registry):
    """Two rules routing a.* and b.* into the same target schema: only a's rows get a's mask (issue 14.3)."""
    rules = [
        TableRule(source=r"a\..*", target="dw.{table}",
                  transforms=(TransformStep("mask", {"columns": ["card"], "keep_last": 2}),)),
        TableRule(source=r"b\..*", target="dw.{table}"),
    ]
    stage = SparkTransform.from_rules(rules, registry, pipeline="p1", session=lambda: spark)
    extract = TableExtract(pipeline="p1", plan=stage.routing)
    a_rows = make_batch("t", [{"id": 1, "card": "123456"}], primary_key=["id"], schema="a").changes
    b_rows = make_batch("t", [{"id": 2, "card": "654321"}], primary_key=["id"], schema="b").changes
    b_other = make_batch("u", [{"id": 3, "card": "777777"}], primary_key=["id"], schema="b").changes
    source = make_batch("t", [], schema="a").replace(a_rows + b_rows + b_other + a_rows)
    out = stage.transform(extract.extract(source))
    got = [(c.schema, c.table, c.source.schema, c.after["card"]) for c in out.changes]
    assert got == [("dw", "t", "a", "****56"), ("dw", "t", "b", "654321"), ("dw", "u", "b", "777777"),
                   ("dw", "t", "a", "****56")]


def test_a_step_spark_rejects_is_a_permanent_one_line_error(spark, registry):
    """A filter naming an unknown column raises StepAnalysisError: not retryable, one line, Spark's message."""
    stage = stage_for(spark, registry, "demo.t", ("filter", {"condition": "nope = 1"}))
    with pytest.raises(StepAnalysisError) as info:
        stage.transform(make_batch("demo.t", [{"id": 1}], primary_key=["id"], batch_id=4))
    error = info.value
    assert error.retryable is False and isinstance(error, TransformError)
    assert (error.context["pipeline"], error.context["table"], error.context["plugin"]) == ("p1", "demo.t", "filter")
    assert "\n" not in str(error) and "nope" in str(error) and "step 1 (filter)" in str(error)


def test_snapshot_reads_come_back_as_reads(spark, registry):
    """Snapshot reads go through a chain as rows with ``_setl_op = 'read'`` and come back as reads,
    in batch order among inserts, updates and deletes: through a column step (rows in order), and
    through a filter that drops one read (rows matched by seq)."""
    rows = [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, ({"id": 3, "v": "c"}, {"id": 3, "v": "d"}),
            {"id": 4, "v": "e"}, {"id": 5, "v": "skip"}, {"id": 6, "v": "f"}]
    batch = make_batch("demo.t", rows, primary_key=["id"], op=["read", "insert", "update", "delete", "read", "read"])
    ops = stage_for(spark, registry, "demo.t", ("add_column", {"name": "op", "expr": "_setl_op"}),
                    ("add_column", {"name": "u", "expr": "upper(v)"})).transform(batch)
    assert [(c.op, c.key, c.before is None, c.after and c.after["op"]) for c in ops.changes] == [
        (Op.READ, (1,), True, "read"), (Op.INSERT, (2,), True, "insert"), (Op.UPDATE, (3,), False, "update"),
        (Op.DELETE, (4,), False, None), (Op.READ, (5,), True, "read"), (Op.READ, (6,), True, "read")]
    assert [c.after["u"] for c in ops.changes if c.op is Op.READ] == ["A", "SKIP", "F"]
    assert [c.position for c in ops.changes] == [c.position for c in batch.changes]
    filtered = stage_for(spark, registry, "demo.t", ("filter", {"condition": "v <> 'skip'"})).transform(batch)
    assert [(c.op, c.key) for c in filtered.changes] == [
        (Op.READ, (1,)), (Op.INSERT, (2,)), (Op.UPDATE, (3,)), (Op.DELETE, (4,)), (Op.READ, (6,))]
    assert filtered.changes[0].after == {"id": 1, "v": "a"} and filtered.changes[4].before is None
