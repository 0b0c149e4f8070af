"""The binlog reader in a process of its own (`sources.reader_process`): socket, framing, decoding
and transaction assembly run in a child Python process, on the other core, and its transactions
reach the parent's `poll` as columns (values per column of each run of like rows), never as pickled
row objects.

`ReaderProcess` is the parent's side, in place of the reader thread (`reader.BinlogReader`): it
starts the child (`python .../reader_child.py`: the reader's modules without the packages'
``__init__``s; never a fork: the parent has threads and a JVM), answers its table-rule questions,
and feeds the open's `handoff.Handoff` from a receiving thread. The child's side is `main`. The two
talk over the child's stdin and stdout in frames (`_write`, `_read`) of pickled plain values:

* parent -> child: `Setup` once, then the answers to `selects` questions. The end of stdin (the
  parent closed it, or died) ends the child at once: no child outlives its parent.
* child -> parent: `_ITEMS` (transactions as `frames.Encoder` encodes them, and the reader's figures
  with the indices of the transactions its reader read late: `ReaderFigures.behind` in the parent),
  `_SELECTS` (a table-rule question: of `selects`, or of `reads` when its last field is
  true) and `_FAILURE` (the reader's end by an error, already one line).

Back-pressure: the child's reader runs ahead into its own `Handoff` (bounded by rows), its sender
blocks on the pipe, and the parent's receiver blocks on the parent's `Handoff`: memory stays
bounded by about twice `max_rows_in_memory` rows in each process. A child that dies is a `Failure`
at the end of the last transaction it handed on: `poll` raises, the scheduler rolls back to the
last ack and opens again (a new child). Nothing is acked that the parent did not take.
Every open's child was started ahead (`Spare`): the first with the source, so that its start-up
overlaps the node's, and each next one while the open before it reads, so that a rollback's reopen
waits for no interpreter start.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import attrs

from setl import errors
from setl.adapters.pymysql import preferred_tls_context
from setl.errors import SourceError
from setl.model import Position, Transaction
from setl.retry import Backoff
from setl.sources.mysql_binlog.frames import Decoder, Encoder
from setl.sources.mysql_binlog.handoff import Failure, Handoff, Item, ReaderFigures, Stopped, weight
from setl.sources.mysql_binlog.opening import Opening
from setl.sources.mysql_binlog.reader import ReaderSettings, failure_error, start_reader
from setl.sources.mysql_binlog.server import Selects, SourceServer
from setl.tls import mysql_context

if TYPE_CHECKING:  # a type only: the reader process imports setl.config only to unpickle a TLS setting
    from setl.config import SslConfig

log = logging.getLogger("setl.sources.mysql_binlog")

_ITEMS, _SELECTS, _FAILURE = 1, 2, 3
_HEADER = struct.Struct("<Q")  # a frame may hold a piece of max_rows_in_memory large rows
#: rows the child gathers into one frame at most, waiting up to `FRAME_WAIT` seconds for them: a frame
#: costs tens of µs each side, which frames of one small transaction each would pay per transaction
FRAME_ROWS = 2_000
FRAME_WAIT = 0.005
#: the pipe's capacity asked for (Linux: F_SETPIPE_SZ, up to /proc/sys/fs/pipe-max-size, 1 MiB by
#: default): with the default 64 KiB a frame of 2,000 sysbench rows (about 600 KB) crossed in ten
#: writes, each waiting for the node to wake and read (on a loaded machine, milliseconds each): the
#: child spent 42% of its time blocked writing while the node's receiver waited for the rest
PIPE_BYTES = 1 << 20
#: the repository root the parent imports setl from: the child imports the same code
_ROOT = Path(__file__).resolve().parents[3]


@attrs.frozen
class ServerSpec:
    """How the child reaches the server (`SourceServer` with its TLS context rebuilt from `ssl`)."""

    host: str
    port: int
    user: str
    password: str = attrs.field(repr=False)
    ssl: SslConfig | None
    connect_timeout: float
    heartbeat: float
    flavor: str
    pipeline: str

    def server(self) -> SourceServer:
        context = mysql_context(self.ssl, where="source.ssl", pipeline=self.pipeline or None) if self.ssl else None
        return SourceServer(self.host, self.port, self.user, password=self.password, ssl=context,
                            connect_timeout=self.connect_timeout, heartbeat=self.heartbeat, flavor=self.flavor,
                            pipeline=self.pipeline)


@attrs.frozen
class Setup:
    """What the child reads first: the server, where the open starts, the reader's settings, and
    whether the pipeline has table rules to ask about (`selects`), and which tables' rows it reads at
    all (`reads`: else every table's rows are decoded)."""

    server: ServerSpec
    opening: Opening
    settings: ReaderSettings
    selects: bool
    reads: bool = False


# --- frames ------------------------------------------------------------------------------------


def _write(out: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=5)
    out.write(_HEADER.pack(len(data)))
    out.write(data)
    out.flush()


def _read(inp: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream (a cut frame counts as the end)."""
    head = inp.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    data = inp.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


# --- starting a child ---------------------------------------------------------------------------


def widen(pipe: IO[bytes]) -> int:
    """Ask for a pipe of `PIPE_BYTES` (the kernel may give less, or refuse: then it stays as it was);
    its capacity now, 0 where it cannot be told."""
    try:
        return fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):  # not Linux, or past pipe-max-size for an unprivileged user
        with contextlib.suppress(OSError, AttributeError):
            return fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ)
        return 0


def spawn() -> subprocess.Popen[bytes]:
    """A reader process: it imports the reader's modules (`reader_child`), then waits for its `Setup` (its
    stdin's first frame)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("reader_child.py"))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
    assert child.stdout is not None
    widen(child.stdout)  # the frames' pipe: a whole frame in one write
    return child


def _end(child: subprocess.Popen[bytes], timeout: float) -> None:
    """End a child: its stdin closed (it exits at once), killed if it does not within `timeout`."""
    with contextlib.suppress(OSError):
        assert child.stdin is not None
        child.stdin.close()
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    if child.stdout is not None:
        child.stdout.close()


def _end_waiting(slot: list[subprocess.Popen[bytes]]) -> None:
    """End the spares in `slot` (`Spare`'s finalizer: its owner was collected without closing it)."""
    while slot:
        _end(slot.pop(), 1.0)


class Spare:
    """A reader process started ahead of an open, so that its start-up (Python and setl's imports: 0.3
    to 1 s of CPU) runs on the other core while the node gets ready or reads, not between an open and
    its first rows. `start` starts the first one with the source; `take` hands the waiting one to an
    open (a rollback's too) and starts the next in the background, so that no open waits for a start;
    `close` ends the waiting one and any start under way. After `close`, and once its owner is
    collected, no child of it lives; a later `take` (an open after a close) takes nothing and starts
    the next again. A spare waits for its setup on stdin: a node that dies ends it as it ends any
    reader process. It never had a setup, so nothing of an earlier open reaches a later one."""

    def __init__(self, pipeline: str = "") -> None:
        self.pipeline = pipeline
        self._slot: list[subprocess.Popen[bytes]] = []  # the waiting child (one at most), shared with the finalizer
        self._lock = threading.Lock()
        self._generation = 0  # bumped by `close`: a start under way from before it ends its child
        self._starting: threading.Thread | None = None
        self._finalizer = weakref.finalize(self, _end_waiting, self._slot)

    @property
    def pid(self) -> int | None:
        """The waiting spare's process id (None: none waits, or it is still being started)."""
        with self._lock:
            return self._slot[0].pid if self._slot else None

    def start(self) -> None:
        """Start the spare now (once: a spare already waiting, or being started, is kept)."""
        with self._lock:
            if self._slot or self._starting is not None:
                return
            self._slot.append(spawn())

    def take(self) -> subprocess.Popen[bytes] | None:
        """The waiting spare, if one is alive (None: the open starts its own); the next is started
        meanwhile, on a thread of its own."""
        with self._lock:
            child = self._slot.pop() if self._slot else None
            thread = None
            if self._starting is None:
                thread = self._starting = threading.Thread(target=_refill, args=(weakref.ref(self), self._generation),
                                                           name=f"setl-{self.pipeline or 'mysql'}-binlog-spare",
                                                           daemon=True)
        if thread is not None:
            thread.start()
        if child is not None and child.poll() is not None:
            _end(child, 1.0)
            return None
        return child

    def close(self, timeout: float = 5.0) -> None:
        """End the waiting spare and any start under way (joined)."""
        with self._lock:
            self._generation += 1
            waiting, self._slot[:] = list(self._slot), []
            thread = self._starting
        if thread is not None:
            thread.join(timeout)  # it ends the child it started itself
        for child in waiting:
            _end(child, timeout)

    def _keep(self, child: subprocess.Popen[bytes] | None, generation: int) -> subprocess.Popen[bytes] | None:
        """Keep a child `_refill` started as the waiting spare, unless `close` came meanwhile (then it
        is returned, to be ended)."""
        with self._lock:
            self._starting = None
            if child is not None and generation == self._generation and not self._slot:
                self._slot.append(child)
                return None
        return child


def _refill(owner: weakref.ref[Spare], generation: int) -> None:
    """A `Spare`'s thread: the next spare, kept unless `close` came meanwhile or the `Spare` was
    collected (it holds its `Spare` weakly, so that an owner dropped unclosed is collected)."""
    spare = owner()
    pipeline = spare.pipeline if spare is not None else ""
    del spare
    try:
        child: subprocess.Popen[bytes] | None = spawn()
    except Exception as exc:  # noqa: BLE001 - the next open starts its own child (and says why it cannot)
        log.warning("pipeline=%s could not start a spare binlog reader process: %s", pipeline, exc)
        child = None
    spare = owner()
    if spare is not None:
        child = spare._keep(child, generation)
    del spare
    if child is not None:
        _end(child, 1.0)


# --- the parent's side -------------------------------------------------------------------------


class ReaderProcess:
    """One open's reader process and the parent's thread that receives from it; `start` once,
    `stop` once (as `reader.BinlogReader`). What it receives goes to `handoff`, what the child's
    reader did to `figures`; `selects` answers the child's table-rule questions. An open one dropped
    without `stop` (its source collected unclosed) ends its child when it is collected: the receiving
    thread holds only its `_Receiver`, never it."""

    def __init__(self, server: ServerSpec, opening: Opening, settings: ReaderSettings, handoff: Handoff,
                 figures: ReaderFigures, selects: Selects, reads: Callable[[str, str], bool] | None = None) -> None:
        self.setup = Setup(server, opening, settings, selects is not None, reads is not None)
        self.reads = reads
        self.handoff = handoff
        self.figures = figures
        self.selects = selects
        self.pipeline = settings.pipeline
        self.process: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._answer = threading.Lock()  # stdin: the receiver's answers against stop's close
        self._finalizer: weakref.finalize[Any, Any] | None = None  # ends the child (`stop`, or collected)

    @property
    def pid(self) -> int | None:
        """The child's process id (None: not started)."""
        return self.process.pid if self.process is not None else None

    def start(self, spare: subprocess.Popen[bytes] | None = None) -> None:
        """Start the child (or take `spare`, one `Spare` started ahead) and hand it the setup; a thread
        of its own receives what it reads."""
        self.process = spare if spare is not None else spawn()
        try:
            assert self.process.stdin is not None
            _write(self.process.stdin, self.setup)
        except OSError:
            if spare is None:
                raise
            _end(spare, 1.0)  # the spare died meanwhile: a new child
            self.process = spawn()
            assert self.process.stdin is not None
            _write(self.process.stdin, self.setup)
        self._finalizer = weakref.finalize(self, _end_reader, self.process, self._stop, self._answer, self.pipeline,
                                           1.0)
        receiver = _Receiver(self.process, self.setup.opening.position, self.handoff, self.figures, self.selects,
                             self.reads, self._stop, self._answer, self.pipeline)
        self.thread = threading.Thread(target=receiver.run, name=f"setl-{self.pipeline or 'mysql'}-binlog-process",
                                       daemon=True)
        self.thread.start()
        log.info("pipeline=%s binlog reader process started (pid %d)", self.pipeline, self.process.pid)

    def stop(self, timeout: float) -> None:
        """End the child (its stdin closed: it exits at once), then the receiving thread."""
        self._stop.set()
        process = self.process
        if process is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        _end_reader(process, self._stop, self._answer, self.pipeline, timeout)
        if self.thread is not None:
            self.thread.join(timeout)
        if process.stdout is not None:
            process.stdout.close()


def _end_reader(process: subprocess.Popen[bytes], stop: threading.Event, answer: threading.Lock, pipeline: str,
                timeout: float) -> None:
    """End a reader process (`ReaderProcess.stop`, or its finalizer): the receiver told to stop, the
    child's stdin closed (it exits at once), killed if it does not within `timeout`."""
    stop.set()
    with answer, contextlib.suppress(OSError):
        assert process.stdin is not None
        process.stdin.close()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("pipeline=%s binlog reader process %d did not exit within %.0fs; killed", pipeline,
                    process.pid, timeout)
        process.kill()
        process.wait()


class _Receiver:
    """The parent's receiving thread of one reader process: the child's frames into the hand-off,
    until the child's end. It holds what it needs, not its `ReaderProcess` (see there)."""

    def __init__(self, process: subprocess.Popen[bytes], start: Position | None, handoff: Handoff,
                 figures: ReaderFigures, selects: Selects, reads: Callable[[str, str], bool] | None,
                 stop: threading.Event, answer: threading.Lock, pipeline: str) -> None:
        self.process, self.start, self.handoff, self.figures = process, start, handoff, figures
        self.selects, self.reads, self.stop, self.answer, self.pipeline = selects, reads, stop, answer, pipeline

    def run(self) -> None:
        process = self.process
        assert process.stdout is not None
        handoff, figures, stop = self.handoff, self.figures, self.stop
        handed: Position | None = self.start
        reconnects = 0
        decoder = Decoder()

        def mark() -> None:
            figures.late = time.time()

        try:
            while True:
                message = _read(process.stdout)
                if message is None:
                    break
                if message[0] == _ITEMS:
                    _, frame, (heard, arrivals, child_reconnects, peak, passed, late) = message
                    txs = decoder.frame(frame)
                    if late is None:  # none read late (at the log's end)
                        handoff.put_all(txs, stop)
                    else:  # as the reader thread: `late` set, then the transaction read late handed on
                        handoff.put_all(txs, stop, range(len(txs)) if late is True else frozenset(late), mark)
                    if txs:
                        handed = txs[-1].end
                    # after the transactions they follow: "heard" never runs ahead of what poll can take
                    if heard is not None:
                        figures.heard = heard
                    figures.passing(passed)
                    figures.arrivals.extend(arrivals)
                    figures.reconnects += child_reconnects - reconnects
                    reconnects = child_reconnects
                    figures.buffered(handoff.queued_with(peak))
                elif message[0] == _SELECTS:
                    rules = self.reads if message[3] else self.selects
                    answer = rules is None or bool(rules(message[1], message[2]))
                    with self.answer, contextlib.suppress(OSError, ValueError):
                        assert process.stdin is not None
                        _write(process.stdin, answer)
                else:  # _FAILURE: the reader's end, already one line
                    _, name, text, context, position = message
                    cls = getattr(errors, name, SourceError)
                    if not (isinstance(cls, type) and issubclass(cls, SourceError)):
                        cls = SourceError
                    handoff.put(Failure(cls(text, **context), position), stop)
                    return
            if stop.is_set():
                return
            code = process.wait()
            cause = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            error = SourceError(f"the binlog reader process (pid {process.pid}) {cause} after {handed or 'the start'}"
                                "; the pipeline rolls back to its last ack and reads again from there",
                                pipeline=self.pipeline or None, stage="select", position=handed)
            handoff.put(Failure(error, handed), stop)
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - every failure reaches poll(); none kills the thread silently
            if not stop.is_set():
                with contextlib.suppress(Stopped):
                    handoff.put(Failure(exc, handed), stop)


# --- the child's side --------------------------------------------------------------------------


class _Questions:
    """The child's table rules: each (schema, table) asked of the parent once, then remembered (the
    parent's routing plan keeps its answers too)."""

    def __init__(self, out: IO[bytes], write: threading.Lock, answers: queue.Queue[Any], lock: threading.Lock,
                 reads: bool = False) -> None:
        self.out, self.write, self.answers = out, write, answers
        self.known: dict[tuple[str, str], bool] = {}
        self.lock = lock  # one question at a time across the child's rule sets: they share `answers`
        self.reads = reads  # asks whose rows are read at all, not whose changes are handed on

    def __call__(self, schema: str, table: str) -> bool:
        key = (schema, table)
        with self.lock:
            if key not in self.known:
                with self.write:
                    _write(self.out, (_SELECTS, schema, table, self.reads))
                self.known[key] = bool(self.answers.get())
            return self.known[key]


class _LateFigures(ReaderFigures):
    """The child reader's figures: each time its reader read transactions late (`late` set, just
    before it hands them on) is counted, so that `_LateHandoff` can tell which transaction followed."""

    def __init__(self) -> None:
        self.late_reads = 0  # times `late` was set (its first, by `ReaderFigures.__init__`, not counted)
        super().__init__()
        self.late_reads = 0

    @property
    def late(self) -> float:
        return self._late

    @late.setter
    def late(self, now: float) -> None:
        self._late = now
        self.late_reads += 1


class _LateHandoff(Handoff):
    """The child's hand-off: notes, by its number in the order put, each item the reader put first
    after reading late (`_LateFigures`), so that the parent hands it on as the reader thread does:
    `late` set, then the transaction handed on (`ReaderFigures.behind`). The sender takes the items
    in the same order and numbers them alike."""

    def __init__(self, max_rows: int, figures: _LateFigures) -> None:
        super().__init__(max_rows)
        self.figures = figures
        self.late: collections.deque[int] = collections.deque()  # numbers of the items put first after a late read
        self._seen = 0  # figures.late_reads at the last put
        self._puts = 0

    def put(self, item: Item, stop: threading.Event) -> None:
        reads = self.figures.late_reads
        if reads != self._seen:
            self._seen = reads
            self.late.append(self._puts)  # before the item is queued: the sender finds it here when it takes it
        self._puts += 1
        super().put(item, stop)


def _figures(figures: ReaderFigures, late: list[int] | None = None, items: int = 0) -> tuple[Any, ...]:
    """The figures sent with a frame of `items` transactions; `late`: the indices in the frame of those
    read late (sent as None: none, True: all)."""
    arrivals = []
    while figures.arrivals:
        arrivals.append(figures.arrivals.popleft())
    marks: bool | tuple[int, ...] | None = (None if not late else True if len(late) == items else tuple(late))
    return (figures.heard, arrivals, figures.reconnects, figures.peak_buffered_rows, figures.passed, marks)


def main() -> int:
    """The child: read the setup, start the reader thread, send what it hands on until the end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it (stdin's end); a ^C is the parent's
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s binlog-reader[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not corrupt the frames
    # While it waits as a spare: the TLS context of PyMySQL's preferred mode (the system's CA certificates
    # loaded, once per process) that its first connection would otherwise build after the setup
    preferred_tls_context()
    setup: Setup | None = _read(inp)
    if setup is None:
        return 0
    answers: queue.Queue[Any] = queue.Queue()

    def watch() -> None:  # the parent's answers; the end of stdin is the parent's stop or death
        while (message := _read(inp)) is not None:
            answers.put(message)
        os._exit(0)

    threading.Thread(target=watch, name="setl-binlog-process-parent", daemon=True).start()
    write = threading.Lock()
    asking = threading.Lock()
    selects: Callable[[str, str], bool] | None = _Questions(out, write, answers, asking) if setup.selects else None
    reads: Callable[[str, str], bool] | None = (_Questions(out, write, answers, asking, reads=True) if setup.reads
                                                 else None)
    figures = _LateFigures()
    handoff = _LateHandoff(setup.settings.max_rows_in_memory, figures)
    try:
        server = setup.server.server()
        start_reader(server, setup.opening, attrs.evolve(setup.settings, plain_rows=True), handoff, figures,
                     Backoff(initial=0.1, maximum=2.0, max_attempts=0), selects, reads)
    except Exception as exc:  # noqa: BLE001 - the parent says it in one line (a TLS file, say)
        text = exc.message if isinstance(exc, errors.SetlError) else f"{type(exc).__name__}: {exc}"
        with write:
            _write(out, (_FAILURE, "SourceError", f"the binlog reader process could not start: {text}", {},
                         setup.opening.position))
        return 1
    encoder = Encoder()
    sent_passed = None
    taken = 0  # items taken from `handoff`: numbered as `_LateHandoff.put` numbers them
    late_puts = handoff.late
    while True:
        item = handoff.take(0.2)
        if item is None and figures.passed != sent_passed:  # read past echoes only: the figures alone
            sent_passed = figures.passed
            with write:
                _write(out, (_ITEMS, encoder.frame([]), _figures(figures)))
            continue
        items: list[Transaction] = []
        late: list[int] = []  # indices in `items` of those read late
        rows = 0
        gather_until = time.monotonic() + FRAME_WAIT  # a frame costs both sides; a few ms fill it
        while item is not None:
            if isinstance(item, Failure):
                if items:
                    with write:
                        _write(out, (_ITEMS, encoder.frame(items), _figures(figures, late, len(items))))
                error = failure_error(item, server, setup.settings.pipeline)
                with write:
                    _write(out, (_FAILURE, type(error).__name__, error.message, error.context, item.position))
                return 0
            if late_puts and late_puts[0] == taken:
                late_puts.popleft()
                late.append(len(items))
            taken += 1
            items.append(item)
            rows += weight(item)
            item = None
            if rows < FRAME_ROWS:
                item = handoff.take(None)
                if item is None and (left := gather_until - time.monotonic()) > 0:
                    item = handoff.take(left)
        with write:
            _write(out, (_ITEMS, encoder.frame(items), _figures(figures, late, len(items))))
