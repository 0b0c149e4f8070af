"""What a scheduler tells the outside: why it returned (`Outcome`) and hooks as it runs (`Listener`)."""

from __future__ import annotations

import enum

from setl.model import Ack, Batch


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
