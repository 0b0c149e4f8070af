"""What `setl status --json` reports: one row (a JSON-ready dict) per pipeline, read from the meta store.

The same rows serve the command line and anything else that shows status (the node's HTTP
endpoint), so that every view of a pipeline says the same thing.
"""

from __future__ import annotations

from typing import Any

from setl.meta.base import MetaStore, Status


def stopped_row(name: str) -> dict[str, Any]:
    """The row of a pipeline that never ran here (no meta store yet)."""
    return {"pipeline": name, "status": Status.STOPPED.value, "position": None, "batch": None,
            "acked_at": None, "epoch": 0, "node": None, "error": None, "retrying": None,
            "retrying_since": None, "snapshot": [], "snapshot_requested": []}


def snapshot_rows(meta: MetaStore, name: str) -> dict[str, Any]:
    """The pipeline's table copies (`setl.snapshot`): per table its status, rows copied of the
    estimate, chunks and times; and the tables an operator asked to copy that have not started."""
    tables = [{"table": str(p.name), "status": p.status.value, "rows": p.rows, "estimate": p.estimate,
               "chunks": p.chunks, "started": p.started or None, "updated": p.updated or None}
              for p in meta.snapshot_progress(name)]
    return {"snapshot": tables, "snapshot_requested": [str(t) for t in meta.snapshot_requests(name)]}


def status_rows(meta: MetaStore, names: list[str]) -> list[dict[str, Any]]:
    """One row per pipeline in `names`, in that order, from the open meta store `meta`."""
    rows = []
    members = getattr(meta, "members", None)  # HA meta stores know the holder and standbys
    for name in names:
        state = meta.state(name)
        ack = meta.position(name)
        holder, standbys = members(name) if members else (None, [])
        rows.append({
            "pipeline": name,
            "status": state.status.value,
            "position": str(ack.position) if ack else None,
            "batch": ack.batch_id if ack else None,
            "acked_at": ack.time if ack else None,
            "epoch": state.epoch,
            "node": state.node,
            "error": None if state.retrying else state.error,
            "retrying": state.error if state.retrying else None,
            "retrying_since": state.retrying_since if state.retrying else None,
            **({"holder": holder, "standbys": standbys} if members else {}),
            **snapshot_rows(meta, name),
        })
    return rows
