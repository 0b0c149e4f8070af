"""Snapshot reads through the whole pipeline on real servers: a scripted source emits snapshot
chunks (`Op.READ`) of a keyed and a keyless table, binlog changes after them, a chunk copied again
and a re-read of changed rows; the scheduler runs Extract (renames, column excludes, a row filter),
a Spark transform chain and Load into MariaDB or PostgreSQL, and the target ends as the reference
(reads replace rows, deletes after reads remove them, a replayed chunk changes nothing)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from setl.config import BatchSettings, ColumnsConfig, PipelineSettings, RetrySettings, TableRule, TransformStep
from setl.model import Op, RowChange
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.stages import TableExtract
from setl.testing.harness import InvariantListener, ScriptedSource, delete, insert, read, run_pipeline, update
from setl.transforms.stage import SparkTransform

pytestmark = pytest.mark.timeout(300)

ORDERS_DDL = ("CREATE TABLE {t} (id INT PRIMARY KEY, customer VARCHAR(32) NOT NULL, qty INT NOT NULL,"
              " price INT NOT NULL, total BIGINT, tag VARCHAR(8))")
NOTES_DDL = "CREATE TABLE {t} (note VARCHAR(32), n INT)"


def order(key: int, version: int = 0) -> dict[str, Any]:
    return {"id": key, "name": f"c{key % 7}-{version}", "qty": 1 + (key + version) % 5, "price": 100 + key,
            "secret": f"s{key}"}


def script() -> list[list[RowChange]]:
    """Snapshot chunks of 400 orders (ids 0..799) and 300 notes, then binlog changes, the first
    chunk again (a chunk copied twice), a re-read of changed rows, and more changes."""
    txs: list[list[RowChange]] = []
    for first in (0, 400):
        txs.append([read("orders", order(k)) for k in range(first, first + 400)])
    txs.append([read("notes", {"note": f"n{i % 50}", "n": i % 50}, key=()) for i in range(300)])
    txs.append([update("orders", order(5), order(5, 1)), delete("orders", order(6)), insert("orders", order(900))])
    txs.append([read("orders", order(k)) for k in range(400) if k not in (5, 6)])  # the first chunk, again
    txs.append([read("orders", order(5, 1)), read("orders", order(900))])
    txs.append([update("orders", order(7), order(7, 2)), delete("orders", order(8)),
                insert("notes", {"note": "late", "n": -1}, key=())])
    return txs


def expected_orders(txs: list[list[RowChange]]) -> list[tuple[Any, ...]]:
    """The target rows the rules and chain make of the reference state: name renamed to customer,
    secret left out, rows with qty 1 filtered out, total added by the chain, tag 'r' for rows a read
    wrote last (the chain writes _setl_op's first letter)."""
    rows: dict[int, tuple[Any, ...]] = {}
    for tx in txs:
        for change in tx:
            if change.table != "orders":
                continue
            before, after = change.before, change.after
            if before is not None:
                rows.pop(before["id"], None)
            if after is not None and after["qty"] > 1:
                op = change.op.value[0]
                if change.op is Op.UPDATE and before is not None and before["qty"] <= 1:
                    op = "i"  # the update enters the filter: Extract makes it an insert
                rows[after["id"]] = (after["id"], after["name"], after["qty"], after["price"],
                                     after["qty"] * after["price"], op)
    return [rows[k] for k in sorted(rows)]


RULES = [
    TableRule(source=r"demo\.orders", target="{schema}.orders", filter="qty > 1", rename={"name": "customer"},
              columns=ColumnsConfig(exclude=("secret",)),
              transforms=(TransformStep("add_column", {"name": "total", "expr": "qty * price"}),
                          TransformStep("add_column", {"name": "tag", "expr": "substr(_setl_op, 1, 1)"}))),
    TableRule(source=r"demo\.notes", target="{schema}.notes"),
]


def run(load: Any, schema: str, spark: Any, registry: Any) -> InvariantListener:
    rules = [TableRule(source=r.source, target=r.target.replace("{schema}", schema), filter=r.filter,
                       rename=r.rename, columns=r.columns, transforms=r.transforms) for r in RULES]
    listener = InvariantListener(2)
    result = run_pipeline(
        ScriptedSource(script()), load, name="reads", listener=listener,
        extract=TableExtract(rules, pipeline="reads"),
        transform=SparkTransform.from_rules(rules, registry, pipeline="reads", session=lambda: spark),
        settings=PipelineSettings(parallelism=2, batch=BatchSettings(max_rows=1000, max_wait_ms=20),
                                  retry=RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=2)),
    )
    assert result.outcome is Outcome.CAUGHT_UP, result.scheduler.error
    assert listener.violations == [] and listener.rollbacks == []
    return listener


def expected_notes() -> list[tuple[Any, ...]]:
    notes = [(c.after["note"], c.after["n"]) for tx in script() for c in tx
             if c.table == "notes" and c.after is not None and c.op in (Op.READ, Op.INSERT)]
    return sorted(notes, key=repr)


def test_reads_through_extract_spark_and_load_into_mariadb(spark, registry, mariadb_target, mysql_db):
    """MariaDB ends as the reference: reads routed, renamed, filtered and transformed like inserts,
    replacing rows, a replayed chunk idempotent, and keyless reads inserted once each."""
    for table, ddl in (("orders", ORDERS_DDL), ("notes", NOTES_DDL)):
        mariadb_target.query(ddl.format(t=f"`{mysql_db}`.`{table}`"))
    run(MysqlLoad(mariadb_target.target_config(), pipeline="reads", position_schema=mysql_db), mysql_db, spark,
        registry)
    got = mariadb_target.query(f"SELECT * FROM `{mysql_db}`.orders ORDER BY id")
    assert [tuple(r) for r in got] == expected_orders(script())
    assert sorted(mariadb_target.query(f"SELECT * FROM `{mysql_db}`.notes"), key=repr) == expected_notes()


def test_reads_through_extract_spark_and_load_into_postgresql(spark, registry, postgres_server, postgres_db):
    """PostgreSQL ends as the reference, the 400-row chunks through COPY (copy_rows 100)."""
    postgres_server.query("CREATE SCHEMA app", dbname=postgres_db)
    for table, ddl in (("orders", ORDERS_DDL), ("notes", NOTES_DDL)):
        postgres_server.query(ddl.format(t=f"app.{table}"), dbname=postgres_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="reads", copy_rows=100)
    with contextlib.closing(load):
        run(load, "app", spark, registry)
    got = postgres_server.query("SELECT * FROM app.orders ORDER BY id", dbname=postgres_db)
    assert [tuple(r) for r in got] == expected_orders(script())
    assert sorted(postgres_server.query("SELECT * FROM app.notes", dbname=postgres_db), key=repr) == expected_notes()
