"""A pipeline's ``conflicts:`` block and ``site:`` key (docs/conflicts.md): validated, handed to its target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from setl.config import NodeSettings, load_pipeline
from setl.connectors import BuildContext, build_load, registry
from setl.errors import ConfigError
from setl.sinks.conflicts import LAST_WRITER_WINS, SITE_WINS, ConflictPolicy, TablePolicy

CHANNEL = {"policy": "last_writer_wins", "column": "updated_at", "sites": {"a": 1, "b": 2},
           "tables": {"db.t": {"policy": "site_wins", "site": "a"}}}


def write(tmp_path: Path, extra: dict[str, Any], target: str = "mysql") -> Path:
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True, exist_ok=True)
    body = {"source": {"type": "mysql"}, "target": {"type": target, **({"path": "t.db"} if target == "sqlite" else {})},
            **extra}
    (conf / "pipelines" / "p.yaml").write_text(yaml.safe_dump(body))
    return conf


def test_a_channel_block_reaches_the_target_as_its_policy(tmp_path: Path) -> None:
    """A valid block and site load; the load path gets its policy, other site, table rules and tombstones (on)."""
    config = load_pipeline(write(tmp_path, {"site": "a", "conflicts": CHANNEL}), "p", registry())
    policy = BuildContext.of(config, NodeSettings()).conflicts
    assert policy == ConflictPolicy("a", "b", {"a": 1, "b": 2}, TablePolicy(LAST_WRITER_WINS, "updated_at"),
                                    {"db.t": TablePolicy(SITE_WINS, "updated_at", "a")}, tombstones=True)
    assert build_load(config, NodeSettings()).conflicts.policy == policy  # type: ignore[attr-defined]


def test_no_block_means_no_conflict_step(tmp_path: Path) -> None:
    """Without ``conflicts:`` the target's load path has no conflicts step: it loads exactly as before."""
    config = load_pipeline(write(tmp_path, {}), "p", registry())
    assert BuildContext.of(config, NodeSettings()).conflicts is None
    load = build_load(config, NodeSettings())
    assert load.conflicts is None and load.path.conflicts is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("extra, message", [
    ({"conflicts": CHANNEL}, "site: required with conflicts"),
    ({"site": "c", "conflicts": CHANNEL}, "site: 'c' is not one of conflicts.sites"),
    ({"site": "a", "conflicts": {**CHANNEL, "column": None}}, "conflicts.column: required by last_writer_wins"),
    ({"site": "a", "conflicts": {**CHANNEL, "sites": {"a": 1, "b": 1}}}, "conflicts.sites: last_writer_wins needs"),
    ({"site": "a", "conflicts": {**CHANNEL, "tables": {"db.t": {"policy": "site_wins", "site": "z"}}}},
     "conflicts.tables.db.t.site: site_wins needs the winning site"),
    ({"site": "a", "conflicts": {**CHANNEL, "tables": {"t": {}}}}, "conflicts.tables.t: is not SCHEMA.TABLE"),
    ({"site": "a", "conflicts": {**CHANNEL, "policy": "newest"}}, "conflicts.policy: expected one of"),
    ({"site": "a", "conflicts": {**CHANNEL, "colour": 1}}, "conflicts.colour: unknown key"),
])
def test_a_block_that_cannot_be_settled_alike_on_both_sides_is_refused(tmp_path: Path, extra: dict[str, Any],
                                                                       message: str) -> None:
    """Each bad block is one ConfigError naming the file and the key."""
    with pytest.raises(ConfigError) as caught:
        load_pipeline(write(tmp_path, extra), "p", registry())
    assert message in str(caught.value) and "p.yaml" in str(caught.value)


def test_keep_target_needs_no_sites(tmp_path: Path) -> None:
    """keep_target (a one-way pipeline keeping local edits) needs a site but no priorities or column."""
    config = load_pipeline(write(tmp_path, {"site": "hq", "conflicts": {"policy": "keep_target"}}), "p", registry())
    assert BuildContext.of(config, NodeSettings()).conflicts.default.policy == "keep_target"  # type: ignore[union-attr]


def test_a_target_that_cannot_detect_conflicts_is_refused(tmp_path: Path) -> None:
    """A block on a target other than mysql stops the start with a ConfigError, never a silent one-way load."""
    config = load_pipeline(write(tmp_path, {"site": "a", "conflicts": CHANNEL}, target="sqlite"), "p", registry())
    with pytest.raises(ConfigError, match="conflicts: detected on a mysql target only, not sqlite"):
        build_load(config, NodeSettings())
