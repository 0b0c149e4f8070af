"""The Transform contract: reshape a batch's rows, possibly on Spark."""

from __future__ import annotations

from setl.model import Batch


class Transform:
    """Turns an extracted batch into the rows to load.

    Contract for implementations:

    * `transform` may be called concurrently for different batches of one
      pipeline (up to `parallelism` at once), so it keeps no per-batch state on
      `self`. It may block for as long as the work takes (a Spark job).
    * It preserves the order of changes to one primary key, and it never drops
      a delete unless the configured transform says so.
    * It returns a batch with the same id, epoch and positions.
    * An exception fails the batch: Termin rolls it back and retries it.

    The base class is the identity: tables without transforms skip Spark.
    """

    def transform(self, batch: Batch) -> Batch:
        return batch

    def close(self) -> None:
        """Release resources. Idempotent; may never be called."""
