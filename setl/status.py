"""What `setl status --json` reports: one row (a JSON-ready dict) per pipeline, read from the meta store.

The same rows serve the command line and anything else that shows status (the node's HTTP
endpoint), so that every view of a pipeline says the same thing.

A pipeline is reported ``running`` only while the process running it keeps its liveness record
fresh (`setl.meta.base.STALE_AFTER`); a RUNNING state whose process stopped beating (a kill -9, a
frozen or cut-off node) is reported ``dead``, with when and where it was last seen; a running one
riding out a transient failure is ``retrying`` (the same word on the page and in /api/status).
"""

from __future__ import annotations

import time
from typing import Any

from setl.meta.base import STALE_AFTER, Liveness, MetaStore, PipelineState, Status

#: The status of a pipeline whose state says running but whose process has stopped beating.
DEAD = "dead"
#: The status of a running pipeline riding out a transient failure (its cause in ``retrying``).
RETRYING = "retrying"


def is_dead(state: PipelineState, live: Liveness | None, now: float) -> bool:
    """Whether `setl status` reports a pipeline ``dead``: its state says running, and the process
    running it stopped beating (or, on this host, is gone)."""
    return state.status is Status.RUNNING and (live is None or live.stale(now, STALE_AFTER))


def dead_runs(meta: MetaStore, names: list[str], *, now: float | None = None) -> dict[str, tuple[str, str, int]]:
    """The pipelines of `names` that `setl status` reports ``dead`` (`is_dead`) with a liveness record
    naming a node: per pipeline, that node, its host and its pid (what the cluster view judges its
    nodes by, `setl.ha.cluster.cluster_view`)."""
    now = time.time() if now is None else now
    found = {}
    for name in names:
        live = meta.liveness(name)
        if live is not None and live.node and is_dead(meta.state(name), live, now):
            found[name] = (live.node, live.host, live.pid)
    return found


def stopped_row(name: str) -> dict[str, Any]:
    """The row of a pipeline that never ran here (no meta store yet)."""
    return {"pipeline": name, "status": Status.STOPPED.value, "position": None, "batch": None,
            "acked_at": None, "epoch": 0, "node": None, "error": None, "retrying": None,
            "retrying_since": None, "last_seen": None, "host": None, "pid": None,
            "lag_seconds": None, "rows_per_second": None, "snapshot": [], "snapshot_requested": [], "verify": None,
            "conflicts": None}


def snapshot_rows(meta: MetaStore, name: str) -> dict[str, Any]:
    """The pipeline's table copies (`setl.snapshot`): per table its status, rows copied of the
    estimate, chunks and times; and the tables an operator asked to copy that have not started."""
    tables = [{"table": str(p.name), "status": p.status.value, "rows": p.rows, "estimate": p.estimate,
               "chunks": p.chunks, "started": p.started or None, "updated": p.updated or None}
              for p in meta.snapshot_progress(name)]
    return {"snapshot": tables, "snapshot_requested": [str(t) for t in meta.snapshot_requests(name)]}


def status_rows(meta: MetaStore, names: list[str], *, now: float | None = None) -> list[dict[str, Any]]:
    """One row per pipeline in `names`, in that order, from the open meta store `meta`.

    `position` is the acked position as fields (``log``, ``offset``, and ``gtid``, ``row`` when
    set), as `setl position show --json` gives it. `last_seen`, `host` and `pid` come from the
    liveness record of the process that runs (or last ran) it; `lag_seconds` and
    `rows_per_second` are the figures that process last reported, None when it is not running;
    `quarantined` its quarantined tables (`setl.model.Quarantined.to_dict`), empty when it is not running.
    """
    now = time.time() if now is None else now
    rows = []
    members = getattr(meta, "members", None)  # HA meta stores know the holder and standbys
    for name in names:
        state = meta.state(name)
        ack = meta.position(name)
        live = meta.liveness(name)
        holder, standbys = members(name) if members else (None, [])
        status = state.status.value
        if is_dead(state, live, now):
            status = DEAD
        elif state.status is Status.RUNNING and state.retrying:
            status = RETRYING  # the word the page and /api/status use too
        alive = status != DEAD and live is not None and state.status is Status.RUNNING
        figures = live.figures if alive and live is not None else {}
        rows.append({
            "pipeline": name,
            "status": status,
            "position": ack.position.to_dict() if ack else None,
            "batch": ack.batch_id if ack else None,
            "acked_at": ack.time if ack else None,
            "epoch": state.epoch,
            "node": (live.node if live is not None and live.node else state.node),
            "error": None if state.retrying else state.error,
            "retrying": state.error if state.retrying else None,
            "retrying_since": state.retrying_since if state.retrying else None,
            "last_seen": live.time if live is not None else None,
            "host": live.host if live is not None else None,
            "pid": live.pid if live is not None else None,
            "lag_seconds": figures.get("lag_seconds"),
            "rows_per_second": figures.get("rows_per_second"),
            "conflicts": figures.get("conflicts"),  # by decision, settled by the running process (docs/conflicts.md)
            # the target tables quarantined (docs/quarantine.md), as its running process last saw them
            "quarantined": list(figures.get("quarantined") or []),
            **({"holder": holder, "standbys": standbys} if members else {}),
            **snapshot_rows(meta, name),
            "verify": meta.verify_result(name),  # the last scheduled check (setl.verify.schedule), or None
        })
    return rows


def lag_seconds(meta: MetaStore, name: str, *, now: float | None = None) -> float | None:
    """The pipeline's lag as `status_rows` reports it (the figure its running process last published
    with its liveness beat); None when it is not running or has not published one."""
    now = time.time() if now is None else now
    state = meta.state(name)
    live = meta.liveness(name)
    if state.status is not Status.RUNNING or live is None or live.stale(now, STALE_AFTER):
        return None
    lag = live.figures.get("lag_seconds")
    return None if lag is None else float(lag)


def position_text(position: dict[str, Any] | None) -> str:
    """A row's position as an operator types it (``LOG:OFFSET`` or ``LOG:OFFSET+ROW``)."""
    if not position:
        return "-"
    text = f"{position['log']}:{position['offset']}"
    return text + (f"+{position['row']}" if position.get("row") else "")


def dead_note(row: dict[str, Any], now: float | None = None) -> str:
    """When and where a dead pipeline's process was last seen: ``last seen 12s ago on node-1``."""
    if row.get("last_seen") is None:
        return "never seen"
    now = time.time() if now is None else now
    where = row.get("node") or row.get("host") or "?"
    return f"last seen {max(0.0, now - row['last_seen']):.0f}s ago on {where}"


def conflicts_line(pipeline: str, settled: dict[str, int]) -> str:
    """The conflicts a running pipeline settled, on one line: how many, by decision, and where the record is."""
    total = sum(settled.values())
    parts = ", ".join(f"{decision} {n}" for decision, n in sorted(settled.items()))
    return (f"{pipeline}: {total} conflict{'s' if total != 1 else ''} settled since it started ({parts}); "
            f"both versions of each are in the target's setl_conflicts table (docs/conflicts.md)")


def verify_line(pipeline: str, result: dict[str, Any], now: float | None = None) -> str:
    """A pipeline's last scheduled check on one line: when, what, and what it found."""
    now = time.time() if now is None else now
    ago = max(0.0, now - float(result.get("time") or now))
    when = f"{ago:.0f}s" if ago < 120 else f"{ago / 60:.0f}m" if ago < 7200 else f"{ago / 3600:.1f}h"
    tables = result.get("tables") or []
    head = f"{pipeline}: last check {when} ago"
    if result.get("error"):
        return f"{head}: no verdict: {result['error']}"
    if result.get("equal"):
        return f"{head}: {len(tables)} table(s), {result.get('rows', 0):,} rows, equal"
    differing = ", ".join(f"{t['table']} ({t['missing']} missing, {t['extra']} extra, {t['different']} different"
                          + (f", {t['unsettled']} unsettled" if t.get("unsettled") else "") + ")"
                          for t in tables if not t.get("equal"))
    return f"{head}: {result.get('differences', 0)} difference(s) in {differing}"
