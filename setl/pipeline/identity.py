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
"""

from __future__ import annotations

import logging
from typing import Any

from setl.config import PipelineConfig
from setl.errors import ConfigError
from setl.meta.base import MetaStore
from setl.model import Position
from setl.pipeline.chain import Stages
from setl.pipeline.checks import rules_fingerprint
from setl.snapshot.select import find_snapshot

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


def current(config: PipelineConfig, stages: Stages, meta: MetaStore) -> dict[str, Any] | None:
    """This run's identity, or None when the source cannot tell which server it is."""
    source = _holder(stages.select, "identity")
    if source is None:
        return None
    return {"source": source.identity(), "rules": rules_fingerprint(config),
            "copying": copying(config, stages, meta)}


def stored(stages: Stages) -> dict[str, Any] | None:
    """The identity the target keeps next to the pipeline's position (None: none, or a target
    that keeps no identity)."""
    load = _holder(stages.load, "save_identity")
    return load.identity() if load is not None else None


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
    if mine is not None and mine != theirs:
        save(stages, mine)


def copy_finished(config: PipelineConfig, stages: Stages, meta: MetaStore) -> None:
    """Every table copy is done: record it on the target (a lost meta store may then adopt its
    position)."""
    mine = current(config, stages, meta)
    if mine is not None and not mine["copying"] and mine != stored(stages):
        save(stages, mine)


__all__ = ["check", "copy_finished", "copying", "current", "stored"]
