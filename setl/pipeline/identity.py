"""Pipeline identity: which source server and which table rules wrote a target's position.

A target that keeps the pipeline's position (`setl.sinks.sql_common.SqlLoad`) also keeps, next to it
(``<position_table>_identity``), the identity of the run that wrote it: the source server
(``server_uuid`` on MySQL, ``server_id`` and ``gtid_domain_id`` on MariaDB, as the server reports
them), the rules fingerprint (`setl.pipeline.checks.rules_fingerprint`) and whether a table copy
was still under way. It is written at every start and when the last copy completes, never on the
batch path.

At start (`check`):
* a target position written reading another source server is refused (exit 2) unless an operator
  reset the position (`setl position reset`): resuming a binlog position of one server on
  another skips or replays arbitrary changes;
* a meta store that knows nothing of the pipeline (wiped, `rm -rf var/`) takes the target's
  position when the stored identity matches (same source, same rules, no copy under way); any
  other case is refused as before (`Node`'s "a position only the target knows").
A position stored without an identity (written before identities were) is treated as before.

The identity also names the target server it was written on (`target_server`: MySQL's
``server_uuid``; MariaDB's ``hostname``, ``datadir`` and ``server_id``; PostgreSQL's system identifier):
a position table found on another server (copied by a dump or a restore, or ``target`` now naming
another server that holds one) is refused like another source's, unless an operator reset the
position. A target of files (Parquet) keeps no position: one that holds nothing of the pipeline
(no owner marker: a changed path, files gone) once the meta store acked a position is refused.

The target must also still hold what the meta store says it got (`lapse`, `missing_copies`): every
acked batch was committed in a position-keeping target with its position first, so a target that
holds no position of the pipeline, or one behind the meta store's (a new or emptied database, a
changed ``target``, a position table dropped, a restore from an older copy), lacks changes the meta
store acked: the start is refused (exit 2, one line naming the target, both positions and the
commands on). A target table whose copy the meta store records as done but which the target lacks, or which the
identity's ``copied`` (the target tables that got a finished copy on this target) does not list
(dropped since, created since, or a rule now routing into a new name) is copied again online, as
`setl snapshot --table` does; refused the same way when the source cannot copy tables.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from setl.config import PipelineConfig
from setl.errors import ConfigError
from setl.meta.base import MetaStore
from setl.model import Position, TableName
from setl.pipeline.chain import Stages
from setl.pipeline.checks import rules_fingerprint
from setl.schema.create import find_creator
from setl.snapshot.select import find_snapshot
from setl.tablecopy import CopyStatus

log = logging.getLogger("setl.pipeline")


def _holder(stage: Any, attribute: str) -> Any:
    """The stage, or the first stage it wraps (``inner``), that has `attribute`; None if none has."""
    while stage is not None:
        if hasattr(stage, attribute):
            return stage
        stage = getattr(stage, "inner", None)
    return None


def copying(config: PipelineConfig, stages: Stages, meta: MetaStore) -> bool:
    """Whether a table copy of the pipeline is under way or about to start (a fresh snapshot, an
    unfinished one, or a pending `setl snapshot` request)."""
    snapshot = find_snapshot(stages.select)
    if snapshot is None:
        return False
    name = config.name
    if snapshot.start_mode and (meta.position(name) is None or meta.position_was_reset(name)):
        return True
    return bool(meta.copies_not_done(name))


def current(config: PipelineConfig, stages: Stages, meta: MetaStore, *, tables: bool = False,
            recorded: list[str] | None = None) -> dict[str, Any] | None:
    """This run's identity, or None when the source cannot tell which server it is; with `tables`
    also ``copied``: the target tables that got a finished copy on this target (`copied_tables`, one
    look at the target per table), or else `recorded` (the stored identity's, or None)."""
    source = _holder(stages.select, "identity")
    if source is None:
        return None
    mine = {"source": source.identity(), "rules": rules_fingerprint(config), "copying": copying(config, stages, meta)}
    server = target_server(stages)
    if server is not None:
        mine["target"] = server
    if not tables:
        return mine
    copied = copied_tables(config, stages, meta)
    if copied is None:
        copied = recorded  # nothing to tell from the meta store: the target's record stands
    if copied is not None:
        mine["copied"] = copied
    return mine


def _copies(config: PipelineConfig, stages: Stages, meta: MetaStore) -> list[tuple[TableName, TableName]] | None:
    """(source table, target table) of each table whose copy the meta store records as done (not
    asked again), that a rule still routes and the source still has; None without a table creator
    or without any finished copy."""
    creator = find_creator(stages.load)
    if creator is None:
        return None
    done = {p.name for p in meta.snapshot_progress(config.name) if p.status is CopyStatus.DONE}
    if not done:
        return None
    busy = set(meta.copies_not_done(config.name))
    return [(source, planned.table) for planned in creator.creator.planner.tables()
            for source in planned.sources if source in done and source not in busy]


def copied_tables(config: PipelineConfig, stages: Stages, meta: MetaStore) -> list[str] | None:
    """The target tables (``schema.table``) whose copy the meta store records as done and that the
    target has: what the target's identity records as copied on it (None: nothing to tell)."""
    copies = _copies(config, stages, meta)
    if copies is None:
        return None
    creator = find_creator(stages.load)
    assert creator is not None
    targets = {target for _, target in copies}
    return sorted(str(t) for t in targets - creator.creator.absent(targets))


def stored(stages: Stages) -> dict[str, Any] | None:
    """The identity the target keeps next to the pipeline's position (None: none, or a target
    that keeps no identity)."""
    load = _holder(stages.load, "save_identity")
    return load.identity() if load is not None else None


def target_server(stages: Stages) -> dict[str, Any] | None:
    """Which server the target is (`PositionStore.read_server`); None for a target that keeps no identity."""
    load = _holder(stages.load, "server_identity")
    return load.server_identity() if load is not None else None


def _other_server(config: PipelineConfig, held: Position, written: Any, live: dict[str, Any]) -> str:
    """The line refusing a target position written on another target server."""
    name = config.name
    old = written if isinstance(written, dict) else {"server": written}
    return (f"the target ({describe_target(config)}) holds position {held} of pipeline {name}, but that position was "
            f"written on another {config.target.type} server ({_differences(old, live)}): the position table was "
            f"copied here (a dump, a restore, a replica) or `target:` now names another server; its tables may not "
            f"hold what that position says. If `target:` changed by mistake, point it back at the server that "
            f"wrote the position; if this server's tables are a complete copy up to that position, take it with "
            f"`setl position reset --pipeline {name} --to {_typed(held)}`; otherwise copy every table again from the "
            f"configured start with `setl position reset --pipeline {name} --start`")


def _no_output(config: PipelineConfig, acked: Position) -> str:
    """The line refusing a file target that holds nothing of what the meta store acked."""
    name = config.name
    return (f"the target ({describe_target(config)}) holds no output of pipeline {name} while this node's meta store "
            f"acked {acked}: a new or emptied directory, or a changed target path; resuming would leave out every "
            f"change before it. If the path changed by mistake, point `target:` back at the directory that holds "
            f"the output; to copy every table again from the configured start into this one, `setl position reset "
            f"--pipeline {name} --start`")


def _check_output(config: PipelineConfig, stages: Stages, meta: MetaStore, reset: bool) -> None:
    """A target of files (no position of its own) must hold the pipeline's output once the meta store
    acked a position; refuse it otherwise (leaving the directory as it was found)."""
    output = _holder(stages.load, "holds_output")
    if output is None:
        return
    acked = meta.position(config.name)
    if acked is not None and not reset and not output.holds_output():
        output.disown()
        raise ConfigError(_no_output(config, acked.position), pipeline=config.name, stage="load")
    output.own()


def _staged(stages: Stages) -> list[str]:
    """The target tables the target records as being re-copied (none for a target without staging)."""
    load = _holder(stages.load, "copies_under_way")
    return load.copies_under_way() if load is not None else []


def save(stages: Stages, identity: dict[str, Any]) -> None:
    load = _holder(stages.load, "save_identity")
    if load is not None:
        load.save_identity(identity)


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{key} {old.get(key, '-')} -> {new.get(key, '-')}"
                     for key in keys if old.get(key) != new.get(key))


def _typed(held: Position) -> str:
    return f"{held.log}:{held.offset}" + (f"+{held.row}" if held.row else "")


def check(config: PipelineConfig, stages: Stages, meta: MetaStore) -> None:
    """Before a pipeline's scheduler starts (its target open): refuse a target position this run
    must not take (`ConfigError`, exit 2, one line naming what differs and the commands on), adopt
    one it may, and store this run's identity on the target."""
    name = config.name
    mine = current(config, stages, meta)
    theirs = stored(stages)
    reset = meta.position_was_reset(name)
    known = bool(meta.state(name).epoch or meta.position(name) is not None or reset)
    held = stages.load.committed() if not reset else None
    ways = (f"if this source really continues that binlog, take a position on it with `setl position reset "
            f"--pipeline {name} --to LOG:OFFSET`; to start afresh from the configured start (copying again), "
            f"`setl position reset --pipeline {name} --start`")
    if held is not None and theirs is not None and mine is not None and theirs.get("source") != mine["source"]:
        raise ConfigError(
            f"the target's position of pipeline {name} ({held}) was written reading another source server "
            f"({_differences(theirs.get('source') or {}, mine['source'])}): resuming it here would skip or replay "
            f"arbitrary changes; {ways}", pipeline=name, stage="load")
    live = target_server(stages)
    if held is not None and theirs is not None and live is not None and theirs.get("target") not in (None, live):
        raise ConfigError(_other_server(config, held, theirs.get("target"), live), pipeline=name, stage="load")
    _check_output(config, stages, meta, reset)
    if held is not None and not known:
        staged = _staged(stages)  # a re-copy begun after the identity was written: the target knows it
        matches = (theirs is not None and mine is not None and theirs.get("rules") == mine["rules"]
                   and not theirs.get("copying", True) and not staged)
        if not matches:
            why = ("" if theirs is None or mine is None else
                   " (its table rules differ from this file's)" if theirs.get("rules") != mine["rules"] else
                   f" (a table copy was under way: {', '.join(staged)})" if staged else
                   " (a table copy was under way)")
            raise ConfigError(
                f"the target already holds a position of a pipeline named {name} ({held}){why} and this node's "
                f"meta store has none: another pipeline of this name wrote it, or this one's meta store was lost. "
                f"Starting from it would skip copying and creating the tables. If it is this pipeline and its copy "
                f"had finished, take it with `setl position reset --pipeline {name} --to {_typed(held)}`; to start "
                f"afresh from the configured start (copying again), `setl position reset --pipeline {name} --start`",
                pipeline=name, stage="load")
        log.info("pipeline=%s stage=load this node's meta store has no position; the target's %s was written by "
                 "this pipeline (same source server, same table rules, copy finished): resuming from it", name, held)
    if stages.load.capabilities.stores_position and known and not reset:
        acked = meta.position(name)
        lapsed = lapse(config, acked.position if acked is not None else None, False, held)
        if lapsed is not None:
            raise ConfigError(lapsed, pipeline=name, stage="load")
    recorded = _recorded(theirs) if held is not None else None
    if known and not reset:
        _recopy(config, stages, meta, recorded)
    if mine is not None:
        mine = current(config, stages, meta, tables=True, recorded=recorded)  # after a re-copy request: copying
    if mine is not None and mine != theirs:
        save(stages, mine)


def describe_target(config: PipelineConfig) -> str:
    """The pipeline's target as its file names it (type, server, database), for messages."""
    target = config.target
    host, port = getattr(target, "host", None), getattr(target, "port", None)
    where = f" {host}:{port}" if host else ""
    database: Any = getattr(target, "database", None)
    path: Any = getattr(target, "path", None)
    return f"{target.type}{where}" + (f" database {database}" if database else f" path {path}" if path else "")


def lapse(config: PipelineConfig, acked: Position | None, reset: bool, held: Position | None) -> str | None:
    """Why the target cannot be resumed into, or None: the meta store acked `acked` (not an
    operator's `reset`) and the target holds `held` (None: no position of the pipeline)."""
    name = config.name
    if acked is None or reset or (held is not None and held >= acked):
        return None
    target = describe_target(config)
    if held is None:
        what = (f"the target ({target}) holds no position of pipeline {name} while this node's meta store acked "
                f"{acked}: a new or emptied target, a changed target setting or a dropped position table")
        on = ""
    else:
        what = (f"the target ({target}) holds position {held} of pipeline {name}, behind the {acked} this node's "
                f"meta store acked: it was restored from an older copy")
        on = (f"; if no table was copied since and the binlog still holds it, replay from the target's own "
              f"position with `setl position reset --pipeline {name} --to {_typed(held)}`")
    return (f"{what}; resuming would skip what the target lacks. To copy every table again from the configured "
            f"start, `setl position reset --pipeline {name} --start`{on}")


def missing_copies(config: PipelineConfig, stages: Stages, meta: MetaStore,
                   recorded: list[str] | None = None) -> list[tuple[TableName, TableName]]:
    """(source table, target table) of each table whose copy the meta store records as done, that a
    rule still routes and the source still has, and which the target lacks or, when the target's
    identity lists the tables copied on it (`recorded`), did not get the copy (created since,
    or a rule now routes into a table of another database)."""
    copies = _copies(config, stages, meta)
    if not copies:
        return []
    creator = find_creator(stages.load)
    assert creator is not None
    absent = creator.creator.absent({target for _, target in copies})
    listed = set(recorded) if recorded is not None else None
    return [(source, target) for source, target in copies
            if target in absent or (listed is not None and str(target) not in listed)]


def _recorded(identity: dict[str, Any] | None) -> list[str] | None:
    copied = identity.get("copied") if identity is not None else None
    return [str(t) for t in copied] if isinstance(copied, list) else None


def _recopy(config: PipelineConfig, stages: Stages, meta: MetaStore, recorded: list[str] | None) -> None:
    """Copy again (online) each table whose finished copy the target lost; refuse when the source cannot."""
    name = config.name
    lost = missing_copies(config, stages, meta, recorded)
    if not lost:
        return
    listed = ", ".join(f"{target} (from {source})" for source, target in lost)
    if find_snapshot(stages.select) is None:
        raise ConfigError(
            f"the target ({describe_target(config)}) lacks the copy of table(s) {listed} that this node's meta "
            f"store records as done, and this pipeline's source cannot copy a table again: resuming would leave them "
            f"without their rows. To copy every table again from the configured start, `setl position reset "
            f"--pipeline {name} --start`", pipeline=name, stage="load")
    for source, _target in lost:
        meta.request_snapshot(name, source)
    log.warning("pipeline=%s stage=load the target lacks the finished copy of %s (dropped, or created since): "
                "copying %s again (online, as `setl snapshot --table`)", name, listed,
                "it" if len(lost) == 1 else "them")


def _quarantined(name: str, quarantine: Any, conn: Any) -> list[tuple[str, str]]:
    """A warning per quarantined table of the target (docs/quarantine.md), read through `conn`; none
    when the target keeps no quarantine table yet."""
    if quarantine is None:
        return []
    try:
        found = quarantine.store.read(conn)
        conn.commit()
    except Exception:  # noqa: BLE001 - no quarantine table yet (nothing was ever quarantined there)
        conn.rollback()
        return []
    return [("warning", f"table {q.table} is quarantined since {q.first}, {q.changes} changes ({q.nbytes} bytes) "
                        f"kept: {q.cause}; fix it, then `setl resume --pipeline {name} --table {q.table}`")
            for q in found.values()]


def preview(config: PipelineConfig, stages: Stages, meta: MetaStore, conn: Any) -> list[tuple[str, str]]:
    """What a start would find about the target (`setl check`), as (level, text) findings, reading
    only: the target's position through `conn` (a connection of the target's own, such as the
    schema target's) against the meta store's, then the tables whose finished copy the target lost
    (the creator's planner seeded with the source tables first)."""
    name = config.name
    store = getattr(_holder(stages.load, "positions"), "positions", None)
    acked = meta.position(name)
    if store is None or acked is None or meta.position_was_reset(name):
        return []
    held = store.peek_position(conn)
    lapsed = lapse(config, acked.position, False, held)
    if lapsed is not None:
        return [("error", lapsed)]
    out = [("ok", f"the target holds position {held} (this node's meta store acked {acked.position})")]
    out += _quarantined(name, getattr(_holder(stages.load, "quarantine"), "quarantine", None), conn)
    try:
        text = store.read_identity(conn)
    except Exception:  # noqa: BLE001 - no identity table yet (a target an older setl wrote): no record
        conn.rollback()
        text = None
    theirs = json.loads(text) if text else None
    if held is not None and theirs is not None and theirs.get("target") is not None:
        live = store.read_server(conn)
        if theirs["target"] != live:
            return [("error", _other_server(config, held, theirs["target"], live))]
    lost = missing_copies(config, stages, meta, _recorded(theirs))
    if lost:
        listed = ", ".join(f"{target} (from {source})" for source, target in lost)
        if find_snapshot(stages.select) is None:
            out.append(("error", f"the target lacks the copy of table(s) {listed} that this node's meta store "
                                 f"records as done, and the source cannot copy a table again: to copy every table "
                                 f"again from the configured start, `setl position reset --pipeline {name} --start`"))
        else:
            out.append(("warning", f"the target lacks the finished copy of table(s) {listed}: the next start "
                                   "copies them again (online, as `setl snapshot --table`)"))
    return out


def preview_output(config: PipelineConfig, stages: Stages, meta: MetaStore) -> list[tuple[str, str]]:
    """`setl check` for a target of files: whether it holds the pipeline's output once the meta
    store acked a position (nothing written)."""
    output = _holder(stages.load, "holds_output")
    acked = meta.position(config.name)
    if output is None or acked is None or meta.position_was_reset(config.name):
        return []
    if not output.holds_output():
        return [("error", _no_output(config, acked.position))]
    return [("ok", f"the target holds the output of pipeline {config.name} (this node's meta store acked "
                   f"{acked.position})")]


def copy_finished(config: PipelineConfig, stages: Stages, meta: MetaStore) -> None:
    """Every table copy is done: record it on the target (a lost meta store may then adopt its
    position)."""
    if (mine := current(config, stages, meta)) is None or mine["copying"]:
        return  # cheap: called as each table's copy ends; the tables are looked at after the last
    theirs = stored(stages)
    mine = current(config, stages, meta, tables=True, recorded=_recorded(theirs))
    if mine is not None and mine != theirs:
        save(stages, mine)


__all__ = ["check", "copy_finished", "copying", "current", "describe_target", "lapse", "missing_copies", "preview",
           "preview_output", "stored", "copied_tables", "target_server"]
