"""`sources.reader_process`'s spare (`process.Spare`): every open, a rollback's included, takes a reader
process started ahead, and no reader process outlives the source that started it (closed, closed during
a start, closed after an error, or collected)."""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from setl.errors import SourceError
from setl.model import Position, RowChange
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.sources.mysql_binlog.process import Spare
from setl.testing.servers import wait_until
from tests.sources.binlog import next_server_id

pytestmark = pytest.mark.timeout(120)


def reader_processes() -> set[int]:
    """This process's live children that are binlog reader processes (`process.spawn`'s)."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            pids = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if b"reader_child.py" in command and state != "Z":
                found.add(int(pid))
    return found


def head(server) -> Position:
    log, offset = server.query("SHOW MASTER STATUS")[0][:2]
    return Position(log, int(offset))


def source(server) -> MysqlBinlogSource:
    return MysqlBinlogSource.from_config(server.source_config(next_server_id(), "earliest"), pipeline="spare",
                                         reader_process=True)


def first_row(src: MysqlBinlogSource) -> RowChange:
    got: list[RowChange] = []

    def row() -> bool:
        tx = src.poll(0.2)
        got.extend(c for c in (tx.changes if tx else ()) if isinstance(c, RowChange))
        return bool(got)
    wait_until(row, timeout=30, interval=0, message="a row through the reader process")
    return got[0]


def test_a_rollback_reads_through_the_spare_started_while_the_open_before_read(mariadb_source, source_db):
    """Each open takes the waiting spare and starts the next meanwhile: a rollback's reopen (`seek`) reads
    through the spare that waited (the old reader process ended), and closing ends reader and spare."""
    before = reader_processes()
    src = source(mariadb_source)
    mariadb_source.query(f"CREATE TABLE `{source_db}`.sp (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    mariadb_source.query(f"INSERT INTO `{source_db}`.sp VALUES (1)")
    try:
        first_spare = src._spare.pid
        assert first_spare is not None
        src.open(start)
        assert src._reader.pid == first_spare
        wait_until(lambda: src._spare.pid is not None, timeout=30, message="the next spare")
        waiting = src._spare.pid
        assert waiting not in (None, first_spare)
        assert first_row(src).after == {"id": 1}
        for _ in range(3):  # rollbacks: each reads from the ack again through the spare that waited
            old = src._reader.pid
            src.seek(start)
            assert src._reader.pid == waiting and old not in reader_processes()
            assert first_row(src).after == {"id": 1}
            wait_until(lambda: src._spare.pid is not None, timeout=30, message="the next spare")
            waiting = src._spare.pid
            assert reader_processes() - before == {src._reader.pid, waiting}
    finally:
        src.close()
    assert reader_processes() == before


def test_no_reader_process_outlives_a_closed_source(mariadb_source, source_db):
    """Closed unopened, closed right after an open (its next spare still starting), closed after a
    rollback, closed after an open that failed, and reopened after a close: no reader process is left."""
    before = reader_processes()
    start = head(mariadb_source)
    unopened = source(mariadb_source)
    wait_until(lambda: len(reader_processes() - before) == 1, timeout=30, message="the spare running")
    unopened.close()
    assert reader_processes() == before

    starting = source(mariadb_source)
    starting.open(start)
    starting.close()  # the next spare's start is under way: it ends too
    assert reader_processes() == before

    rolled = source(mariadb_source)
    rolled.open(start)
    rolled.seek(start)
    rolled.close()
    assert reader_processes() == before

    failed = source(mariadb_source)
    with pytest.raises(SourceError):
        failed.open(Position("no-such-binlog.000001", 4))
    failed.close()
    assert reader_processes() == before

    again = source(mariadb_source)
    again.open(start)
    again.close()
    again.open(start)  # an open after a close takes no spare, starts its own, and the next spare again
    wait_until(lambda: again._spare.pid is not None, timeout=30, message="the next spare after a reopen")
    again.close()
    again.close()
    assert reader_processes() == before


def dropped(begin: Callable[[Spare], object]) -> int:
    """The pid of the child a new `Spare` keeps waiting after `begin`, once that `Spare` is dropped
    unclosed and collected."""
    held = [Spare("gc")]
    begin(held[0])
    wait_until(lambda: held[0].pid in reader_processes(), timeout=30, message="a spare waiting")
    pid = held[0].pid
    assert pid is not None
    held.clear()  # its only reference
    gc.collect()
    return pid


def new_threads(known: set[int | None], prefix: str) -> list[threading.Thread]:
    """Live threads named with `prefix` and not among `known` (their idents)."""
    return [t for t in threading.enumerate() if t.ident not in known and t.name.startswith(prefix)]


def took_nothing(spare: Spare) -> None:
    assert spare.take() is None  # nothing waited: the open starts its own; the next one starts meanwhile


def test_a_collected_spare_ends_its_child():
    """A `Spare` whose owner drops it unclosed (a pipeline removed, a node's source lost) ends its waiting
    child when it is collected: the one started with it, and the one it started in the background."""
    before = reader_processes()
    for begin in (Spare.start, took_nothing):
        pid = dropped(begin)
        wait_until(lambda: pid not in reader_processes(), timeout=10,  # noqa: B023 - used at once
                   message=f"a collected spare's child ({begin.__name__}) still running")
    assert reader_processes() == before


def test_a_collected_open_source_ends_its_reader_process(mariadb_source, source_db):
    """A source dropped open, unclosed, with its reader process's receiver waiting for room in the hand-off
    (more rows read than `max_rows_in_memory`, one polled): once collected, its reader process ends, its
    receiving thread too, and its spare (`Spare`'s own finalizer)."""
    before = reader_processes()
    threads = {t.ident for t in threading.enumerate()}
    mariadb_source.query(f"CREATE TABLE `{source_db}`.gc (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    for i in range(1, 21):
        mariadb_source.query(f"INSERT INTO `{source_db}`.gc VALUES ({i})")
    held = [MysqlBinlogSource.from_config(mariadb_source.source_config(next_server_id(), "earliest"), pipeline="gc",
                                          reader_process=True, max_rows_in_memory=2)]
    held[0].open(start)
    assert first_row(held[0]).after == {"id": 1}
    pid = held[0]._reader.pid
    wait_until(lambda: held[0]._spare.pid is not None, timeout=30, message="the next spare")
    assert pid in reader_processes()
    held.clear()  # its only reference: dropped open
    gc.collect()
    wait_until(lambda: reader_processes() == before, timeout=10,
               message=lambda: f"reader processes of a collected source still running: {reader_processes() - before}")
    wait_until(lambda: not new_threads(threads, "setl-gc-"),
               timeout=10, message="the collected source's receiving thread still running")


def test_a_rollback_passes_over_a_spare_killed_while_waiting(mariadb_source, source_db):
    """A spare killed (-9) while it waited is not handed the setup: the rollback's reopen starts a reader
    process of its own and reads the same rows again."""
    before = reader_processes()
    src = source(mariadb_source)
    mariadb_source.query(f"CREATE TABLE `{source_db}`.kp (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    mariadb_source.query(f"INSERT INTO `{source_db}`.kp VALUES (7)")
    try:
        src.open(start)
        assert first_row(src).after == {"id": 7}
        wait_until(lambda: src._spare.pid in reader_processes(), timeout=30, message="the next spare")
        killed = src._spare.pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: killed not in reader_processes(), timeout=10, message="the killed spare gone")
        src.seek(start)
        assert src._reader.pid not in (None, killed)
        assert first_row(src).after == {"id": 7}
    finally:
        src.close()
    assert reader_processes() == before
