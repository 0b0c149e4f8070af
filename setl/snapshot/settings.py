"""The ``source.snapshot`` settings of a MySQL source."""

from __future__ import annotations

from typing import Literal

import attrs


@attrs.frozen
class SnapshotSettings:
    """How tables are copied (``source.start: snapshot``, ``setl snapshot``)."""

    chunk_rows: int = 0  # rows per chunk (split on the primary key by the server); 0: pipeline.batch.max_rows
    readers: int = 0  # chunks read at once; 0: the pipeline's parallelism
    max_chunks: int = 0  # chunks read and not yet handed on, at most; 0: twice the readers
    progress_every: float = 5.0  # seconds between progress log lines when not on a terminal
    #: where chunks are read: python (reader threads of setl) or spark (Spark tasks, on spark.master)
    engine: Literal["python", "spark"] = "python"
