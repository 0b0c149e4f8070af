"""`setl start --until-caught-up` on a terminal: a bar per pipeline for how far behind the log end it is.

The bar's length is the binlog bytes the pipeline was behind when it was first measured; it fills
as `bytes_behind` (`setl.observe.lag.Figures`) shrinks, with the rows acked per second and an ETA
from the bytes caught up so far. A source that cannot tell its bytes behind (the file source) shows
its rows acked and rate only. Off a terminal nothing is drawn: the log's progress lines and the
summary at the end say the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from setl.observe.lag import Figures


def describe(figures: Figures | None) -> str:
    """``12.3 MiB behind, 4,100 rows/s, 52,000 rows acked`` (or ``caught up, ...``) for one pipeline."""
    if figures is None:
        return "starting"
    acked = f"{figures.acked_rows:,} rows acked"
    if figures.bytes_behind:
        return f"{figures.bytes_behind / 2**20:,.1f} MiB behind, {figures.rows_per_second:,.0f} rows/s, {acked}"
    if figures.caught_up:
        return f"caught up, {acked}"
    return f"{figures.rows_per_second:,.0f} rows/s, {acked}"


class CatchUpBars:
    """Draws the bars from `figures()` (the node observer's) every `interval` seconds until `stop`.

    While `busy()` is true (a snapshot draws its own bars on the same terminal) nothing is drawn.
    """

    def __init__(self, figures: Callable[[], Mapping[str, Figures | None]], *, console: Any = None,
                 interval: float = 0.5, busy: Callable[[], bool] = lambda: False) -> None:
        self.figures = figures
        self.console = console  # a rich Console (None: stderr)
        self.interval = interval
        self.busy = busy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._widest: dict[str, int] = {}  # the most bytes behind seen: the bar's length

    def start(self) -> "CatchUpBars":
        self._thread = threading.Thread(target=self._run, name="setl-catchup-bars", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        from rich.errors import LiveError
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        bars: Any = None
        tasks: dict[str, Any] = {}
        try:
            while True:
                stopping = self._stop.wait(self.interval)
                if bars is None:
                    if stopping:
                        return
                    if self.busy():
                        continue
                    bars = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
                                    TimeRemainingColumn(), console=self.console, transient=False)
                    try:
                        bars.start()
                    except LiveError:  # another live display holds the terminal: try again later
                        bars = None
                        continue
                if self.busy() and not stopping:  # a table copy wants the terminal: hand it over
                    bars.stop()
                    bars, tasks = None, {}
                    continue
                for name, figures in sorted(self.figures().items()):
                    if name not in tasks:
                        tasks[name] = bars.add_task(f"{name} catching up", total=None, note="starting")
                    self._draw(bars, tasks[name], name, figures)
                if stopping:
                    return
        finally:
            if bars is not None:
                bars.stop()

    def _draw(self, bars: Any, task: Any, name: str, figures: Figures | None) -> None:
        note = describe(figures)
        if figures is None or figures.bytes_behind is None:
            bars.update(task, note=note, total=None)
            return
        widest = self._widest[name] = max(self._widest.get(name, 0), figures.bytes_behind, 1)
        done = widest - figures.bytes_behind
        bars.update(task, total=widest, completed=done, note=note)


def start_bars(node: Any, until_caught_up: bool, *, tty: bool | None = None, console: Any = None) -> CatchUpBars | None:
    """Bars for `node` (a `setl.node.Node` about to run) when `until_caught_up` on a terminal, else None."""
    import sys

    from setl.snapshot.select import find_snapshot

    if not until_caught_up or not (sys.stderr.isatty() if tty is None else tty):
        return None

    def figures() -> Mapping[str, Figures | None]:
        observer = node.observer
        return observer.figures() if observer is not None else {}

    def busy() -> bool:  # a table copy draws its own bars
        for run in list(node._runs):
            snapshot = find_snapshot(run.stages.select)
            if snapshot is not None and snapshot.backlog():
                return True
        return False

    return CatchUpBars(figures, console=console, busy=busy).start()
