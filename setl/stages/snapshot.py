"""The snapshot capability: what a source gives `setl.snapshot` so that its tables can be copied
(``source.start: snapshot``, ``setl snapshot --table``) and placed in its stream.

A source connector declares the capability (``SelectCapabilities(snapshots=True)``), and the
Select it builds then implements `SnapshotCapable`: the connector registry refuses a build that
declares it without implementing it. The engine reads only the declaration and
`SnapshotCapable.snapshot_access`; it never looks at a source's class or its private fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from setl.tablecopy import SnapshotSettings


@attrs.frozen
class SnapshotAccess:
    """What copying a source's tables needs, as the source gives it (`SnapshotCapable`).

    * `connect()` opens a new PyMySQL connection (autocommit, ``utf8mb4``) to the server whose
      binary log the source reads, with the source's own credentials and TLS; the caller owns and
      closes it, and each reader thread holds one of its own. It raises `setl.errors.SourceError`,
      naming the server, when it cannot connect.
    * `where` names that server in messages (``host:port``).
    * `task_connect` are the PyMySQL ``connect()`` arguments a Spark task uses to open its own
      connection (``source.snapshot.engine: spark``), password included (never logged); None
      when the connection cannot be shipped to an executor (TLS), and the Spark engine is refused.
    * `start_mode`: the configured start is ``snapshot``: a pipeline with no position copies
      its selected tables first, then follows the log from where the copy began.
    * `selects(schema, table)`: whether the pipeline's table rules take a table (None: all).
    * `settings`: the source's ``source.snapshot`` settings; `batch_rows` the rows of a chunk
      when they do not say (``pipeline.batch.max_rows``).
    """

    connect: Callable[[], Any] = attrs.field(eq=False, repr=False)
    where: str
    task_connect: Mapping[str, Any] | None = attrs.field(default=None, repr=False)
    start_mode: bool = False
    selects: Callable[[str, str], bool] | None = attrs.field(default=None, eq=False)
    settings: SnapshotSettings = attrs.Factory(SnapshotSettings)
    batch_rows: int = 10_000


@runtime_checkable
class SnapshotCapable(Protocol):
    """A source whose tables `setl.snapshot` can copy in primary-key chunks, each placed in its stream.

    Contract for implementations:

    * The source reads a MySQL or MariaDB server's binary log, and its positions are that log's
      ``(file, offset)``: the position a consistent-snapshot transaction reports
      (``Binlog_snapshot_file``, ``Binlog_snapshot_position``) compares with the ends of the
      transactions `poll` hands on, so a chunk read at position Pc is placed after every
      transaction ending at or before Pc and before any ending after it.
    * `snapshot_access` does not connect, may be called more than once, and returns what a
      copy needs (`SnapshotAccess`); connections are opened only when a copy runs.
    * Not guaranteed: that a table copy runs at all. A source declaring the capability is copied
      only when its start is ``snapshot`` or an operator asks (``setl snapshot``).
    """

    def snapshot_access(self) -> SnapshotAccess:
        """What `setl.snapshot` needs to copy this source's tables."""
        ...


__all__ = ["SnapshotAccess", "SnapshotCapable"]
