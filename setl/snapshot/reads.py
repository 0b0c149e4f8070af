"""The copy scheduler: the reader threads that read the table copies' chunks, which copy each
reads next, and the room they read into (`CopyReads`)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

import pymysql

from setl.errors import SetlError, SourceError
from setl.model import Position
from setl.snapshot.copies import Copy, CopyBook
from setl.snapshot.ledger import Chunk
from setl.snapshot.reader import ChunkReader
from setl.stages.select import Select

log = logging.getLogger("setl.snapshot")

#: Server errors of a chunk read on a table altered under it: unknown column, table definition
#: changed, no such table, key column gone.
_ALTERED_ERRORS = frozenset({1054, 1412, 1146, 1176})


class CopyReads:
    """`readers` threads, each claiming a copy with a chunk to read and reading it on a connection
    of its own into the book's merge (`CopyBook`), at most `max_chunks` read (or being claimed)
    and not handed on. A keyless copy is one read whose pieces are counted against its own room.

    The threads block on the book's lock and on the server; `shutdown` stops them (and bumps the
    generation, so their reads in flight are dropped) and joins them. A reader that fails leaves
    its error in `book.failure` for the poll thread to raise; a read of a table altered under it
    fails with a `SourceError` that is retried (the next attempt plans the table again)."""

    def __init__(self, book: CopyBook, *, reader: ChunkReader, connection: Callable[[], Any], inner: Select,
                 pipeline: str, where: str, readers: int, chunk_rows: int, max_chunks: int,
                 spark_reads: Any = None) -> None:
        self.book = book
        self.reader = reader
        self.connection = connection
        self.inner = inner  # its head() is read while a keyless table's SELECT runs
        self.pipeline = pipeline
        self.where = where
        self.readers = readers
        self.chunk_rows = chunk_rows
        self.max_chunks = max_chunks
        self.spark_reads = spark_reads
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()  # set by `shutdown`; a new one for the threads of the next open

    def start(self) -> None:
        """Start reader threads up to `readers` (those still alive are kept)."""
        self.threads = [t for t in self.threads if t.is_alive()]
        while len(self.threads) < self.readers:
            thread = threading.Thread(target=self._read_loop, args=(self.stop,),
                                      name=f"setl-{self.pipeline}-snapshot-{len(self.threads)}", daemon=True)
            self.threads.append(thread)
            thread.start()

    def shutdown(self) -> None:
        """Stop the readers (their reads in flight are no longer wanted) and join them."""
        self.stop.set()
        with self.book.lock:
            self.book.stop_reads()
        for thread in self.threads:
            thread.join(30.0)
            if thread.is_alive():
                log.warning("pipeline=%s snapshot reader %s did not stop within 30s", self.pipeline, thread.name)
        self.threads = []

    def _claim(self, stop: threading.Event) -> tuple[int, Copy] | None:
        """Under the lock, waiting for room: a copy with a chunk to read, claimed (`CopyBook.claim`)."""
        book = self.book
        while not stop.is_set():
            copy = book.claim(self.max_chunks)
            if copy is not None:
                return book.generation, copy
            book.lock.wait(0.2)
        return None

    def _read_loop(self, stop: threading.Event) -> None:
        conn = None
        copy: Copy | None = None
        try:
            while not stop.is_set():
                with self.book.lock:
                    claimed = self._claim(stop)
                if claimed is None:
                    return
                generation, copy = claimed
                if conn is None:
                    conn = self.connection()
                try:
                    if copy.plan.keyless:
                        self._read_keyless(conn, generation, copy)
                    else:
                        self._read_chunk(conn, generation, copy)
                except BaseException:
                    with self.book.lock:
                        copy.released()
                    raise
        except BaseException as exc:
            if not stop.is_set():
                log.debug("pipeline=%s snapshot reader failed", self.pipeline, exc_info=True)
                error = exc if isinstance(exc, SetlError) else SourceError(
                    f"snapshot read failed: {type(exc).__name__}: {exc}", pipeline=self.pipeline, stage="select",
                    table=str(copy.plan.name) if copy is not None else None, position=self.book.merge.frontier)
                with self.book.lock:
                    self.book.fail(error)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):  # closing a connection that may be broken already
                    conn.close()

    def _read_chunk(self, conn: Any, generation: int, copy: Copy) -> None:
        book = self.book
        lower = copy.lower
        try:
            upper = self.reader.boundary(conn, copy.plan, lower, self.chunk_rows)
        except pymysql.MySQLError as exc:
            raise self._read_error(copy, exc)  # noqa: B904 (it sets its own cause)
        with book.lock:
            if generation != book.generation:
                return
            index = copy.claimed(upper)
            rid = book.register(generation)
            book.lock.notify_all()
        try:
            if self.spark_reads is not None:
                rows, position = self.spark_reads.read(copy.plan, lower, upper)
            else:
                rows, position = self.reader.read(conn, copy.plan, lower, upper,
                                                  lambda at: book.started(generation, rid, at))
        except BaseException as exc:
            with book.lock:
                book.ended(generation, rid)
            if isinstance(exc, pymysql.MySQLError):
                raise self._read_error(copy, exc)  # noqa: B904 (it sets its own cause)
            raise
        chunk = Chunk(copy.plan.name, generation, index, tuple(rows), position, lower, upper, upper is None,
                      copy=copy.serial)
        with book.lock:
            book.ended(generation, rid, chunk)

    def _read_keyless(self, conn: Any, generation: int, copy: Copy) -> None:
        book = self.book
        with book.lock:
            copy.claimed_whole()
            rid = book.register(generation)
        index = itertools.count()
        position: list[Position] = []

        def started(at: Position) -> None:
            position.append(at)
            book.started(generation, rid, at)

        def piece(rows: list[dict[str, Any]], final: bool) -> None:
            chunk = Chunk(copy.plan.name, generation, next(index), tuple(rows), position[0], None, None, final,
                          copy=copy.serial)
            with book.lock:
                # Room is counted in this read's own pieces: they are the only chunks that can be
                # handed on while it runs (its open read holds back everything placed after its
                # snapshot), so waiting for other chunks to go would wait for ever.
                while (generation == book.generation and not self.stop.is_set()
                       and copy.serial not in book.abandoned and book.queued[copy.serial] >= self.max_chunks):
                    book.lock.wait(0.2)
                if generation != book.generation or self.stop.is_set() or copy.serial in book.abandoned:
                    raise _Abandoned()
                book.place(chunk)
                if final:
                    book.merge.read_ended(rid)
                book.lock.notify_all()

        def running() -> None:
            head = self.inner.head()  # the binlog's end once the SELECT holds its lock
            with book.lock:
                book.window(copy, position[0], head, generation)

        try:
            self.reader.read_all(conn, copy.plan, self.chunk_rows, started, piece, running)
        except _Abandoned:
            pass
        except pymysql.MySQLError as exc:
            raise self._read_error(copy, exc)  # noqa: B904 (it sets its own cause)
        finally:
            with book.lock:
                book.ended(generation, rid)

    def _read_error(self, copy: Copy, exc: BaseException) -> SourceError:
        """The error to raise (``from`` it) for a chunk read that failed with `exc`."""
        error = SourceError(f"snapshot read of {self.where} failed: {exc}", pipeline=self.pipeline, stage="select",
                            table=str(copy.plan.name), position=self.book.merge.frontier)
        code = exc.args[0] if isinstance(exc, pymysql.MySQLError) and exc.args else None
        if code in _ALTERED_ERRORS:
            # The server's error would say retrying cannot help (an unknown column), but the next
            # attempt plans the table again: the copy goes on with its new definition, or starts
            # again if its key changed. Raised without that cause, so that it is retried.
            error.message += (" (the table was altered while being copied: the pipeline retries, and the copy "
                              "goes on with its new definition, or starts again if its primary key changed)")
            error.__suppress_context__ = True
            return error
        error.__cause__ = exc
        return error


class _Abandoned(Exception):
    """A keyless read whose results are no longer wanted (a rewind, or a stop)."""
