"""What a scheduler tells the outside: why it returned (`Outcome`) and hooks as it runs (`Listener`)."""

from __future__ import annotations

import enum
import logging

from setl.model import Ack, Batch

log = logging.getLogger("setl.scheduler")


def log_event(pipeline: str, stage: str, batch: Batch | None, message: str, level: int = logging.INFO) -> None:
    """Log `message` on the scheduler's logger, prefixed with the pipeline, stage and batch it concerns."""
    where = f"pipeline={pipeline} stage={stage}"
    if batch is not None:
        where += f" batch={batch.id}"
    log.log(level, "%s %s", where, message)


class Outcome(str, enum.Enum):
    """Why `Scheduler.run` returned."""

    CAUGHT_UP = "caught_up"  # the acked position reached the `until` position
    STOPPED = "stopped"  # stop() was called; in-flight batches were drained
    PAUSED = "paused"  # retries ran out; the pause and its error are persisted
    LOST = "lost"  # leadership was lost; nothing after the last ack was acked


class Listener:
    """Hooks a test or a metrics exporter can override; they run on scheduler threads and must not block."""

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        """Select handed `batch` on; `in_flight` batches now hold permits."""

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        """`batch` gave its permit back (acked, or discarded and its worker done)."""

    def on_termin(self, batch: Batch, ok: bool) -> None:
        """Termin took `batch`'s result, in batch-id order."""

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        """The position after `batch` was persisted."""

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        """Batch `batch_id` failed; every later batch was discarded; `epoch` is the new epoch."""

    def on_retry(self, batch_id: int, attempt: int, delay: float) -> None:
        """After a rollback: the replay starts again in `delay` seconds (attempt `attempt`)."""

    def on_pause(self, batch_id: int, error: BaseException) -> None:
        """After a rollback: retrying is over, the pipeline pauses with `error`."""

    def on_stage(self, stage: str, batch: Batch, seconds: float) -> None:
        """`batch` spent `seconds` in `stage`: select (its first transaction to its hand-on),
        extract, transform, load (per_table: dispatch until every part is in), termin (the ack's write)."""

    def on_permit_wait(self, seconds: float) -> None:
        """Select waited `seconds` for one of the pipeline's permits (all its batches were in flight)."""


class Forwarding(Listener):
    """A listener that passes every hook on to `inner`: a wrapper overrides only the hooks it adds
    to (calling ``super()``), so a hook added to `Listener` later still reaches `inner`."""

    def __init__(self, inner: Listener) -> None:
        self.inner = inner

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        self.inner.on_handoff(batch, in_flight)

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        self.inner.on_retire(batch, in_flight)

    def on_termin(self, batch: Batch, ok: bool) -> None:
        self.inner.on_termin(batch, ok)

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        self.inner.on_ack(ack, batch)

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        self.inner.on_rollback(batch_id, epoch, error, attempt)

    def on_retry(self, batch_id: int, attempt: int, delay: float) -> None:
        self.inner.on_retry(batch_id, attempt, delay)

    def on_pause(self, batch_id: int, error: BaseException) -> None:
        self.inner.on_pause(batch_id, error)

    def on_stage(self, stage: str, batch: Batch, seconds: float) -> None:
        self.inner.on_stage(stage, batch, seconds)

    def on_permit_wait(self, seconds: float) -> None:
        self.inner.on_permit_wait(seconds)


class Fanout(Listener):
    """Every hook goes to each of `listeners`, in order; one that raises is logged and skipped."""

    def __init__(self, *listeners: Listener) -> None:
        self.listeners = listeners

    def _each(self, hook: str, *args: object) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, hook)(*args)
            except Exception:
                log.exception("listener %s.%s failed", type(listener).__name__, hook)

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        self._each("on_handoff", batch, in_flight)

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        self._each("on_retire", batch, in_flight)

    def on_termin(self, batch: Batch, ok: bool) -> None:
        self._each("on_termin", batch, ok)

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        self._each("on_ack", ack, batch)

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        self._each("on_rollback", batch_id, epoch, error, attempt)

    def on_retry(self, batch_id: int, attempt: int, delay: float) -> None:
        self._each("on_retry", batch_id, attempt, delay)

    def on_pause(self, batch_id: int, error: BaseException) -> None:
        self._each("on_pause", batch_id, error)

    def on_stage(self, stage: str, batch: Batch, seconds: float) -> None:
        self._each("on_stage", stage, batch, seconds)

    def on_permit_wait(self, seconds: float) -> None:
        self._each("on_permit_wait", seconds)
