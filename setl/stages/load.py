"""The Load contract: apply a batch to the target, idempotently and in batch order."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from setl.errors import LoadError
from setl.model import Batch, Position, Quarantined


@attrs.frozen
class LoadCapabilities:
    """What a target can do, declared by its connector (`setl.connectors.TargetConnector`)
    rather than guessed from which methods its Load overrides.

    * `per_table`: `load_part` and `mark_loaded` work, so ``pipeline.load.mode: per_table`` may run.
    * `stores_position`: `committed()` returns the end of the last batch the target recorded
      in the same transaction as its rows (None only before the first batch).
    * `creates_tables`: the target creates a table the first time a batch touches it.
    * `sequences`: the target applies a sequence's state rows (`setl.model.RowChange.sequence`):
      pipeline assembly then has the source hand them on (sources drop them otherwise).
    * `copy_end`: the target takes the end-of-copy marker (`setl.model.DdlChange.copy_end`) a
      snapshot hands on after a table's last chunk: pipeline assembly then has the snapshot hand
      it on (and a copy counts as done only once the batch holding it is acked).
    * `quarantine`: the target keeps a quarantine (``on_table_error: quarantine``, docs/quarantine.md):
      pipeline assembly then has a binlog source hand on a row change logged as a statement as a
      marker that quarantines its table (`setl.model.DdlChange.logged_rows`), not stop.
    """

    per_table: bool = False
    stores_position: bool = False
    creates_tables: bool = False
    sequences: bool = False
    copy_end: bool = False
    quarantine: bool = False


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
    * A snapshot read (`Op.READ`: an after image only, a row an initial snapshot copied) is
      "insert, or replace the row with the same key" in a keyed table: a batch of reads applied
      twice leaves the target as applied once, a read replaces what an earlier insert or update
      of its key (in the batch or before it) left, and a later delete removes it. In a table
      without a primary key it is a plain insert. A target that keeps a change log writes it
      with op ``read``. Runs of reads come in chunks of thousands of rows of one table: apply
      them in bulk, not row by row. The connector kit's `LoadContract` checks all of this.
    * A target that can store the batch's end position in the same transaction
      as its rows returns it from `committed()`; the scheduler then never
      resumes from before it. Others return None.
    * `close()` may never be called if the process is killed.
    * `capabilities` says what else it can do; the connector registry sets it on every Load it
      builds from the connector's declaration, and a Load made by hand declares it on its class.
    """

    capabilities: LoadCapabilities = LoadCapabilities()

    def open(self) -> None:
        """Connect to the target. May block."""

    def load(self, batch: Batch) -> None:
        raise NotImplementedError

    def prepare(self, batch: Batch) -> None:
        """`batch` (this very object) will be loaded later: work out now what `load` needs that
        does not touch the target (merged changes, statement texts), so that the ordered load
        spends its turn on the target. Optional: the base does nothing.

        Called by the scheduler's workers once a batch is extracted and transformed, concurrently
        for different batches and with `load` of earlier ones. It must not write to the target,
        nor change what `load` does: `load` of a batch that was not prepared, or of another batch
        object, or after whatever the preparation assumed changed (a DDL, a reconnect), works it
        out itself. An exception it raises is ignored (`load` meets the same problem and reports it).
        """

    def load_part(self, batch: Batch) -> None:
        """Apply one target table's share of a batch, without recording the batch's position.

        Used by ``pipeline.load.mode: per_table``. `batch` keeps its id, epoch and positions
        but holds only the changes of one target table, in log order. Parts of one table
        come in batch order; parts of different tables may be loaded concurrently, so an
        implementation serialises internally what cannot be shared. Once every part of a
        batch is in, the scheduler calls `mark_loaded`, in batch order. Only a Load whose
        `capabilities.per_table` is true runs per_table (the scheduler refuses at start).
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

    def quarantined(self) -> list[Quarantined]:
        """The pipeline's quarantined tables as the target records them (docs/quarantine.md); a
        target that keeps no quarantine has none."""
        return []

    def quarantine_view(self) -> list[Quarantined]:
        """The quarantined tables as this Load last saw them in a batch (no I/O: for live figures)."""
        return []

    def replay(self, table: str, *, chunk: int = 1000, progress: Callable[[int, int], None] | None = None) -> int:
        """Apply the changes kept for quarantined `table` in order, then end its quarantine (`setl
        resume --table`); the number applied."""
        raise LoadError(f"this target keeps no quarantine: {table} cannot be quarantined", stage="load", table=table)

    def close(self) -> None:
        """Release resources. Idempotent."""


class LoadWrapper(Load):
    """A Load around another (`inner`) that forwards every call; subclasses override what they
    change (fencing, batch DDL tasks, fault injection).

    `capabilities` are the inner Load's, except `per_table`: `load_part` and `mark_loaded` are
    not forwarded, so a wrapper loads per table only when it declares `parts = True` (and
    overrides both) and its inner Load can.
    """

    #: Whether this wrapper implements `load_part` and `mark_loaded` (around an inner Load's).
    parts: bool = False

    def __init__(self, inner: Load) -> None:
        self.inner = inner

    @property
    def capabilities(self) -> LoadCapabilities:  # type: ignore[override]
        inner = self.inner.capabilities
        return inner if self.parts or not inner.per_table else attrs.evolve(inner, per_table=False)

    def open(self) -> None:
        self.inner.open()

    def load(self, batch: Batch) -> None:
        self.inner.load(batch)

    def prepare(self, batch: Batch) -> None:
        """Forwarded: a wrapper that loads another batch object than it is given makes the inner
        Load's preparation unused, never wrong."""
        self.inner.prepare(batch)

    def committed(self) -> Position | None:
        return self.inner.committed()

    def committed_epoch(self) -> int | None:
        return self.inner.committed_epoch()

    def quarantined(self) -> list[Quarantined]:
        return self.inner.quarantined()

    def quarantine_view(self) -> list[Quarantined]:
        return self.inner.quarantine_view()

    def replay(self, table: str, *, chunk: int = 1000, progress: Callable[[int, int], None] | None = None) -> int:
        return self.inner.replay(table, chunk=chunk, progress=progress)

    def close(self) -> None:
        """Close what this layer holds itself (`close_own`), then the inner Load, whatever the first does."""
        try:
            self.close_own()
        finally:
            self.inner.close()

    def close_own(self) -> None:
        """Close what this layer holds itself (nothing here)."""


def supports_per_table(load: Load) -> bool:
    """Whether `load` declares it can load per table (`LoadCapabilities.per_table`), as
    ``load.mode: per_table`` needs."""
    return load.capabilities.per_table
