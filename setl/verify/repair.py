"""`setl repair`: what a verify report's differences become, requests the pipeline serves.

A keyed table's differing keys (missing, extra, different, unsettled) become `RepairRequest`s of
at most `KEYS_PER_REQUEST` keys: the running source reads them in one consistent snapshot and
places the result at its binlog position (`setl.snapshot.repair`), so the rows go through Extract,
fencing and the sink like any change. A table that cannot be repaired key by key is copied whole
(a snapshot request, as `setl snapshot --table`): a keyless table, a table whose rule has a row
filter or transforms (a delete carries only the key columns, which a filter or a transform could
not read), or one whose report lists no key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from setl.errors import SetlError, UsageError
from setl.meta.base import MetaStore, RepairRequest
from setl.model import TableName
from setl.tablecopy import CopyStatus

KEYS_PER_REQUEST = 1000
#: a table with more differing keys than this is copied whole (a chunked copy beats key lookups)
WHOLE_ABOVE = 100_000
_DIFFERENCES = ("missing", "extra", "different", "unsettled")


class RepairError(SetlError):
    """A repair that was not served in time."""


@attrs.frozen
class RepairPlan:
    """The requests of one `setl repair`: keys to copy again, and tables to copy whole (with why)."""

    requests: tuple[RepairRequest, ...]
    whole: tuple[tuple[TableName, str], ...]

    @property
    def tables(self) -> list[TableName]:
        return sorted({r.table for r in self.requests} | {t for t, _ in self.whole})

    @property
    def keys(self) -> int:
        return sum(len(r.keys) for r in self.requests)


def load_report(path: Path, pipeline: str) -> dict[str, Any]:
    """A `setl verify --json` report of `pipeline` read from `path` (a usage error otherwise)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--from-report {path}: cannot read a setl verify --json report: {exc}") from exc
    return check_report(report, pipeline, f"--from-report {path}")


def check_report(report: Any, pipeline: str, where: str) -> dict[str, Any]:
    """`report` if it is a `setl verify --json` report of `pipeline`; a UsageError naming `where` otherwise."""
    if not isinstance(report, dict) or not isinstance(report.get("tables"), list):
        raise UsageError(f"{where}: not a setl verify --json report (no tables list)")
    if report.get("pipeline") != pipeline:
        raise UsageError(f"{where} is a report of pipeline {report.get('pipeline')!r}, not {pipeline!r}")
    return report


def _table(text: str) -> TableName:
    try:
        return TableName.parse(text)
    except ValueError as exc:
        raise UsageError(f"report table {exc}") from None


def plan_repairs(report: Mapping[str, Any], whole_reason: Callable[[TableName], str | None],
                 only: Sequence[TableName] = (), *, now: Callable[[], float] = time.time) -> RepairPlan:
    """The requests that repair every difference of `report` (its tables in `only` when given).
    `whole_reason(table)` says why a table must be copied whole (its rule), or None."""
    requests: list[RepairRequest] = []
    whole: list[tuple[TableName, str]] = []
    stamp = f"{int(now() * 1000):013d}"
    for item in report["tables"]:
        table = _table(str(item["source"]))
        if only and table not in only:
            continue
        found = [entry for kind in _DIFFERENCES for entry in item.get(kind) or []]
        if not found:
            continue
        keys = [entry["key"] for entry in found if isinstance(entry.get("key"), dict)]
        reason = whole_reason(table)
        if reason is None and len(keys) != len(found):
            reason = "it has no primary key (rows are compared as a multiset)"
        if reason is None and not keys:
            reason = "the report lists no key"
        if reason is None and len(keys) > WHOLE_ABOVE:
            reason = f"{len(keys):,} differing keys, more than {WHOLE_ABOVE:,}"
        if reason is not None:
            whole.append((table, reason))
            continue
        columns = tuple(keys[0])
        texts = sorted({tuple(str(key[c]) for c in columns) for key in keys})
        for start in range(0, len(texts), KEYS_PER_REQUEST):
            requests.append(RepairRequest(f"{stamp}-{len(requests):05d}", table, columns,
                                          tuple(texts[start:start + KEYS_PER_REQUEST]), now()))
    return RepairPlan(tuple(requests), tuple(whole))


def submit(meta: MetaStore, pipeline: str, plan: RepairPlan) -> None:
    for request in plan.requests:
        meta.request_repair(pipeline, request)
    for table, _ in plan.whole:
        meta.request_snapshot(pipeline, table)


def copies_begun(meta: MetaStore, pipeline: str) -> dict[TableName, float]:
    """When each table's last copy began: a whole-table repair is served once its table's copy
    began at another time than before the request (the node's clock, not this one's) and is done."""
    return {p.name: p.started for p in meta.snapshot_progress(pipeline)}


def outstanding(meta: MetaStore, pipeline: str, plan: RepairPlan, before: Mapping[TableName, float]) -> list[str]:
    """What of `plan` is not served and acked yet (empty when all is); `before` is `copies_begun`
    as it was before the requests were made."""
    ids = {r.id for r in plan.requests}
    left = [f"repair {r.id} of {r.table}" for r in meta.repair_requests(pipeline) if r.id in ids]
    requested = set(meta.snapshot_requests(pipeline))
    progress = {p.name: p for p in meta.snapshot_progress(pipeline)}
    for table in {r.table for r in plan.requests}:
        copy = progress.get(table)
        if copy is not None and copy.status is not CopyStatus.DONE:
            # the node copies it whole instead (a key type it cannot look up), or it was being copied
            left.append(f"copy of {table}")
    for table, _ in plan.whole:
        copy = progress.get(table)
        if (table in requested or copy is None or copy.status is not CopyStatus.DONE
                or (table in before and copy.started == before[table])):
            left.append(f"copy of {table}")
    return left


def wait_served(meta: MetaStore, pipeline: str, plan: RepairPlan, before: Mapping[TableName, float],
                timeout: float, *,
                alive: Callable[[], bool], sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> None:
    """Return once every request of `plan` is served and acked; `RepairError` after `timeout`
    seconds, or as soon as `alive()` says the pipeline stopped running."""
    deadline = clock() + timeout
    while True:
        left = outstanding(meta, pipeline, plan, before)
        if not left:
            return
        if not alive():
            raise RepairError(f"the pipeline stopped before serving {', '.join(left[:3])}"
                              + (f" and {len(left) - 3} more" if len(left) > 3 else "")
                              + ": its next start serves them; then run setl verify", pipeline=pipeline,
                              stage="repair")
        if clock() >= deadline:
            raise RepairError(f"not served within {timeout:.0f}s: {', '.join(left[:3])}"
                              + (f" and {len(left) - 3} more" if len(left) > 3 else "")
                              + " (the requests stay: the node serves them; run setl verify later)",
                              pipeline=pipeline, stage="repair")
        sleep(0.2)


def describe(plan: RepairPlan) -> Iterable[str]:
    tables: dict[TableName, int] = {}
    for request in plan.requests:
        tables[request.table] = tables.get(request.table, 0) + len(request.keys)
    for table, count in sorted(tables.items()):
        yield f"{table}: {count} key(s) to copy again"
    for table, why in plan.whole:
        yield f"{table}: copied whole ({why})"
