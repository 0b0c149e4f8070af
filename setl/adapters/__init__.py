"""Adapters to the internals of the libraries setl builds on: each module is the one place setl
touches one library's private names, and it checks at import that the installed release is the
one it was written for (`check_version`).

- `setl.adapters.pymysql`: PyMySQL's packet machinery (commands, packet reads, sequence ids, its
  socket and read timeout, its buffered result), for the binlog stream's dump and framer, the
  snapshot row reader, ``LOAD DATA LOCAL`` and TLS checks.
- `setl.adapters.replication`: python-mysql-replication's packet parser (called by setl's own
  binlog stream), its events converted into setl's values (`setl.binlog_events`) and the fixes setl
  installs into it.
"""

from __future__ import annotations

import importlib.metadata
import logging

log = logging.getLogger("setl.adapters")


def check_version(distribution: str, written_for: str) -> str:
    """The installed release of `distribution`; one WARNING line when it is not `written_for` (the
    release an adapter's use of the library's internals was written and tested against). setl
    still runs: the contract tests (tests/test_library_contracts.py) say whether it may."""
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = "not installed"
    if installed != written_for:
        log.warning("%s %s is installed, but setl's use of its internals was written for %s exactly: run "
                    "tests/test_library_contracts.py against it, or pip install '%s==%s'",
                    distribution, installed, written_for, distribution, written_for)
    return installed
