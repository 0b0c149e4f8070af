"""The actions on a pipeline that the CLI and the HTTP control API share: each checks what it is
asked, acts through the meta store (the node that holds the pipeline acts on it within a second)
and returns an `ActionResult`, which the CLI prints and the API serialises.

A refusal is a `UsageError` naming the pipeline and the fix; nothing has changed when one is raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from setl.config import NodeSettings, PipelineConfig, load_node, load_pipeline, pipeline_names
from setl.connectors import build_load, for_node, registry
from setl.errors import SetlError, UsageError
from setl.meta.base import MetaStore, Status
from setl.model import Position, TableName


@attrs.frozen
class ActionResult:
    """What an action did: `lines` for a person (the CLI prints them), `data` for a program (the
    API's JSON, with the lines as ``message``); `changed` is false when nothing needed doing."""

    pipeline: str
    action: str
    lines: tuple[str, ...]
    changed: bool = True
    data: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "action": self.action, "changed": self.changed,
                "message": "\n".join(self.lines), **self.data}


class StateConflict(UsageError):
    """Refused because of the pipeline's state (it runs, or runs other rules): the request is
    sound, the moment is not (the API answers 409)."""


def known_pipeline(conf: Path, meta: MetaStore, name: str) -> None:
    """A UsageError unless `name` is a pipeline of the conf directory or of the meta store."""
    if name not in pipeline_names(conf) and name not in meta.pipelines():
        known = ", ".join(sorted(set(pipeline_names(conf)) | set(meta.pipelines()))) or "none"
        raise UsageError(f"unknown pipeline {name!r} (known: {known})")


def parse_tables(texts: Sequence[str], option: str = "--table") -> list[TableName]:
    """``SCHEMA.TABLE`` texts as table names; a UsageError naming the first that is not one."""
    try:
        return [TableName.parse(str(text)) for text in texts]
    except ValueError as exc:
        raise UsageError(f"{option} {exc}") from None


def pause(meta: MetaStore, name: str) -> ActionResult:
    """Persist PAUSED: a running node stops the pipeline gracefully within a second."""
    state = meta.state(name)
    if state.status is Status.PAUSED:
        return ActionResult(name, "pause", (f"{name} is already paused",), changed=False, data={"status": "paused"})
    meta.set_state(name, Status.PAUSED, error=None, node=state.node)
    running = state.status is Status.RUNNING
    return ActionResult(name, "pause", (f"{name} paused" + (" (its node stops it within a second)" if running
                                                              else ""),), data={"status": "paused"})


def resume(meta: MetaStore, name: str) -> ActionResult:
    """Clear a pause (and its error): the node waiting on it, or the next start, runs the pipeline."""
    state = meta.state(name)
    if state.status is not Status.PAUSED:
        return ActionResult(name, "resume", (f"{name} is not paused ({state.status.value})",), changed=False,
                            data={"status": state.status.value})
    # A resume that comes before the node saw the pause: the process still runs the pipeline (its
    # beat is fresh and does not say it stopped; the first beat of a start carries no figures yet),
    # so it is running, not stopped. Should the node be stopping it meanwhile, its teardown writes
    # STOPPED over this and the node starts it again at once; a node that already stopped it and
    # waits on the pause sees no pause at its next look and starts it.
    live = meta.liveness(name)
    streaming = (live is not None and not live.stale(time.time()) and live.figures.get("streaming") is not False
                 and state.error is None)
    status = Status.RUNNING if streaming else Status.STOPPED
    meta.set_state(name, status, error=None, node=live.node if streaming and live is not None else state.node)
    return ActionResult(name, "resume", (f"{name} resumed" + (f" (was paused: {state.error})" if state.error
                                                                else ""),), data={"status": status.value})


def stop(meta: MetaStore, name: str, timeout: float, progress: Progress, interval: float = 0.2) -> ActionResult:
    """Pause, then wait up to `timeout` seconds until no process runs the pipeline: its node has
    acked or rolled back every batch in flight and closed its scheduler (the liveness record says
    ``streaming`` false in a beat after the request, or it is gone or stale). Like a pause it is
    persisted: it stays stopped, across restarts, until resumed (docs/http-api.md). A SetlError when
    the node has not stopped it in time (it stays paused: it stops once its in-flight batches end)."""
    asked = time.time()
    paused = pause(meta, name)
    progress({"message": paused.lines[0]})

    def stopped() -> bool:
        live = meta.liveness(name)
        if live is None or live.stale(time.time()):
            return True
        return live.time > asked and live.figures.get("streaming") is False

    deadline = time.monotonic() + timeout
    while not stopped():
        if time.monotonic() >= deadline:
            raise SetlError(f"{name} is paused but its node still runs it after {timeout:.0f}s (it stops once its "
                            "in-flight batches are acked or rolled back; `setl status` shows it)", pipeline=name,
                            stage="stop")
        time.sleep(interval)
    return ActionResult(name, "stop", (f"{name} stopped: no process runs it; it stays stopped until "
                                       f"`setl resume --pipeline {name}`",), changed=paused.changed,
                        data={"status": "paused", "streaming": False})


def position_show(meta: MetaStore, name: str, history: int = 5) -> dict[str, Any]:
    """The acked position, whether a reset set it, and the last `history` acks."""
    ack = meta.position(name)
    return {
        "pipeline": name,
        "position": ack.position.to_dict() if ack else None,
        "batch": ack.batch_id if ack else None,
        "epoch": ack.epoch if ack else None,
        "reset": meta.position_was_reset(name),
        "history": [{"batch": a.batch_id, "epoch": a.epoch, "position": a.position.to_dict(), "time": a.time}
                    for a in meta.history(name, history)],
    }


def position_reset(meta: MetaStore, name: str, *, to: str | None, start: bool, force: bool) -> ActionResult:
    """Restart a stopped pipeline after `to` (``LOG:OFFSET``) or, with `start`, from the source's
    configured start; refused while it looks running unless `force`."""
    if (to is None) == (not start):
        raise UsageError("give exactly one of a position (--to LOG:OFFSET) or --start", pipeline=name)
    state = meta.state(name)
    if state.status is Status.RUNNING and not force:
        raise StateConflict(f"{name} looks running (node {state.node}); stop or pause it first, or pass --force")
    if start:
        position = None
        lines = [f"{name}: position forgotten; it restarts from the source's configured start"]
    else:
        try:
            position = Position.parse(str(to))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        lines = [f"{name}: position reset to {position}"]
    meta.reset_position(name, position)
    if state.error:  # it named a position the pipeline no longer stands at: status stops showing it
        meta.set_state(name, state.status, error=None, node=state.node)
        still = f"; still paused: `setl resume --pipeline {name}` continues from there" \
            if state.status is Status.PAUSED else ""
        lines.append(f"{name}: the earlier error no longer applies ({state.error}){still}")
    return ActionResult(name, "position reset", tuple(lines),
                        data={"position": position.to_dict() if position is not None else None})


def refuse_stale_rules(meta: MetaStore, config: PipelineConfig) -> None:
    """Refuse a request for a running pipeline whose node runs other table rules than its file has
    now: the node compiled the rules of its start and would drop a table only the new rules select."""
    from setl.pipeline.checks import rules_fingerprint

    live = meta.liveness(config.name)
    runs_with = live.figures.get("rules") if live is not None else None
    if live is not None and runs_with is not None and runs_with != rules_fingerprint(config):
        raise StateConflict(f"pipeline {config.name} runs on {live.node or live.host} (pid {live.pid}) with "
                         f"other table rules than {config.file or 'its file'} has now (changed since it "
                         f"started): restart the pipeline (or `setl reload --pipeline {config.name}`) so "
                         f"that it runs with them, then request it again", pipeline=config.name, stage="select")


def snapshot_config(conf: Path, name: str, texts: Sequence[str]) -> tuple[PipelineConfig, list[TableName]]:
    """The pipeline's config and the tables of a snapshot request, checked: the source can copy
    tables and a rule selects each of them."""
    from setl.routing import RoutingPlan

    config = load_pipeline(conf, name, for_node(load_node(conf)))
    if not registry().source(config.source.type).capabilities.snapshots:
        raise UsageError(f"source type {config.source.type} cannot copy tables (its connector does not declare "
                         "the snapshots capability); setl snapshot needs a source that does, such as mysql",
                         pipeline=config.name, stage="select")
    if not texts:
        raise UsageError("name at least one table (SCHEMA.TABLE) to copy", pipeline=name)
    plan = RoutingPlan.compile(config.tables, pipeline=config.name, file=config.file or None)
    tables = parse_tables(texts)
    for table in tables:
        if not plan.selects(table.schema, table.table):
            raise UsageError(f"pipeline {name}: no table rule selects {table}; add one first")
    return config, tables


def request_snapshot(meta: MetaStore, config: PipelineConfig, tables: Sequence[TableName]) -> ActionResult:
    """Ask for `tables` to be copied again, online: the running node starts within seconds, or the
    pipeline's next start does."""
    running = meta.state(config.name).status is Status.RUNNING
    if running:
        refuse_stale_rules(meta, config)
    for table in tables:
        meta.request_snapshot(config.name, table)
    return ActionResult(config.name, "snapshot", (
        f"snapshot of {', '.join(map(str, tables))} requested for {config.name}: "
        + ("its node starts it within seconds" if running else "it starts when the pipeline starts"),),
        data={"tables": [str(t) for t in tables], "running": running})


def snapshot_progress(meta: MetaStore, name: str, tables: Sequence[TableName]) -> dict[str, Any]:
    """The copies of `tables` as the meta store has them: per table its status, rows and estimate
    (``requested`` while the node has not begun it); ``done`` once every one is."""
    found = {p.name: p for p in meta.snapshot_progress(name)}
    waiting = set(meta.snapshot_requests(name))
    rows = []
    for table in tables:
        progress = found.get(table)
        if table in waiting or progress is None:
            rows.append({"table": str(table), "status": "requested", "rows": 0, "estimate": 0})
        else:
            rows.append({"table": str(table), "status": progress.status.value, "rows": progress.rows,
                         "estimate": progress.estimate})
    return {"tables": rows, "done": all(row["status"] == "done" for row in rows)}


def wait_snapshot(meta: MetaStore, name: str, tables: Sequence[TableName], timeout: float,
                  progress: Callable[[dict[str, Any]], None], interval: float = 0.5) -> dict[str, Any]:
    """Follow the copies of `tables` until each is done; a SetlError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while True:
        now = snapshot_progress(meta, name, tables)
        if now != last:
            progress(now)
            last = now
        if now["done"]:
            return now
        if time.monotonic() >= deadline:
            raise SetlError(f"the copies of {', '.join(map(str, tables))} are not done after {timeout:.0f}s "
                            "(the pipeline may not be running; `setl status` shows them)", pipeline=name,
                            stage="snapshot")
        time.sleep(interval)


def pipelines(conf: Path, meta: MetaStore) -> list[str]:
    """Every pipeline of the conf directory and of the meta store."""
    return sorted(set(pipeline_names(conf)) | set(meta.pipelines()))


Progress = Callable[[dict[str, Any]], None]


def _wait(timeout: float, done: Callable[[], bool], late: str, interval: float = 0.2, **context: Any) -> None:
    """Poll `done` until true; a SetlError saying `late` after `timeout` seconds (0: do not wait)."""
    deadline = time.monotonic() + timeout
    while timeout > 0 and not done():
        if time.monotonic() >= deadline:
            raise SetlError(f"{late} after {timeout:.0f}s", **context)
        time.sleep(interval)


def reload(meta: MetaStore, config: PipelineConfig, timeout: float, progress: Progress) -> ActionResult:
    """Ask the node running the pipeline to re-read its file (`MetaStore.request_reload`) and wait
    for its answer in the liveness record's figures (``reload``). A refusal is a SetlError (the old
    rules keep running); a pipeline no node runs takes the file as it is at its next start."""
    import uuid

    name = config.name
    live = meta.liveness(name)  # a paused pipeline's node keeps beating, waiting for `setl resume`
    if live is None or live.stale(time.time()):
        return ActionResult(name, "reload", (f"{name} is not running: its next start runs "
                                             f"{config.file or 'its file'} as it is now",), changed=False)
    request = uuid.uuid4().hex
    meta.request_reload(name, request)
    progress({"message": f"{name}: asked the node on {live.host} (pid {live.pid}) to reload "
                         f"{config.file or 'its file'}"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        live = meta.liveness(name)
        answer = live.figures.get("reload") if live is not None else None
        if isinstance(answer, dict) and answer.get("request") == request and answer.get("result") != "pending":
            if answer["result"] == "refused":
                raise SetlError(f"reload refused, the running configuration is kept: {answer['message']}",
                                pipeline=name, stage="reload")
            return ActionResult(name, "reload", (f"{name}: reload {answer['result']}: {answer['message']}",),
                                data={"result": answer["result"]})
    raise SetlError(f"no answer from the node on {live.host if live else '?'} (pid {live.pid if live else '?'}) "
                    f"within {timeout:.0f}s; its log says why", pipeline=name, stage="reload")


def zookeeper_meta(meta: MetaStore, what: str) -> Any:
    """`meta` as the ZooKeeper meta store that `what` needs (HA); a UsageError otherwise."""
    from setl.meta.zookeeper import ZooKeeperMetaStore  # imports kazoo: only when asked for

    if not isinstance(meta, ZooKeeperMetaStore):
        raise UsageError(f"setl {what} needs HA: meta.store: zookeeper in setl.yaml")
    return meta


def switch(meta: MetaStore, name: str, to: str | None, timeout: float, progress: Progress) -> ActionResult:
    """Ask the holder of `name`'s mainstem to hand it over (to `to`, or any standby), and wait up
    to `timeout` seconds (0: do not wait) for another holder."""
    zk = zookeeper_meta(meta, "switch")
    holder = zk.request_switch(name, to)
    progress({"message": f"{name}: asked {holder} to hand over" + (f" to {to}" if to else "")})
    lines = [f"{name}: asked {holder} to hand over" + (f" to {to}" if to else "")]

    def switched() -> bool:
        now_holder, _ = zk.members(name)
        if now_holder is not None and now_holder != holder:
            lines.append(f"{name}: {now_holder} holds the mainstem now")
            return True
        return False

    _wait(timeout, switched, f"{holder} still holds the mainstem (it finishes in-flight batches first)",
          interval=0.1, pipeline=name)
    return ActionResult(name, "switch", tuple(lines), data={"from": holder})


def _cluster_view(coordinator: Any, meta: MetaStore) -> dict[str, Any]:
    from setl.ha.cluster import cluster_view
    from setl.status import dead_runs

    # a node `setl status` reports dead is lost in this view too (the same liveness records)
    return cluster_view(coordinator, dead=lambda names: dead_runs(meta, names))


def _runs(view: dict[str, Any], node: str) -> list[str]:
    return [name for name, row in view["pipelines"].items() if node in (row["node"], row["holder"])]


def check_drain(coordinator: Any, meta: MetaStore, node: str, undo: bool) -> None:
    """A UsageError unless `node` is in the cluster (an undo may name a node that left)."""
    view = _cluster_view(coordinator, meta)
    if node not in view["nodes"] and not undo:
        raise UsageError(f"no node {node} in the cluster (known: {', '.join(view['nodes']) or 'none'})")


def drain(coordinator: Any, meta: MetaStore, node: str, undo: bool, timeout: float,
          progress: Progress) -> ActionResult:
    """Mark `node` draining and wait until it runs nothing (or, with `undo`, clear the mark)."""
    from setl.ha.cluster import request_drain

    check_drain(coordinator, meta, node, undo)
    request_drain(coordinator, node, undo=undo)
    if undo:
        return ActionResult(node, "drain", (f"{node}: no longer draining; the coordinator gives it a share again",))
    progress({"message": f"{node}: draining; its pipelines move away one at a time"})

    def empty() -> bool:
        left = _runs(_cluster_view(coordinator, meta), node)
        progress({"runs": left})
        return not left

    _wait(timeout, empty, f"{node} still runs pipelines", stage="cluster")
    return ActionResult(node, "drain", (f"{node}: draining; its pipelines move away one at a time",
                                        *((f"{node} runs nothing",) if timeout > 0 else ())))


def check_move(coordinator: Any, meta: MetaStore, name: str, to: str) -> None:
    """A UsageError unless `name` is in the cluster and `to` is a live node of it."""
    view = _cluster_view(coordinator, meta)
    if name not in view["pipelines"]:
        raise UsageError(f"no pipeline {name} in the cluster", pipeline=name)
    node = view["nodes"].get(to)
    if node is None or not node["live"]:
        raise UsageError(f"node {to} is not live in the cluster", pipeline=name)


def move(coordinator: Any, meta: MetaStore, name: str, to: str, timeout: float, progress: Progress) -> ActionResult:
    """Ask the coordinator to move `name` to `to` and wait until `to` runs it."""
    from setl.ha.cluster import request_move

    check_move(coordinator, meta, name, to)
    request_move(coordinator, name, to)
    progress({"message": f"{name}: asked the coordinator to move it to {to}"})

    def moved() -> bool:
        row = _cluster_view(coordinator, meta)["pipelines"][name]
        return bool(row["node"] == to and row["holder"] in (to, None) and not row["moving_from"])

    _wait(timeout, moved, f"{name} is not on {to} yet (it finishes in-flight batches first)", stage="cluster")
    return ActionResult(name, "move", (f"{name}: asked the coordinator to move it to {to}",
                                       *((f"{to} runs {name}",) if timeout > 0 else ())))


def quarantined(settings: NodeSettings, config: PipelineConfig) -> list[dict[str, Any]]:
    """The pipeline's quarantined target tables as its target records them (docs/quarantine.md):
    read from the target, so a stopped pipeline's are listed too."""
    load = build_load(config, settings)
    try:
        return [q.to_dict() for q in load.quarantined()]
    finally:
        load.close()


def replay_table(settings: NodeSettings, config: PipelineConfig, table: str, chunk: int,
                 progress: Progress) -> ActionResult:
    """Apply what the target keeps for quarantined `table` (a target table, as `setl status` names
    it), in order, then end its quarantine (`setl.stages.load.Load.replay`). Safe while the pipeline
    runs: each replay transaction holds its batches off. A UsageError when `table` is not quarantined."""
    name = config.name
    if chunk < 1:
        raise UsageError("chunk rows must be at least 1", pipeline=name)
    load = build_load(config, settings)
    try:
        found = {q.table: q for q in load.quarantined()}
        if table not in found:
            raise UsageError(f"pipeline {name}: target table {table} is not quarantined (quarantined: "
                             f"{', '.join(found) or 'none'})", pipeline=name, table=table)
        kept = found[table]
        first = (f"{name}: replaying {kept.changes} kept changes of {table} (quarantined at {kept.first}: "
                 f"{kept.cause})")
        progress({"message": first})
        applied = load.replay(table, chunk=chunk, progress=lambda done, left: progress(
            {"table": table, "applied": done, "left": left}))
    finally:
        load.close()
    return ActionResult(name, "replay", (first, f"{name}: {table} replayed ({applied} changes applied); it follows "
                                                "the stream again"), data={"table": table, "applied": applied})
