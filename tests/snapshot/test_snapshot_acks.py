"""The ack that finishes a copy lets go of that copy only: a copy of the same table begun since (a
`setl snapshot --table` request taken after a rewind) goes on. Driven in process, with the
SnapshotSelect over a real MariaDB binlog source and a SQLite meta store, so that the test itself
is Termin (acks from a thread of its own) and the Select thread."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from setl.connectors import BuildContext, ConnectorRegistry
from setl.meta import SqliteMetaStore
from setl.model import Batch, DdlChange, Op, RowChange, TableName, Transaction
from setl.snapshot.select import SnapshotSelect
from setl.sources.mysql_binlog import MysqlSourceConfig
from setl.tablecopy import SnapshotSettings

pytestmark = pytest.mark.timeout(180)

ROWS = 250  # three chunks of 100 rows at most: the last one holds rows


def _take(select: SnapshotSelect, enough: Callable[[list[Transaction]], bool], what: str,
          timeout: float = 60.0) -> list[Transaction]:
    """Poll `select` until the transactions taken are `enough` (bounded in time)."""
    taken: list[Transaction] = []
    deadline = time.monotonic() + timeout
    while not enough(taken):
        assert time.monotonic() < deadline, f"no {what} within {timeout}s: {len(taken)} transaction(s) taken"
        tx = select.poll(0.2)
        if tx is not None:
            taken.append(tx)
    return taken


def _read(txs: list[Transaction], table: TableName) -> list[RowChange]:
    return [c for tx in txs for c in tx.changes
            if isinstance(c, RowChange) and c.op is Op.READ and (c.schema, c.table) == (table.schema, table.table)]


def _reads(txs: list[Transaction], table: TableName) -> int:
    return len(_read(txs, table))


def _truncated(txs: list[Transaction], table: TableName) -> bool:
    return any(isinstance(c, DdlChange) and c.snapshot and (c.schema, c.table) == (table.schema, table.table)
               for tx in txs for c in tx.changes)


def _batch(batch_id: int, txs: list[Transaction]) -> Batch:
    return Batch("p", batch_id, 1, txs[0].end, txs[-1].end, tuple(c for tx in txs for c in tx.changes))


def test_an_old_copys_ack_never_lets_a_new_copy_of_the_table_go(tmp_path, mariadb_source, source_db, monkeypatch):
    """The ack of the batch holding copy 1's last chunk is held (`snapshot_acked` failpoint) after
    its progress (done) is written; meanwhile the Select side rewinds and takes a pending request
    for the same table: copy 2 begins (its TRUNCATE is handed on). When the held ack goes on, it
    used to let go of the table's copy by name, copy 2: its chunks not read yet never were (the
    target kept the TRUNCATE and a chunk, the copy never ended), and the chunk read was handed on
    without its key. Now copy 2 hands on every row, by its key, and ends."""
    table = TableName(source_db, "t")
    conn = mariadb_source.connect(database=source_db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)")
            cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, f"v{i}") for i in range(ROWS)])
        conn.commit()
    finally:
        conn.close()
    source = ConnectorRegistry().source("mysql").create(
        MysqlSourceConfig(type="mysql", host=mariadb_source.host, port=mariadb_source.port, user=mariadb_source.user,
                          password=mariadb_source.password, server_id=2132, start="snapshot"), BuildContext("p"))
    access = source.snapshot_access()  # type: ignore[attr-defined]
    meta_path = tmp_path / "meta.db"
    store = SqliteMetaStore(meta_path)
    select = SnapshotSelect(source, pipeline="p", meta=lambda: SqliteMetaStore(meta_path), connect=access.connect,
                            where=access.where, start_mode=True, selects=lambda schema, _: schema == source_db,
                            settings=SnapshotSettings(chunk_rows=100, readers=1, max_chunks=1), parallelism=1)
    try:
        select.open(None)
        first = _take(select, lambda txs: _truncated(txs, table) and _reads(txs, table) == ROWS, "copy 1")
        batch = _batch(1, first)
        select.handed_on(batch)
        store.request_snapshot("p", table)  # taken once copy 1 is let go, or after a rewind
        monkeypatch.setenv("SETL_FAULTS", json.dumps([{"stage": "snapshot_acked", "action": "slow", "seconds": 8}]))
        errors: list[BaseException] = []

        def termin() -> None:
            ack_store = SqliteMetaStore(meta_path)
            try:
                select.acknowledge(batch, lambda progress: ack_store.ack("p", batch.id, batch.epoch, batch.end,
                                                                         rows=len(batch), progress=progress))
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)
            finally:
                ack_store.close()

        acking = threading.Thread(target=termin, name="test-termin", daemon=True)
        acking.start()

        def done_in_store() -> bool:
            return any(p.name == table and p.status.value == "done" for p in store.snapshot_progress("p"))

        deadline = time.monotonic() + 30
        while not done_in_store():
            assert time.monotonic() < deadline and acking.is_alive(), (
                f"copy 1's ack not written: {errors} {store.snapshot_progress('p')} {len(batch)}")
            time.sleep(0.05)
        select.seek(batch.end)  # a rewind: the pending request is taken, copy 2 begins
        second = _take(select, lambda txs: _truncated(txs, table), "copy 2's TRUNCATE", timeout=30)
        assert acking.is_alive(), "the held ack ended before copy 2 began: the test did not interleave them"
        acking.join(60)
        assert not acking.is_alive() and not errors, errors
        monkeypatch.delenv("SETL_FAULTS")
        second += _take(select, lambda txs: _reads(txs, table) == ROWS, "copy 2's rows")
        assert _reads(second, table) == ROWS and select.backlog()
        assert {c.primary_key for c in _read(second, table)} == {("id",)}
        again = _batch(2, second)
        select.handed_on(again)
        select.acknowledge(again, lambda progress: store.ack("p", again.id, again.epoch, again.end, rows=len(again),
                                                             progress=progress))
        assert not select.backlog()
        final = {p.name: p for p in store.snapshot_progress("p")}[table]
        assert final.status.value == "done" and final.rows == ROWS, final
    finally:
        select.close()
        store.close()
