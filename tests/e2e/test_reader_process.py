"""`sources.reader_process`: the binlog reader in a process of its own. Its transactions equal the
reader thread's on a real binlog (split transactions, DDL, table rules), travel as columns, and a
kill -9 of either process ends in a target equal to the source, with no gap and no duplicate."""

from __future__ import annotations

import datetime
import decimal
import os
import pickle
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from setl.config import NodeSettings, SourcesConfig
from setl.connectors import BuildContext, registry
from setl.model import Change, DdlChange, Op, PartialImage, Position, RowChange, Transaction
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.sources.mysql_binlog.frames import Decoder, Encoder
from setl.testing.connectors import SelectContract
from setl.testing.servers import wait_until
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, spawned
from tests.sources import test_mysql_binlog_contract as contract
from tests.sources.binlog import execute, next_server_id
from tests.sources.test_fast_decoder import COLUMNS, ROWS, SET64, WIDE, typed

pytestmark = pytest.mark.timeout(180)


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (from /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def contents(server, table: str) -> list[tuple]:
    return [tuple(r) for r in server.query(f"SELECT id, v, n FROM {table} ORDER BY id")]


def write(server, db: str, first: int, count: int) -> None:
    """`count` rows in transactions of 20, then updates and deletes of some of them in one transaction."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            for start in range(first, first + count, 20):
                ids = range(start, min(start + 20, first + count))
                cur.execute("INSERT INTO t (id, v, n) VALUES " + ", ".join(f"({i}, 'v{i}', {i}.5)" for i in ids))
            cur.execute("BEGIN")
            cur.execute("UPDATE t SET v = CONCAT(v, '+'), n = n + 1 WHERE MOD(id, 3) = 0 AND id >= %s", (first,))
            cur.execute("DELETE FROM t WHERE MOD(id, 7) = 0 AND id >= %s", (first,))
            cur.execute("COMMIT")
    finally:
        conn.close()


def kept(*ranges: tuple[int, int]) -> int:
    """The rows `write` leaves for its calls with (first, count): every id but multiples of 7."""
    return sum(1 for first, count in ranges for i in range(first, first + count) if i % 7)


def read_range(server, start: Position, end: Position, process: bool, server_id: int,
               selects=None) -> list[Transaction]:
    """The transactions of the binlog range from `start` to `end`, through the reader process or thread."""
    src = MysqlBinlogSource.from_config(server.source_config(server_id, "earliest"), pipeline="rp",
                                        max_rows_in_memory=60, reader_process=process, selects=selects)
    got: list[Transaction] = []
    src.open(start)
    try:
        def more() -> bool:
            tx = src.poll(0.2)
            if tx is not None:
                got.append(tx)
            return bool(got) and got[-1].complete and got[-1].end >= end
        wait_until(more, timeout=60, interval=0, message="the range read")
    finally:
        src.close()
    return got


def typed_change(change: Change) -> Any:
    """Every field of a change with each value's type (attrs equality ignores `source`, `sequence` and
    the types of equal values: 1 == 1.0 == True, a set == a frozenset)."""
    if not isinstance(change, RowChange):
        return ("object", type(change).__name__, repr(change))
    return (change.op, change.schema, change.table, change.primary_key, type(change.before).__name__,
            type(change.after).__name__, typed(change.before), typed(change.after), change.position,
            change.position.row if change.position else None, change.commit_time, change.source, change.sequence)


def test_columns_round_trip_every_change_kind_exactly():
    """Frames of row changes (full, partial and missing images, split positions, any value type) and
    DDL decode to equal transactions, a shape sent in one frame known in the next."""
    at = Position("b.000001", 400, "0-1-9")
    values = {"id": 1, "d": decimal.Decimal("1.10"), "t": datetime.datetime(2026, 1, 2, 3, 4, 5, 6),
              "b": b"\x00\xff", "s": {"a", "b"}, "n": None, "f": -0.0, "j": "{\"k\": 1}"}
    first = [
        Transaction((RowChange(Op.INSERT, "s", "t", ("id",), None, dict(values), at, 1.5),
                     RowChange(Op.UPDATE, "s", "t", ("id",), dict(values), {**values, "n": 7}, at, 1.5),
                     DdlChange("s", "t", "ALTER TABLE t ADD c INT", at),
                     RowChange(Op.DELETE, "s", "u", (), PartialImage(id=2), None, at, None)), at, True, 99),
        Transaction((), Position("b.000002", 4), True, 0),
    ]
    split = Position("b.000002", 10)
    second = [Transaction(tuple(RowChange(Op.INSERT, "s", "t", ("id",), None, {**values, "id": i},
                                          Position("b.000002", 10, row=i), 2.0) for i in range(1, 4))
                          + (RowChange(Op.UPDATE, "s", "v", ("k",), {}, {}, split, 2.0),), split, False, 10)]
    slow = Decoder()
    slow.fast = False  # the attrs constructor: what the slot-by-slot build must equal
    encoder, decoder = Encoder(), Decoder()
    assert decoder.fast, "RowChange changed shape: the frames' fast build is off (frames._FIELDS)"
    for frame in (first, second):
        encoded = encoder.frame(frame)
        got, built = decoder.frame(encoded), slow.frame(encoded)
        assert got == frame == built
        def fields(txs: list[Transaction]) -> list[Any]:
            return [typed_change(c) for tx in txs for c in tx.changes]
        assert fields(got) == fields(frame) == fields(built)
        for tx, back in zip(frame, got):
            assert (back.end, back.complete, back.nbytes) == (tx.end, tx.complete, tx.nbytes)
            assert [type(c) for c in back.changes] == [type(c) for c in tx.changes]
    assert len(encoder.shapes) == 4  # the second frame's inserts reuse the first's shape
    assert b"setl.model" not in pickle.dumps(encoder.frame(second), protocol=5)  # ends travel by number


def test_a_transactions_end_keeps_its_own_gtid_and_row_in_a_frame():
    """A transaction's end equal to a row's position but for its GTID, or a piece's row ordinal, decodes
    to its own end, not the row's."""
    row_at = Position("b.000003", 50, "0-1-7")
    ends = [Position("b.000003", 50, "0-1-8"), Position("b.000003", 50, "0-1-7", row=2), Position("b.000003", 50)]
    txs = [Transaction((RowChange(Op.INSERT, "s", "t", ("id",), None, {"id": i}, row_at, 1.0),), end, i != 1, 5)
           for i, end in enumerate(ends)]
    got = Decoder().frame(pickle.loads(pickle.dumps(Encoder().frame(txs), protocol=5)))
    assert [(tx.end, tx.end.gtid, tx.end.row, tx.complete) for tx in got] == \
        [(end, end.gtid, end.row, i != 1) for i, end in enumerate(ends)]
    assert [tx.changes[0].position.gtid for tx in got] == ["0-1-7"] * 3


def test_the_childs_plain_rows_make_the_frames_its_row_changes_make():
    """The child's assembler hands on a table's row change as a plain tuple (`plain_rows`): the frame
    of those tuples is the frame of the equal `RowChange`s, and decodes to them."""
    at = Position("b.000003", 800, "0-1-3")
    split = Position("b.000003", 900, row=2)
    changes = (RowChange(Op.INSERT, "s", "t", ("id",), None, {"id": 1, "v": decimal.Decimal("2.50")}, at, 3.0),
               RowChange(Op.UPDATE, "s", "t", ("id",), {"id": 1, "v": None}, PartialImage(id=1, v=b"x"), split, None),
               DdlChange("s", "t", "ALTER TABLE t ADD w INT", at),
               RowChange(Op.DELETE, "s", "u", (), {"a": frozenset({"x"})}, None, at, 3.0))
    plain = tuple(c if isinstance(c, DdlChange) else (c.op, c.schema, c.table, c.primary_key, c.before, c.after,
                                                        c.position, c.commit_time) for c in changes)
    objects = [Transaction(changes, at, True, 50)]
    tuples = [Transaction(plain, at, True, 50)]  # type: ignore[arg-type]
    frame = Encoder().frame(tuples)
    assert frame == Encoder().frame(objects)
    back = Decoder().frame(frame)
    assert back == objects
    assert [typed_change(c) for c in back[0].changes] == [typed_change(c) for c in changes]


def test_reader_process_hands_on_what_the_reader_thread_does(mariadb_source, source_db):
    """The same binlog range through the reader process and the reader thread gives equal transactions
    and ends: split pieces, DDL, and a table the rules leave out."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY, v VARCHAR(40), n DECIMAL(10,2))")
    mariadb_source.query(f"CREATE TABLE `{source_db}`.skip (id INT PRIMARY KEY)")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1, 300)
    mariadb_source.query(f"INSERT INTO `{source_db}`.skip VALUES (1), (2)")
    mariadb_source.query(f"ALTER TABLE `{source_db}`.t ADD COLUMN w INT")
    mariadb_source.query(f"UPDATE `{source_db}`.t SET w = id WHERE id < 50")
    end = binlog_head(mariadb_source)

    def rules(schema: str, table: str) -> bool:
        return table != "skip"

    thread = read_range(mariadb_source, start, end, False, 7901, rules)
    process = read_range(mariadb_source, start, end, True, 7902, rules)
    assert [c for tx in process for c in tx.changes] == [c for tx in thread for c in tx.changes]
    assert [(tx.end, tx.complete) for tx in process if tx.changes] == \
        [(tx.end, tx.complete) for tx in thread if tx.changes]
    assert any(not tx.complete for tx in process), "no split transaction: the range proves less"
    assert any(isinstance(c, DdlChange) for tx in process for c in tx.changes)
    # rows of a table the rules leave out are passed over in the child as in the thread (`skipping`)
    assert not any(c.table == "skip" for tx in process + thread for c in tx.changes if isinstance(c, RowChange))


def test_every_type_crosses_the_reader_process_exactly(mariadb_source, source_db):
    """Every column type at its edges (the compiled decoder's corpus), SET, BIT, JSON, spatial, partial
    images (MINIMAL) and a row over 4 MB: the reader process hands on the reader thread's changes, each
    field and each value's type equal, in the same transactions."""
    execute(mariadb_source, source_db, "SET SESSION sql_mode = ''", WIDE,
            f"CREATE TABLE odd (id INT PRIMARY KEY, s SET('x','y','z'), s64 SET({SET64}), b BIT(10), b1 BIT(1), "
            "b64 BIT(64), j JSON, g POINT, gg GEOMETRY, dt0 DATETIME, v VARCHAR(5))")
    start = binlog_head(mariadb_source)
    marks = ", ".join(["%s"] * len(COLUMNS))
    execute(mariadb_source, source_db, "SET SESSION sql_mode = ''",
            *[(f"INSERT INTO wide VALUES ({marks})", row) for row in ROWS],
            "UPDATE wide SET vc = CONCAT(vc, '!'), dc = -dc, tm = '-01:02:03.456789' WHERE id IN (1, 2, 5)",
            "UPDATE wide SET ti = NULL, e = 'b', u = NULL WHERE id = 3",
            "DELETE FROM wide WHERE id IN (2, 4)",
            "INSERT INTO wide (id, lb) VALUES (6, REPEAT('z', 4 * 1024 * 1024))",
            "INSERT INTO odd VALUES (1, 'x,z', 'm0,m63', b'1010101010', b'1', 0xFFFFFFFFFFFFFFFF, "
            "'{\"a\": [1, 2.5]}', POINT(1, 2), ST_GeomFromText('LINESTRING(0 0, 1 1)'), '2020-01-01', 'v')",
            "INSERT INTO odd VALUES (2, '', '', b'0', b'0', 0, NULL, NULL, NULL, NULL, NULL)",
            "SET SESSION binlog_row_image = 'MINIMAL'",
            "UPDATE odd SET s = 'y', s64 = 'm31,m32,m62' WHERE id = 1",
            "UPDATE wide SET vc = 'minimal' WHERE id = 1",
            "DELETE FROM odd WHERE id = 2")
    end = binlog_head(mariadb_source)
    thread = read_range(mariadb_source, start, end, False, 7903)
    process = read_range(mariadb_source, start, end, True, 7904)
    want = [typed_change(c) for tx in thread for c in tx.changes]
    got = [typed_change(c) for tx in process for c in tx.changes]
    assert len(want) == len(ROWS) + 3 + 1 + 2 + 1 + 2 + 3
    for have, expected in zip(got, want):
        assert have == expected
    assert got == want
    assert [(tx.end, tx.complete, len(tx.changes)) for tx in process if tx.changes] == \
        [(tx.end, tx.complete, len(tx.changes)) for tx in thread if tx.changes]
    partial = [c for tx in process for c in tx.changes if isinstance(c, RowChange) and c.partial]
    assert len(partial) == 3, "MINIMAL images did not reach the comparison"


def test_the_first_opens_reader_process_starts_with_the_source(mariadb_source, source_db):
    """The source starts its first open's reader process when it is built (a spare, importing setl
    meanwhile): the open takes that one and starts the next spare, a reopen takes that next one, and a
    source closed without an open ends its spare."""
    def source(server_id: int) -> MysqlBinlogSource:
        return MysqlBinlogSource.from_config(mariadb_source.source_config(server_id, "earliest"), pipeline="rp",
                                             reader_process=True)

    unopened = source(7905)
    spare = unopened._spare.pid
    assert spare is not None and alive(spare) and spare in children(os.getpid())
    unopened.close()
    assert not alive(spare)

    src = source(7906)
    spare = src._spare.pid
    assert spare is not None
    start = binlog_head(mariadb_source)
    try:
        src.open(start)
        first = src._reader.pid
        assert first == spare
        wait_until(lambda: src._spare.pid is not None, timeout=30, message="the next spare")
        waiting = src._spare.pid
        src.open(start)  # a rollback's reopen: the spare that waited, the first one ended
        assert src._reader.pid == waiting and waiting != first and not alive(first)
        mariadb_source.query(f"CREATE TABLE `{source_db}`.sp (id INT PRIMARY KEY)")
        mariadb_source.query(f"INSERT INTO `{source_db}`.sp VALUES (1)")
        got: list[RowChange] = []

        def row() -> bool:
            tx = src.poll(0.2)
            got.extend(c for c in (tx.changes if tx else ()) if isinstance(c, RowChange))
            return bool(got)
        wait_until(row, timeout=30, interval=0, message="the insert through the second reader process")
        assert got[0].after == {"id": 1}
    finally:
        second = src._reader.pid
        src.close()
    assert not alive(second)


def setl_with_reader_process(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db,
                             server_id: int) -> SetlProcess:
    for server, db in ((mariadb_source, source_db), (mariadb_target, mysql_db)):
        server.query(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(40), n DECIMAL(10,2))")
    start = binlog_head(mariadb_source)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=server_id,
                                                     start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\.t", "target": f"{mysql_db}.t"}],
                       pipeline={"parallelism": 2, "batch": {"max_rows": 100, "max_wait_ms": 20},
                                 "retry": {"max_attempts": 10, "initial_backoff_ms": 50, "max_backoff_ms": 300}})
    node = yaml.safe_load((setl.conf / "setl.yaml").read_text())
    node["sources"] = {"reader_process": True}
    (setl.conf / "setl.yaml").write_text(yaml.safe_dump(node))
    return setl


def reader_pid(setl: SetlProcess, after: int = 0) -> int | None:
    """The pid of the reader process the node's log names last as started, if it is not `after`."""
    started = re.findall(r"binlog reader process started \(pid (\d+)\)", setl.logs())
    pid = int(started[-1]) if started else None
    return pid if pid != after else None


def first_reader_process(setl: SetlProcess, proc) -> int:
    """The pid of the node's reader process (one of its two children with the spare that waits for the
    next open), once the pipeline has acked a first batch."""
    wait_until(lambda: setl.acked() is not None and reader_pid(setl) in children(proc.pid), timeout=60,
               message=f"a first ack and a reader process; log:\n{setl.logs()[-3000:]}")
    pid = reader_pid(setl)
    assert pid is not None
    wait_until(lambda: len(children(proc.pid)) == 2, timeout=30, message="the spare beside the reader process")
    return pid


def test_kill_9_of_the_reader_process_rolls_back_and_reads_again(tmp_path, mariadb_source, source_db,
                                                                 mariadb_target, mysql_db):
    """A SIGKILL of the reader process mid-run: the pipeline names it in one line, rolls back to its
    last ack, reads again through the spare that waited and ends equal to the source."""
    setl = setl_with_reader_process(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db, 7911)
    write(mariadb_source, source_db, 1, 400)
    with spawned(setl) as proc:
        child = first_reader_process(setl, proc)
        write(mariadb_source, source_db, 1000, 600)
        os.kill(child, signal.SIGKILL)
        write(mariadb_source, source_db, 3000, 200)
        spare = next(c for c in children(proc.pid) if c != child)
        wait_until(lambda: reader_pid(setl, after=child) is not None, timeout=60,
                   message=f"a new reader process; log:\n{setl.logs()[-3000:]}")
        assert reader_pid(setl) == spare, "the rollback started a child, not the spare that waited"
        head = binlog_head(mariadb_source)
        wait_until(lambda: (setl.acked().position if setl.acked() else head) >= head, timeout=60,
                   message=f"caught up after the kill; log:\n{setl.logs()[-3000:]}")
        assert proc.poll() is None
        assert SetlProcess.stop(proc) == 0
    assert f"the binlog reader process (pid {child}) was killed by signal 9" in setl.logs()
    assert contents(mariadb_target, f"`{mysql_db}`.t") == contents(mariadb_source, f"`{source_db}`.t")
    assert len(contents(mariadb_target, f"`{mysql_db}`.t")) == kept((1, 400), (1000, 600), (3000, 200))


def test_kill_9_of_the_node_ends_its_reader_process(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    """A SIGKILL of the node: its reader process and its spare see their stdin end and exit within seconds; a restart
    catches up to a target equal to the source."""
    setl = setl_with_reader_process(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db, 7921)
    write(mariadb_source, source_db, 1, 400)
    with spawned(setl) as proc:
        child = first_reader_process(setl, proc)
        write(mariadb_source, source_db, 1000, 600)
        both = children(proc.pid)
        assert child in both and len(both) == 2
        proc.kill()
        proc.wait(10)
    wait_until(lambda: not any(alive(c) for c in both), timeout=10, message=f"reader processes {both} still running")
    assert setl.acked().position < binlog_head(mariadb_source), "the kill struck after the catch-up: it proves less"
    final = setl.start_until_caught_up()
    assert final.returncode == 0, final.stderr[-3000:]
    assert contents(mariadb_target, f"`{mysql_db}`.t") == contents(mariadb_source, f"`{source_db}`.t")
    assert len(contents(mariadb_target, f"`{mysql_db}`.t")) == kept((1, 400), (1000, 600))


def test_reader_process_and_the_shared_reader_are_refused_together():
    """`sources.reader_process` with `shared_reader_server_id` is a configuration error, not a silent choice."""
    assert SourcesConfig(reader_process=True).reader_process
    with pytest.raises(ValueError, match="reader_process does not work with shared_reader_server_id"):
        SourcesConfig(reader_process=True, shared_reader_server_id=9)


class ReaderProcessProbe(contract.BinlogProbe):
    """The binlog contract's probe, its source built by the connector for a node with `sources.reader_process`."""

    def make_select(self, pipeline="p"):
        config = self.server.source_config(next_server_id(), self.start)
        node = NodeSettings(sources=SourcesConfig(reader_process=True))
        select = registry().source("mysql").create(config, BuildContext(pipeline, node=node))
        assert select.reader_process
        return select


class TestReaderProcessSelectContract(SelectContract):
    """setl's Select contract suite, run against the binlog source with its reader in a process of its own."""

    @pytest.fixture
    def probe(self, mariadb_source, source_db):
        return ReaderProcessProbe(mariadb_source, source_db)


def test_the_frames_pipe_holds_a_whole_frame():
    """A reader process's frames cross a pipe widened to `PIPE_BYTES` (1 MiB), not the kernel's 64 KiB
    default that made a 600 KB frame ten writes, each waiting for the node to read."""
    import fcntl

    from setl.sources.mysql_binlog import process

    child = process.spawn()
    try:
        assert child.stdout is not None
        allowed = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        assert fcntl.fcntl(child.stdout.fileno(), fcntl.F_GETPIPE_SZ) == min(process.PIPE_BYTES, allowed)
    finally:
        process._end(child, 5.0)


def test_a_reader_process_imports_the_reader_not_the_node():
    """The reader process's entry, run by its path as `spawn` runs it, imports the reader's modules
    without the `setl` package's scheduler, stages, connectors and config, and ends at once on an
    empty stdin."""
    import subprocess
    import sys

    from setl.sources.mysql_binlog import process

    entry = Path(process.__file__).with_name("reader_child.py")
    done = subprocess.run([sys.executable, "-X", "importtime", str(entry)], input=b"", capture_output=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(process._ROOT)})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
    assert "setl.sources.mysql_binlog.process" in imported and "setl.sources.mysql_binlog.fast" in imported
    assert not {"setl.scheduler", "setl.connectors", "setl.stages", "setl.sources.mysql_binlog.source",
                "setl.config"} & imported
