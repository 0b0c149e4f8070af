"""MysqlBinlogSource over time on real MariaDB: position marks, GTID starts, table-map cache,
reconnects, and memory bounds for huge transactions."""

from __future__ import annotations

import time

import attrs
import pytest

from setl.config import TableRule
from setl.errors import ConfigError, SourceError
from setl.model import Position, Transaction
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.stages.extract import TableExtract
from setl.testing.harness import MemorySink, run_pipeline
from setl.testing.servers import wait_until
from tests.sources.binlog import bare, execute, head, next_server_id
from tests.sources.test_mysql_binlog import TYPES_ROWS, TYPES_TABLE

pytestmark = pytest.mark.timeout(90)

def drain(src: MysqlBinlogSource, until, timeout: float = 20) -> list[Transaction]:
    """Poll, keeping every transaction, until `until(transactions)` holds."""
    got: list[Transaction] = []

    def done() -> bool:
        tx = src.poll(0.2)
        if tx is not None:
            got.append(tx)
        return until(got)

    wait_until(done, timeout=timeout, interval=0, message="transactions from the binlog")
    return got


def ids(transactions: list[Transaction], schema: str) -> list[int]:
    return [c.image["id"] for tx in transactions for c in tx.changes if getattr(c, "op", None) and c.schema == schema]


def test_trailing_rotation_yields_a_position_mark_at_the_head(mariadb_source, source_db, sources):
    """After a FLUSH BINARY LOGS, poll hands on an empty transaction whose end is the new head."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (1)", "FLUSH BINARY LOGS")
    new_log = head(mariadb_source).log
    # MariaDB logs the checkpoint naming the new file a moment after the rotation: wait for it
    wait_until(lambda: any(row[2] == "Binlog_checkpoint" and new_log in row[5]
                           for row in mariadb_source.query(f"SHOW BINLOG EVENTS IN '{new_log}'")),
               timeout=10, interval=0.05, message="the binlog checkpoint of the new file")
    src = sources(mariadb_source, start)
    got = drain(src, lambda got: bool(got) and bare(got[-1].end) == head(mariadb_source))
    marks = [tx for tx in got if not tx.changes]
    assert ids(got, source_db) == [1] and marks and all(tx.complete for tx in marks)
    assert marks[-1].end.log != start.log and bare(src.tell()) == head(mariadb_source)
    assert src.poll(0.3) is None  # an idle stream hands on no further marks (heartbeats repeat the head)


def test_until_caught_up_returns_when_the_binlog_ends_without_a_transaction(mariadb_source, source_db, sources):
    """--until-caught-up returns although the binlog ends in an excluded table's transaction and a rotation."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)",
            "CREATE TABLE skipped (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (1), (2)", "INSERT INTO skipped VALUES (9)",
            "FLUSH BINARY LOGS")
    src = sources(mariadb_source, start={"file": start.log, "pos": start.offset}, open_it=False)
    extract = TableExtract([TableRule(source=rf"{source_db}\.skipped", exclude=True),
                            TableRule(source=rf"{source_db}\..*")], pipeline="t")
    sink = MemorySink(holds_position=True)
    end = head(mariadb_source)
    result = run_pipeline(src, sink, extract=extract, until_caught_up=True)
    assert result.outcome.value == "caught_up"
    acked = result.meta.position("test").position
    assert acked.log > start.log and acked >= end and acked == sink.position
    assert sink.tables == {f"{source_db}.t": {(1,): {"id": 1}, (2,): {"id": 2}}}


def test_cli_until_caught_up_exits_when_the_binlog_ends_without_a_transaction(mariadb_source, source_db, tmp_path):
    """`setl start --until-caught-up` exits 0 with the ack in the new binlog after an excluded write and a rotation."""
    from tests.e2e.setl_process import SetlProcess, mysql_source

    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)",
            "CREATE TABLE skipped (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (1)", "INSERT INTO skipped VALUES (9)",
            "FLUSH BINARY LOGS")
    end = head(mariadb_source)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=next_server_id(),
                                                     start={"file": start.log, "pos": start.offset}),
                       target={"type": "sqlite", "path": str(tmp_path / "target.db")},
                       tables=[{"source": rf"{source_db}\.skipped", "exclude": True}, {"source": rf"{source_db}\..*"}])
    done = setl.start_until_caught_up(timeout=60)
    assert done.returncode == 0, done.stderr
    acked = setl.acked().position
    assert acked.log == end.log and acked >= end


def test_gtid_start_yields_only_later_transactions(mariadb_source, source_db, sources):
    """A MariaDB GTID start reads the transactions after it, records GTIDs, and resumes by file+pos."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    after_first = mariadb_source.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")
    src = sources(mariadb_source, start={"gtid": after_first})
    assert src.tell() is None  # the server positions a GTID start; the first transaction tells where
    got = drain(src, lambda got: ids(got, source_db) == [2, 3])
    domain, server, seq = after_first.split("-")
    assert got[0].end.gtid == f"{domain}-{server}-{int(seq) + 1}"
    assert got[1].end.gtid == f"{domain}-{server}-{int(seq) + 2}"
    assert got[-1].end.gtid == mariadb_source.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    resumed = sources(mariadb_source, got[0].end, start={"gtid": after_first})  # an acked position wins
    (tx,) = drain(resumed, lambda got: len(got) == 1)
    assert tx == got[1]


def test_gtid_start_at_the_servers_state_starts_at_the_head(mariadb_source, source_db, sources):
    """A GTID set the server has fully executed starts at its head, so caught-up is known at once."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    now = mariadb_source.query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
    src = sources(mariadb_source, start={"gtid": now})
    assert src.tell() == attrs.evolve(head(mariadb_source), gtid=now)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (2)")
    assert ids(drain(src, lambda got: bool(ids(got, source_db))), source_db) == [2]


def test_bad_gtid_starts_are_clear_errors(mariadb_source, sources):
    """A malformed GTID is a ConfigError; a MySQL GTID set on MariaDB is a SourceError naming both."""
    with pytest.raises(ConfigError, match="neither a MariaDB GTID list"):
        MysqlBinlogSource(start={"gtid": "0-1"}, pipeline="t")
    src = sources(mariadb_source, start={"gtid": "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"}, open_it=False)
    with pytest.raises(SourceError, match="is a mysql GTID but .* is mariadb") as caught:
        src.open(None)
    assert "pipeline=t" in str(caught.value)


def test_table_map_cache_decodes_rows_the_same(mariadb_source, source_db, sources):
    """Reading a range with the table-map cache gives the same transactions as without it."""
    execute(mariadb_source, source_db, TYPES_TABLE, "CREATE TABLE k (id INT PRIMARY KEY, v VARCHAR(10))")
    start = head(mariadb_source)
    placeholders = ", ".join(["%s"] * len(TYPES_ROWS[0]))
    statements = [(f"INSERT INTO types VALUES ({placeholders})", row) for row in TYPES_ROWS]
    statements += [f"INSERT INTO k VALUES ({i}, 'v{i}')" for i in range(20)]
    statements += ["ALTER TABLE k ADD COLUMN w INT DEFAULT 5", "UPDATE k SET v = 'x' WHERE id < 10",
                   "UPDATE types SET ti = 1", "DELETE FROM k WHERE id > 15"]
    execute(mariadb_source, source_db, *statements)
    end = head(mariadb_source)
    cached = sources(mariadb_source, start)
    plain = sources(mariadb_source, start, table_map_cache=False)
    with_cache = drain(cached, lambda got: bool(got) and bare(got[-1].end) == end)
    without = drain(plain, lambda got: bool(got) and bare(got[-1].end) == end)
    assert with_cache == without and len(with_cache) == len(statements)
    assert cached.table_maps.hits > 20 and plain.table_maps is None
    assert [c.after["w"] for c in with_cache[-3].changes] == [5] * 10  # the map after ALTER has the column


def test_source_restart_mid_stream_loses_and_repeats_nothing(mariadb_factory, sources):
    """A source server restart is bridged by a reconnect from the last end handed on: every row once."""
    server = mariadb_factory()
    server.query("CREATE DATABASE d")
    server.query("CREATE TABLE d.t (id INT PRIMARY KEY)")
    src = sources(server, max_rows_in_memory=4)
    execute(server, "d", *[f"INSERT INTO t VALUES ({i})" for i in range(1, 21)],
            "INSERT INTO t VALUES " + ", ".join(f"({i})" for i in range(21, 31)))
    first = drain(src, lambda got: len(ids(got, "d")) >= 5)
    server.restart()
    execute(server, "d", *[f"INSERT INTO t VALUES ({i})" for i in range(31, 41)])
    rest = drain(src, lambda got: (ids(first, "d") + ids(got, "d"))[-1:] == [40], timeout=40)
    assert ids(first + rest, "d") == list(range(1, 41))
    assert src.reconnects >= 1
    complete = [tx.end for tx in first + rest if tx.complete]
    assert complete == sorted(complete)


def test_source_down_past_the_retry_budget_is_a_source_error(mariadb_factory, sources):
    """A server that stays down past reconnect_timeout makes poll raise, naming pipeline, host:port, position."""
    server = mariadb_factory()
    server.query("CREATE DATABASE d")
    server.query("CREATE TABLE d.t (id INT PRIMARY KEY)")
    src = sources(server, reconnect_timeout=1.5)
    execute(server, "d", "INSERT INTO t VALUES (1)")
    (tx,) = drain(src, lambda got: bool(ids(got, "d")))
    server.stop()
    errors: list[SourceError] = []

    def raised() -> bool:
        try:
            src.poll(0.2)
        except SourceError as exc:
            errors.append(exc)
        return bool(errors)

    began = time.monotonic()
    wait_until(raised, timeout=30, interval=0, message="poll to raise SourceError")
    message = str(errors[0])
    assert "pipeline=t" in message and f"{server.host}:{server.port}" in message and str(bare(tx.end)) in message
    assert time.monotonic() - began >= 1.0


def test_huge_transaction_is_read_with_bounded_buffers(mariadb_source, source_db, sources):
    """A 200,000-row transaction comes in pieces; the source never buffers much more than max_rows_in_memory."""
    execute(mariadb_source, source_db, "CREATE TABLE big (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO big SELECT seq FROM seq_1_to_200000")
    max_rows = 5000
    src = sources(mariadb_source, start, max_rows_in_memory=max_rows)
    seen, pieces, last = 0, 0, None

    def read() -> bool:
        nonlocal seen, pieces, last
        tx = src.poll(0.2)
        if tx is not None and any(c.schema == source_db for c in tx.changes):
            assert [c.after["id"] for c in tx.changes] == list(range(seen + 1, seen + 1 + len(tx.changes)))
            seen, pieces, last = seen + len(tx.changes), pieces + 1, tx
        elif tx is not None and seen:  # the commit after a last full piece comes with no changes
            last = tx
        return seen >= 200_000 and last.complete

    wait_until(read, timeout=80, interval=0, message="200,000 rows")
    assert pieces == 40 and last.complete and bare(last.end) == head(mariadb_source)
    # one queued piece (a full piece waits for an empty queue), the one being assembled, and the rows
    # of one rows event (< 8 KiB)
    assert max_rows <= src.peak_buffered_rows <= 2 * max_rows + 2000


def test_the_reader_runs_ahead_by_rows_not_by_a_count_of_transactions(mariadb_source, source_db, sources):
    """Many one-row transactions queue up to max_rows_in_memory rows ahead of poll, and never more.

    A count-bounded queue (16 transactions) made the reader wait for every few rows of a small-transaction
    load such as sysbench's, which capped a whole pipeline at about 6k rows/s.
    """
    execute(mariadb_source, source_db, "CREATE TABLE small (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, *[f"INSERT INTO small VALUES ({i})" for i in range(1, 301)])
    src = sources(mariadb_source, start, max_rows_in_memory=120)
    wait_until(lambda: src.peak_buffered_rows >= 120, timeout=20, message="the reader to queue 120 rows")
    time.sleep(0.3)  # it would have gone on reading by now, were it not bounded
    assert src.peak_buffered_rows <= 121  # the queue, plus at most the one row being assembled
    got = drain(src, lambda got: ids(got, source_db)[-1:] == [300])
    assert ids(got, source_db) == list(range(1, 301))


def test_connection_cut_inside_a_split_transaction_resumes_it_without_repeats(mariadb_factory, sources, caplog):
    """A stream cut while a huge transaction is being handed on in pieces resumes after the rows already handed on."""
    server = mariadb_factory()
    server.query("CREATE DATABASE d")
    server.query("CREATE TABLE d.t (id INT PRIMARY KEY, pad CHAR(200))")
    rows = 150_000  # about 30 MB of binlog: more than the socket buffers hold while the reader waits
    src = sources(server, max_rows_in_memory=2000)
    execute(server, "d", f"INSERT INTO t SELECT seq, REPEAT('x', 200) FROM seq_1_to_{rows}")
    caplog.set_level("INFO", logger="setl.sources.mysql_binlog")
    first = drain(src, lambda got: len(ids(got, "d")) >= 6000)
    assert not first[-1].complete
    (dump,) = [row[0] for row in server.query("SHOW PROCESSLIST") if row[4] == "Binlog Dump"]
    server.query(f"KILL {dump}")
    rest = drain(src, lambda got: bool(got) and got[-1].complete and got[-1].end > first[-1].end, timeout=60)
    assert ids(first + rest, "d") == list(range(1, rows + 1))
    assert src.reconnects == 1 and "skipping the" in caplog.text


def test_gtid_sets_of_both_flavours_advance_and_compare():
    """GTID states: MariaDB keeps the last GTID per domain, MySQL a uuid:interval set; both tell coverage."""
    from setl.sources.mysql_binlog.assembler import _GtidState, gtid_flavor

    uuid_a, uuid_b = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "4c9e3dfc-9d25-11e9-8d2e-0242ac1cfd7e"
    mysql = _GtidState("mysql", f"{uuid_a}:1-5,\n{uuid_b}:1-3")  # SHOW MASTER STATUS wraps long sets
    mysql.add(f"{uuid_a}:6")
    assert mysql.text == f"{uuid_a}:1-6,{uuid_b}:1-3"
    assert mysql.covers(_GtidState("mysql", f"{uuid_a}:2-6")) and not mysql.covers(_GtidState("mysql", f"{uuid_a}:7"))
    mariadb = _GtidState("mariadb", "1-2-7,0-1-42")
    mariadb.add("0-1-43")
    assert mariadb.text == "0-1-43,1-2-7"
    assert mariadb.covers(_GtidState("mariadb", "0-1-40")) and not mariadb.covers(_GtidState("mariadb", "2-1-1"))
    assert [gtid_flavor(t) for t in ("0-1-42, 1-2-7", f"{uuid_a}:1-5:7-9,{uuid_b}:1", "0-1", "latest")] == \
        ["mariadb", "mysql", None, None]


@pytest.mark.parametrize(("start", "parsed"), [
    ("earliest", "earliest"),
    ({"file": "mysql-bin.000003", "pos": 120}, Position("mysql-bin.000003", 120)),
    ("mysql-bin.000003:120", Position("mysql-bin.000003", 120)),
    ({"gtid": "0-1-42"}, ("0-1-42", "mariadb")),
    ({"gtid": "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-9"}, ("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-9", "mysql")),
])
def test_configured_starts_are_parsed(start, parsed):
    """Every documented form of source.start parses to a position, a keyword or a GTID start."""
    got = MysqlBinlogSource(start=start).start
    assert (got.gtid, got.flavor) == parsed if isinstance(parsed, tuple) else got == parsed


@pytest.mark.parametrize("start", [{"file": "mysql-bin.000001", "pos": 2}, {"file": "x", "pos": 4, "gtid": "0-1-1"},
                                   {"gtid": 42}, "sometime"])
def test_bad_configured_starts_are_config_errors(start):
    """A start that is none of the documented forms is a ConfigError naming the pipeline."""
    with pytest.raises(ConfigError, match="pipeline=p"):
        MysqlBinlogSource(start=start, pipeline="p")


def test_lag_questions_share_one_kept_connection_that_survives_a_kill(mariadb_source, source_db, sources):
    """`bytes_behind` (asked by the node's sampler every few seconds) opens no connection per call:
    one kept session answers them all, a killed one is replaced on the next call, and closing the
    source closes it. (The source is not opened: no reader thread and its connections to tell apart.)"""
    def sleeping() -> set[int]:
        return {int(row[0]) for row in mariadb_source.query(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND = 'Sleep' AND ID <> CONNECTION_ID()")}

    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    src = sources(mariadb_source, open_it=False)
    idle_before = sleeping()
    first = src.bytes_behind(start)
    assert first is not None and bare(first[0]) == head(mariadb_source)
    kept = sleeping() - idle_before
    assert len(kept) == 1, (idle_before, kept)
    for n in range(5):
        execute(mariadb_source, source_db, f"INSERT INTO t VALUES ({n})")
        found = src.bytes_behind(start)
        assert found is not None and bare(found[0]) == head(mariadb_source) and found[1] > first[1]
        assert kept <= sleeping(), "the session that answered first is gone: a connection per question"
    mariadb_source.query(f"KILL CONNECTION {next(iter(kept))}")
    again = src.bytes_behind(start)
    assert again is not None and bare(again[0]) == head(mariadb_source)
    replaced = sleeping() - idle_before
    assert len(replaced) == 1 and replaced != kept, (kept, replaced)
    src.close()
    wait_until(lambda: not (sleeping() & replaced), timeout=10, interval=0.05,
               message="the kept connection to close with the source")
