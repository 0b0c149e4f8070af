"""The Load contract: apply a batch to the target, idempotently and in batch order."""

from __future__ import annotations

from setl.model import Batch, Position


class Load:
    """Applies batches to a target.

    Contract for implementations:

    * `load` is called by one thread at a time, in strictly ascending batch-id
      order within an epoch. After a rollback the same id may come again with
      a higher epoch and different contents.
    * It may block (network writes). When it returns, the batch is durably in
      the target; when it raises, the target holds none of it, or holds a part
      that replaying the batch will overwrite.
    * Loads are idempotent: the same changes applied twice leave the target as
      applied once, because replays after a crash are normal (at-least-once).
      Changes carry full row images, so an upsert of the last image is enough.
    * A target that can store the batch's end position in the same transaction
      as its rows returns it from `committed()`; the scheduler then never
      resumes from before it. Others return None.
    * `close()` may never be called if the process is killed.
    """

    def open(self) -> None:
        """Connect to the target. May block."""

    def load(self, batch: Batch) -> None:
        raise NotImplementedError

    def load_part(self, batch: Batch) -> None:
        """Apply one target table's share of a batch, without recording the batch's position.

        Used by ``pipeline.load.mode: per_table``. `batch` keeps its id, epoch and positions
        but holds only the changes of one target table, in log order. Parts of one table
        come in batch order; parts of different tables may be loaded concurrently, so an
        implementation serialises internally what cannot be shared. Once every part of a
        batch is in, the scheduler calls `mark_loaded`, in batch order. Targets that do not
        override this cannot run per_table (the scheduler refuses at start).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot load per table")

    def mark_loaded(self, batch: Batch) -> None:
        """Every part of `batch` is in (per_table): record its end position, if the target keeps one.

        Until then `committed()` must not report the batch, or a restart would skip the
        tables whose parts had not landed.
        """

    def committed(self) -> Position | None:
        """The end position of the last batch the target itself recorded, if it can."""
        return None

    def committed_epoch(self) -> int | None:
        """The epoch of that batch, if the target keeps one and refuses older epochs.

        The scheduler takes its epochs above it, so a rebuilt or switched meta store (whose
        epochs start again at 1) does not leave every batch refused as stale.
        """
        return None

    def close(self) -> None:
        """Release resources. Idempotent."""


class LoadWrapper(Load):
    """A Load around another (`inner`) that forwards every call; subclasses override what they
    change (fencing, batch DDL tasks, fault injection).

    `load_part` and `mark_loaded` are not forwarded: a wrapper that can load per table says so
    by overriding them, since the scheduler offers ``per_table`` only to a Load that does.
    """

    def __init__(self, inner: Load) -> None:
        self.inner = inner

    def open(self) -> None:
        self.inner.open()

    def load(self, batch: Batch) -> None:
        self.inner.load(batch)

    def committed(self) -> Position | None:
        return self.inner.committed()

    def committed_epoch(self) -> int | None:
        return self.inner.committed_epoch()

    def close(self) -> None:
        self.inner.close()


def supports_per_table(load: Load) -> bool:
    """Whether `load` implements `load_part`, which `load.mode: per_table` needs."""
    return type(load).load_part is not Load.load_part
