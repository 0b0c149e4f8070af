"""Snapshot progress for people: a bar per table on a terminal, else a log line every few seconds."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from setl.tablecopy import CopyStatus, TableProgress

log = logging.getLogger("setl.snapshot")


def describe(progress: TableProgress, now: float | None = None) -> str:
    """``schema.table 12000/50000 rows (24%), 3100 rows/s, ETA 12s`` for one table."""
    now = time.time() if now is None else now
    total = max(progress.estimate, progress.rows)
    share = f" ({100 * progress.rows // total}%)" if total else ""
    text = f"{progress.name} {progress.status.value} {progress.rows}/{total} rows{share}"
    elapsed = (progress.updated if progress.status is CopyStatus.DONE else now) - progress.started
    if progress.started and elapsed > 0 and progress.rows:
        rate = progress.rows / elapsed
        text += f", {rate:.0f} rows/s"
        if progress.status is not CopyStatus.DONE and total > progress.rows:
            text += f", ETA {(total - progress.rows) / rate:.0f}s"
    return text


class ProgressReporter:
    """Shows a pipeline's table copies as their chunks are acked (called from Termin's thread).

    On a terminal (stderr is a tty) a rich progress bar per table (rows of the estimate, rate, ETA);
    otherwise one log line every `every` seconds. Either way a one-line summary when all are done.
    """

    def __init__(self, pipeline: str, every: float = 5.0, *, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, console: Any = None) -> None:
        self.pipeline = pipeline
        self.every = every
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.clock = clock
        self.console = console  # a rich Console for the bars (None: stderr)
        self._next = 0.0
        self._lock = threading.Lock()
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}

    def __call__(self, tables: list[TableProgress], done: bool) -> None:
        with self._lock:
            if self.tty:
                self._draw(tables, done)
            elif done or self.clock() >= self._next:
                self._next = self.clock() + self.every
                copied = sum(t.rows for t in tables)
                left = [t for t in tables if t.status is not CopyStatus.DONE]
                log.info("pipeline=%s snapshot: %d of %d table(s) done, %d rows copied%s", self.pipeline,
                         len(tables) - len(left), len(tables), copied,
                         "; " + "; ".join(describe(t) for t in left[:5]) if left else "")

    def _draw(self, tables: list[TableProgress], done: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        if self._bars is None:
            if done:
                return
            self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), transient=False,
                                  redirect_stderr=self.console is None, console=self.console)
            try:
                self._bars.start()
            except Exception:  # noqa: BLE001 - rich's LiveError: the catch-up bars hold the terminal and give it up soon
                self._bars = None
                return
        for table in tables:
            name = str(table.name)
            if name not in self._tasks:
                self._tasks[name] = self._bars.add_task(f"{self.pipeline} {name}", total=max(table.estimate, 1),
                                                        rate="")
            elapsed = time.time() - table.started if table.started else 0.0
            rate = f"{table.rows / elapsed:.0f} rows/s" if elapsed > 0 and table.rows else ""
            total = table.rows if table.status is CopyStatus.DONE else max(table.estimate, table.rows, 1)
            self._bars.update(self._tasks[name], completed=table.rows, total=max(total, 1), rate=rate)
        if done:
            self._bars.stop()
            self._bars = None
            self._tasks = {}
