"""Resident memory of the node's processes, as /proc tells it: the node's own (Python) and its
Spark JVM's (PySpark's gateway process, while one runs). The status page and `setl status` show
both, `/metrics` gives ``setl_process_resident_memory_bytes{process="python"|"jvm"}``."""

from __future__ import annotations

import os

from setl import spark


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of process `pid` (this one by default), None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def jvm_rss_bytes() -> int | None:
    """Resident memory of the node's Spark JVM, None while it runs none."""
    pid = spark.jvm_pid()
    return rss_bytes(pid) if pid is not None else None
