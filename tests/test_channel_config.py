"""`conf/channels/NAME.yaml` (docs/bidirectional.md): one file makes two pipelines, one per direction,
each reading one site and dropping what setl wrote there, writing the other in marked sessions, with
the channel's rules, settings and `conflicts:` block carried to both as written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from setl.config import channel_tombstones, load_pipeline, pipeline_names
from setl.connectors import registry
from setl.errors import ConfigError

CONFLICTS = {"policy": "site_wins", "site": "east",
             "tables": {"shop.orders": {"policy": "last_writer_wins", "column": "updated_at"}}}


def conf_dir(tmp_path: Path, channel: dict) -> Path:
    (tmp_path / "channels").mkdir()
    (tmp_path / "channels" / "shop.yaml").write_text(yaml.safe_dump(channel, sort_keys=False))
    return tmp_path


def test_a_channel_makes_two_mirrored_pipelines(tmp_path):
    """Each direction reads one site ignoring its marked writes, and writes the other marked with that site's id."""
    conf = conf_dir(tmp_path, {
        "sites": {"east": {"host": "10.0.0.1", "port": 3307, "user": "u", "password": "p", "setl_server_id": 4001,
                           "setl_gtid_domain_id": 41, "priority": 2, "start": {"file": "b.000003", "pos": 4}},
                  "west": {"host": "10.0.0.2", "setl_server_id": 4002, "reader_server_id": 1700, "priority": 1}},
        "tables": [{"source": r"shop\..*", "columns": {"exclude": ["secret"]}, "transforms": []}],
        "pipeline": {"batch": {"max_rows": 300}},
        "conflicts": CONFLICTS})
    assert pipeline_names(conf) == ["shop.east-to-west", "shop.west-to-east"]
    ew = load_pipeline(conf, "shop.east-to-west", registry())
    we = load_pipeline(conf, "shop.west-to-east", registry())
    assert (ew.source.host, ew.source.port, ew.source.server_id, ew.source.ignore_server_ids) == \
        ("10.0.0.1", 3307, 1001, (4001,))
    assert ew.source.start == {"file": "b.000003", "pos": 4}
    assert (ew.target.host, ew.target.session_server_id, ew.target.session_gtid_domain_id) == ("10.0.0.2", 4002, None)
    assert (we.source.host, we.source.server_id, we.source.ignore_server_ids) == ("10.0.0.2", 1700, (4002,))
    assert (we.target.host, we.target.port, we.target.session_server_id, we.target.session_gtid_domain_id) == \
        ("10.0.0.1", 3307, 4001, 41)
    # the marker fallback: each loader's mark, dropped by the reader of the site it writes
    assert (ew.target.loop_guard, ew.target.loop_mark, we.source.ignore_marks) == \
        ("auto", "shop:east-to-west", ("shop:east-to-west",))
    assert (we.target.loop_guard, we.target.loop_mark, ew.source.ignore_marks) == \
        ("auto", "shop:west-to-east", ("shop:west-to-east",))
    for config, site in ((ew, "east"), (we, "west")):
        assert config.channel == "shop" and config.site == site
        assert config.conflicts is not None
        assert (config.conflicts.policy, config.conflicts.site) == ("site_wins", "east")
        assert config.conflicts.sites == {"east": 2, "west": 1}  # the sites' priorities, for the tie-break
        assert config.conflicts.tables["shop.orders"].column == "updated_at"
        assert config.tables[0].columns.exclude == ("secret",)
        assert config.pipeline.batch.max_rows == 300


def test_a_mistake_in_the_channel_names_its_file_and_key(tmp_path):
    """A wrong key of the shared rules is reported against the channel file, with its key path."""
    conf = conf_dir(tmp_path, {"sites": {"a": {"setl_server_id": 1}, "b": {"setl_server_id": 2}},
                               "pipeline": {"batch": {"max_rows": "ten"}}})
    with pytest.raises(ConfigError, match=r"channels/shop.yaml: pipeline.batch.max_rows: expected an integer"):
        load_pipeline(conf, "shop.a-to-b", registry())


@pytest.mark.parametrize(("conflicts", "expected"), [
    ({"policy": "last_writer_wins", "column": "ts"}, True),
    ({"policy": "site_wins", "site": "a"}, True),
    ({"policy": "keep_target", "tables": {"s.t": {"policy": "last_writer_wins", "column": "ts"}}}, True),
    ({"policy": "keep_target"}, False),
    ({"policy": "last_writer_wins", "column": "ts", "tombstones": False}, False),
    ({"policy": "keep_target", "tombstones": True}, True),
])
def test_tombstones_are_on_unless_turned_off_or_every_table_keeps_the_target(tmp_path, conflicts, expected):
    """A channel's directions run with tombstones unless ``tombstones: false`` or every table is keep_target."""
    conf = conf_dir(tmp_path, {"sites": {"a": {"setl_server_id": 1, "priority": 1},
                                         "b": {"setl_server_id": 2, "priority": 2}}, "conflicts": conflicts})
    for name in ("shop.a-to-b", "shop.b-to-a"):
        settings = load_pipeline(conf, name, registry()).conflicts
        assert settings is not None and settings.tombstones_on() is expected, (name, settings)
    assert channel_tombstones(conflicts) is expected


def test_tombstones_under_the_marker_loop_guard_are_accepted(tmp_path):
    """Tombstones with loop_guard marker load: the triggers' DDL goes through the marked sessions."""
    conf = conf_dir(tmp_path, {"sites": {"a": {"setl_server_id": 1}, "b": {"setl_server_id": 2}},
                               "loop_guard": "marker", "conflicts": {"policy": "site_wins", "site": "a"}})
    config = load_pipeline(conf, "shop.a-to-b", registry())
    assert config.conflicts is not None and config.conflicts.tombstones_on()
    assert config.target.loop_guard == "marker"  # type: ignore[attr-defined]
