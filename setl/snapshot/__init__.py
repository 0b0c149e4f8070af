"""Initial and on-demand snapshots of MySQL/MariaDB tables, lock-free and resumable.

`SnapshotSelect` wraps the binlog source: it copies the selected tables in chunks split on their
primary key, each chunk in a short consistent-snapshot transaction whose binlog position places it
among the binlog's transactions (see docs/snapshot.md). Progress lives in the meta store.
"""

from setl.tablecopy import CopyStatus, TableProgress

__all__ = ["CopyStatus", "TableProgress"]
