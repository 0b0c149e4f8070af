"""setl's fixes to python-mysql-replication (`setl.adapters.replication.install`), with MariaDB's
compressed events read as the plain events they stand for (`compressed.plain_packet`)."""

from __future__ import annotations

from setl.adapters import replication
from setl.sources.mysql_binlog import compressed


def install() -> None:
    """Install the fixes, once per process (the binlog source calls it when it is built)."""
    replication.install(compressed.plain_packet)
