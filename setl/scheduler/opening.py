"""A scheduler's source, opened at the acked position while the start reads the target
(`EarlyOpen`): a new leader's binlog connection and the target's fence and position are set up
at the same time instead of one after the other."""

from __future__ import annotations

import logging
import threading

from setl.model import Position
from setl.stages import Select

log = logging.getLogger("setl.scheduler")


class EarlyOpen:
    """Opens `select` at `guess` (the acked position) on a thread of its own, started at once.

    The start then calls `open_at` with where it really starts: the early open is kept when that is
    `guess`, and the source is moved there (`Select.seek`) when the target holds more than the ack;
    a failed early open raises its error then (at `guess`), or opens again at another start.
    `abandon` closes what it opened when the start fails before `open_at`. Nothing else uses the
    select until `open_at` or `abandon` returns.
    """

    def __init__(self, name: str, select: Select, guess: Position) -> None:
        self.name = name
        self.select = select
        self.guess = guess
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, name=f"setl-{name}-open", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            self.select.open(self.guess)
        except BaseException as exc:  # noqa: BLE001 - `open_at` opens again and raises what that raises
            self._error = exc

    def open_at(self, start: Position | None) -> None:
        """Leave the source open at `start` (or raise what opening it there raises)."""
        self._thread.join()
        if self._error is not None:
            if start == self.guess:
                raise self._error
            log.debug("pipeline=%s opening the source early failed; opening at %s: %s", self.name, start, self._error)
            self.select.open(start)
        elif start != self.guess:
            self.select.seek(start)

    def abandon(self) -> None:
        """The start failed before `open_at`: close the source if the early open opened it."""
        self._thread.join()
        if self._error is None:
            try:
                self.select.close()
            except Exception as exc:  # noqa: BLE001 - the start's own failure is what is raised
                log.warning("pipeline=%s closing the source opened early failed: %s", self.name, exc)
