"""End to end on a real local Spark: ScriptedSource -> Extract -> SparkTransform -> ParquetLoad.

The Parquet output is a change log; it is read back with plain pyarrow and replayed in
(_setl_log, _setl_offset, _setl_seq) order, then compared with `reference_state` plus the same transforms
applied in Python.
"""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from setl.config import BatchSettings, PipelineSettings, RetrySettings, TableRule, TransformStep
from setl.meta.base import Status
from setl.meta.sqlite import SqliteMetaStore
from setl.plugins import Registry, transform
from setl.scheduler import Outcome
from setl.sinks.parquet import ParquetLoad
from setl.testing.harness import (
    FaultPlan,
    FaultyTransform,
    InvariantListener,
    ScriptedSource,
    delete,
    insert,
    reference_state,
    run_pipeline,
    update,
)
from setl.transforms.stage import SparkTransform

ORDERS, CUSTOMERS = "demo.orders", "demo.customers"
POISON = 999_999  # an order id the failing step refuses
CHAIN = (
    TransformStep("rename", {"columns": {"id": "order_id", "name": "customer"}}),
    TransformStep("add_column", {"name": "total", "expr": "qty * price"}),
)


def script(n: int = 300, seed: int = 7, poison_at: int | None = None) -> list[list]:
    """`n` transactions over two tables: inserts, updates, deletes, re-inserts of deleted keys
    and several changes to one key inside one transaction (primary keys never change)."""
    rng = random.Random(seed)
    live: dict[str, dict[int, dict]] = {"orders": {}, "customers": {}}
    txs = []

    def order(key: int) -> dict:
        return {"id": key, "name": f"c{rng.randrange(50)}", "qty": rng.randrange(1, 9),
                "price": rng.randrange(100, 10_000), "note": rng.choice([None, "gift", "rush"])}

    def customer(key: int) -> dict:
        return {"id": key, "email": f"u{key}-{rng.randrange(1000)}@example.com"}

    make = {"orders": order, "customers": customer}
    for i in range(n):
        tx = []
        if i == poison_at:
            row = order(POISON)
            live["orders"][POISON] = row
            tx.append(insert("orders", row))
        for _ in range(rng.randrange(1, 4)):
            table = "orders" if rng.random() < 0.75 else "customers"
            rows = live[table]
            roll = rng.random()
            if not rows or roll < 0.45:
                key = rng.randrange(60)  # small key space: deleted keys come back
                if key in rows or key == POISON:
                    continue
                rows[key] = make[table](key)
                tx.append(insert(table, rows[key]))
            elif roll < 0.8:
                key = rng.choice(sorted(rows))
                after = dict(make[table](key))
                tx.append(update(table, rows[key], after))
                rows[key] = after
                if rng.random() < 0.3:  # a second change to the same key in the same transaction
                    again = dict(after, **({"qty": after["qty"] + 1} if table == "orders" else {"email": "x@y"}))
                    tx.append(update(table, after, again))
                    rows[key] = again
            else:
                key = rng.choice(sorted(rows))
                tx.append(delete(table, rows.pop(key)))
        if tx:
            txs.append(tx)
    return txs


def expected_orders(state: dict) -> dict:
    """The reference state of demo.orders with the chain applied in Python."""
    out = {}
    for row in state.get(ORDERS, {}).values():
        image = {"order_id": row["id"], "customer": row["name"], "qty": row["qty"], "price": row["price"],
                 "note": row["note"], "total": row["qty"] * row["price"]}
        out[(row["id"],)] = image
    return out


def replay(root: Path, table: str, key: tuple[str, ...]) -> dict:
    """Replay one table's Parquet change log in (_setl_log, _setl_offset, _setl_seq) order."""
    files = sorted((root / table).glob("part-*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    rows.sort(key=lambda r: (r["_setl_log"], r["_setl_offset"], r["_setl_seq"]))
    state: dict = {}
    for row in rows:
        image = {c: v for c, v in row.items() if not c.startswith("_setl_")}
        k = tuple(image[c] for c in key)
        if row["_setl_op"] == "delete":
            state.pop(k, None)
        else:
            state[k] = image
    return state


def spark_stage(spark, registry, *extra: TransformStep) -> SparkTransform:
    rules = [TableRule(source=r"demo\.orders", transforms=CHAIN + extra)]
    return SparkTransform.from_rules(rules, registry, pipeline="e2e", session=lambda: spark)


def settings(max_attempts: int = 5) -> PipelineSettings:
    return PipelineSettings(
        parallelism=3,
        batch=BatchSettings(max_rows=40, max_wait_ms=20),
        retry=RetrySettings(max_attempts=max_attempts, initial_backoff_ms=1, max_backoff_ms=2),
    )


def test_pipeline_through_spark_into_parquet_matches_reference(spark, registry, tmp_path):
    """A scripted CDC stream through rename + add_column on Spark replays from Parquet to the reference state."""
    txs = script()
    listener = InvariantListener(3)
    result = run_pipeline(ScriptedSource(txs), ParquetLoad(tmp_path, pipeline="e2e"), name="e2e",
                          transform=spark_stage(spark, registry), settings=settings(), listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == [] and listener.rollbacks == []
    assert len(listener.acks) > 3  # several batches, run in parallel
    state = reference_state(txs)
    assert replay(tmp_path, ORDERS, ("order_id",)) == expected_orders(state)
    # the table without transforms is written untouched
    customers = {k: dict(v) for k, v in state[CUSTOMERS].items()}
    assert replay(tmp_path, CUSTOMERS, ("id",)) == customers


def test_a_transform_failing_once_rolls_back_and_retries_to_the_right_state(spark, registry, tmp_path):
    """A transform raising once on batch 3 rolls back, replays, and the Parquet output is still exact."""
    txs = script(seed=11)
    listener = InvariantListener(3)
    stage = FaultyTransform(FaultPlan().fail("transform", batch=3, times=1), spark_stage(spark, registry))
    result = run_pipeline(ScriptedSource(txs), ParquetLoad(tmp_path, pipeline="e2e"), name="e2e",
                          transform=stage, settings=settings(), listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == []
    assert [batch for batch, _attempt in listener.rollbacks] == [3]
    assert replay(tmp_path, ORDERS, ("order_id",)) == expected_orders(reference_state(txs))


def test_a_step_failing_in_spark_every_time_pauses_naming_plugin_table_and_batch(spark, registry, tmp_path):
    """A plugin step that fails in Spark on every attempt pauses the pipeline with an error naming it."""
    txs = script(n=200, seed=3, poison_at=120)
    poison_end = 121  # transaction 120 ends at position offset 121
    guard = TransformStep("add_column",
                          {"name": "checked", "expr": f"assert_true(order_id <> {POISON}, 'poison order')"})
    meta = SqliteMetaStore(":memory:")
    listener = InvariantListener(3)
    result = run_pipeline(ScriptedSource(txs), ParquetLoad(tmp_path, pipeline="e2e"), name="e2e", meta=meta,
                          transform=spark_stage(spark, registry, guard), settings=settings(max_attempts=2),
                          listener=listener)
    assert result.outcome is Outcome.PAUSED
    state = meta.state("e2e")
    assert state.status is Status.PAUSED
    assert len(listener.rollbacks) == 2
    failed = {batch for batch, _attempt in listener.rollbacks}
    assert len(failed) == 1
    (batch_id,) = failed
    assert batch_id > 1  # earlier batches went through and were acked
    assert listener.acks and listener.acks[-1].batch_id == batch_id - 1
    assert listener.acks[-1].position.offset < poison_end
    error = state.error
    assert "stage=transform" in error and "table=demo.orders" in error
    assert f"batch={batch_id} " in error and "plugin=add_column" in error
    assert "step 3 (add_column) failed" in error and "poison order" in error
    assert str(result.scheduler.error) == error


def test_a_plugin_raising_once_rolls_back_and_retries_to_the_right_state(spark, registry, tmp_path):
    """A plugin that raises on its first call for batch 3 fails the batch through Termin; the rollback and
    retry run it again and the Parquet output is exact."""
    calls: dict[int, int] = {}
    lock = threading.Lock()

    @transform("flaky_once", params={})
    def flaky_once(df, params, context):
        with lock:
            calls[context.batch_id] = calls.get(context.batch_id, 0) + 1
            first = calls[context.batch_id] == 1
        if context.batch_id == 3 and first:
            raise ConnectionError("lookup service unavailable")
        return df

    flaky = Registry()
    flaky.register(flaky_once)
    steps = [registry.validate(step, index=i) for i, step in enumerate(CHAIN)]
    steps.append(flaky.validate(TransformStep("flaky_once"), index=len(steps)))
    stage = SparkTransform({ORDERS: steps}, pipeline="e2e", session=lambda: spark)
    txs = script(seed=19)
    listener = InvariantListener(3)
    result = run_pipeline(ScriptedSource(txs), ParquetLoad(tmp_path, pipeline="e2e"), name="e2e",
                          transform=stage, settings=settings(), listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == []
    assert [batch for batch, _attempt in listener.rollbacks] == [3] and calls[3] == 2
    assert replay(tmp_path, ORDERS, ("order_id",)) == expected_orders(reference_state(txs))


def test_a_step_dropping_the_primary_key_pauses_naming_plugin_table_and_batch(spark, registry, tmp_path):
    """A chain whose result lacks the primary key fails its first batch on every attempt; the pipeline pauses
    with an error that names the plugin, the table and the batch, and nothing is acked."""
    meta = SqliteMetaStore(":memory:")
    listener = InvariantListener(3)
    stage = spark_stage(spark, registry, TransformStep("drop_columns", {"columns": ["order_id"]}))
    result = run_pipeline(ScriptedSource(script(n=60)), ParquetLoad(tmp_path, pipeline="e2e"), name="e2e",
                          meta=meta, transform=stage, settings=settings(max_attempts=2), listener=listener)
    assert result.outcome is Outcome.PAUSED
    assert [batch for batch, _attempt in listener.rollbacks] == [1, 1] and listener.acks == []
    error = meta.state("e2e").error
    assert "stage=transform" in error and "table=demo.orders" in error and "batch=1 " in error
    assert "plugin=drop_columns" in error and "returned no primary-key column order_id" in error
    assert not list(tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize("bad", [
    TransformStep("filter", {"condition": "no_such_column > 1"}),
    TransformStep("add_column", {"name": "x", "expr": "no_such_function(order_id)"}),
    TransformStep("sql", {"query": "SELECT *, FROM batch"}),
])
def test_a_step_spark_sql_rejects_pauses_at_once_in_one_line(spark, registry, tmp_path, caplog, bad):
    """A filter/add_column/sql step Spark SQL rejects pauses at its first batch, not retried, in one short line."""
    meta = SqliteMetaStore(":memory:")
    listener = InvariantListener(3)
    with caplog.at_level(logging.INFO):
        result = run_pipeline(ScriptedSource(script(n=40, seed=5)), ParquetLoad(tmp_path, pipeline="e2e"),
                              name="e2e", meta=meta, transform=spark_stage(spark, registry, bad),
                              settings=settings(max_attempts=5), listener=listener)
    assert result.outcome is Outcome.PAUSED
    assert [attempt for _batch, attempt in listener.rollbacks] == [1]  # paused at the first failure
    error = meta.state("e2e").error
    assert "\n" not in error and len(error) < 1000, error
    assert "pipeline=e2e" in error and "stage=transform" in error and "table=demo.orders" in error
    assert f"plugin={bad.use}" in error and f"step 3 ({bad.use}) cannot run on the table's columns" in error
    assert "Exception" in error and "org.apache" not in error
    assert "org.apache.spark" not in caplog.text and len(caplog.text) < 20_000
