"""setl's fixes to python-mysql-replication (`setl.adapters.replication.install`)."""

from __future__ import annotations

from setl.adapters import replication


def install() -> None:
    """Install the fixes, once per process (the binlog source calls it when it is built)."""
    replication.install()
