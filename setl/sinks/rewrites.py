"""Values a target's policy wrote differently instead of refusing them (``invalid_dates: null``,
``nul_in_text: strip|escape``), counted per pipeline, table and kind since the process started.

The sinks add to it (`count`); the node's metrics read it at each scrape (`counts`) as the
``setl_values_rewritten`` counter (docs/metrics.md).
"""

from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter[tuple[str, str, str]] = Counter()


def count(pipeline: str, table: str, kind: str, n: int) -> None:
    """`n` values of `table` rewritten by policy `kind` (``invalid_date_null``, ``nul_stripped``, ...)."""
    with _lock:
        _counts[(pipeline, table, kind)] += n


def counts() -> dict[tuple[str, str, str], int]:
    """(pipeline, table, kind) -> values rewritten since the process started."""
    with _lock:
        return dict(_counts)
