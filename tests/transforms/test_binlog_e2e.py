"""End to end on real servers: a MariaDB binlog -> Extract -> rename + filter + mask on Spark -> MariaDB.

The source table takes inserts, updates that move rows into and out of the filter, a key change,
deletes and NULLs; the target must end equal to the source's final rows with the chain applied
in Python.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import random

import pytest

from setl.config import TransformStep
from setl.meta.sqlite import SqliteMetaStore
from setl.scheduler import Outcome, Scheduler
from setl.sinks.mysql import MysqlLoad
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.stages import TableExtract
from setl.transforms.stage import SparkTransform

from ..e2e.replicate import SETTINGS, binlog_head, table_rule

pytestmark = pytest.mark.timeout(120)

SOURCE_COLUMNS = """
    id INT NOT NULL PRIMARY KEY, name VARCHAR(40), card VARCHAR(20), status VARCHAR(10),
    balance DECIMAL(12,2), seen DATETIME(6), photo VARBINARY(16)
"""
TARGET_COLUMNS = """
    client_id INT NOT NULL PRIMARY KEY, name VARCHAR(40), card VARCHAR(20), status VARCHAR(10),
    balance DECIMAL(12,2), seen DATETIME(6), photo VARBINARY(16)
"""
CHAIN = (
    TransformStep("rename", {"columns": {"id": "client_id"}}),
    TransformStep("filter", {"condition": "status <> 'banned'"}),
    TransformStep("mask", {"columns": ["card"], "keep_last": 4}),
)


def expected_target(rows: list[tuple]) -> list[tuple]:
    """The source rows with the chain applied in Python: banned and NULL statuses filtered out, cards masked."""
    out = []
    for id_, name, card, status, balance, seen, photo in rows:
        if status is None or status == "banned":
            continue
        masked = None if card is None else "*" * max(len(card) - 4, 0) + card[-4:]
        out.append((id_, name, masked, status, balance, seen, photo))
    return sorted(out)


def write_workload(server, schema: str, seed: int = 5) -> None:
    """About 60 transactions: inserts, updates in and out of the filter, a key change, deletes, NULLs."""
    rng = random.Random(seed)
    statuses = ["active", "active", "idle", "banned", None]
    with contextlib.closing(server.connect(database=schema)) as conn, conn.cursor() as cur:
        conn.autocommit(False)
        live: list[int] = []
        for i in range(1, 201):
            card = None if i % 13 == 0 else f"{rng.randrange(10**15, 10**16)}"
            cur.execute("INSERT INTO customers VALUES (%s, %s, %s, %s, %s, %s, %s)", (
                i, f"name-{i}", card, rng.choice(statuses), decimal.Decimal(rng.randrange(-10**6, 10**6)) / 100,
                dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i * 61, microseconds=i * 7),
                None if i % 7 == 0 else bytes([i % 256, 0, 255]),
            ))
            live.append(i)
            if i % 10 == 0:
                conn.commit()
        for _ in range(30):
            for key in rng.sample(live, 3):
                cur.execute("UPDATE customers SET status = %s, balance = balance + 1, card = %s WHERE id = %s",
                            (rng.choice(statuses), f"{rng.randrange(10**5)}", key))
            conn.commit()
        cur.execute("UPDATE customers SET id = 1000 + id, status = 'active' WHERE id IN (%s, %s)", (live[0], live[1]))
        for key in rng.sample(live[2:], 20):
            cur.execute("DELETE FROM customers WHERE id = %s", (key,))
        conn.commit()


def test_binlog_through_a_spark_chain_into_mariadb(spark, registry, mariadb_source, source_db, mariadb_target,
                                                   mysql_db, tmp_path):
    """Changes read from a real MariaDB binlog go through rename + filter + mask on Spark into MariaDB,
    which ends equal to the source's rows transformed the same way."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.customers ({SOURCE_COLUMNS})")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.clients ({TARGET_COLUMNS})")
    start = binlog_head(mariadb_source)
    write_workload(mariadb_source, source_db)

    rules = [table_rule(rf"{source_db}\.customers", f"{mysql_db}.clients", transforms=CHAIN)]
    select = MysqlBinlogSource(host=mariadb_source.host, port=mariadb_source.port, user=mariadb_source.user,
                               password=mariadb_source.password, server_id=9100 + random.randrange(800),
                               flavor="mariadb", start=start, pipeline="binlog_spark")
    transform = SparkTransform.from_rules(rules, registry, pipeline="binlog_spark", session=lambda: spark)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="binlog_spark", position_schema=mysql_db, ddl="skip")
    meta = SqliteMetaStore(tmp_path / "meta.db")
    scheduler = Scheduler("binlog_spark", SETTINGS, select, TableExtract(rules, pipeline="binlog_spark"),
                          transform, load, meta)
    try:
        outcome = scheduler.run(until_caught_up=True)
    finally:
        load.close()
        meta.close()
    assert outcome is Outcome.CAUGHT_UP, scheduler.error
    assert scheduler.acked_batches > 3  # the workload spans several batches

    source_rows = mariadb_source.query(f"SELECT * FROM `{source_db}`.customers")
    want = expected_target(source_rows)
    got = sorted(mariadb_target.query(f"SELECT * FROM `{mysql_db}`.clients"))
    # the workload left rows the filter removes, rows it keeps (one under a changed key) and cards to mask
    assert 50 < len(want) < len(source_rows) and any(r[0] > 1000 for r in want)
    assert any(r[2] and r[2].startswith("****") for r in want)
    assert got == want
