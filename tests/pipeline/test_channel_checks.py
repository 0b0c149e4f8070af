"""`setl check --channel`: a two-way channel whose servers cannot run one safely is refused, one
line per cause with its fix (docs/bidirectional.md); a sound one checks ok."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from setl.config import load_channel
from setl.errors import ConfigError

pytestmark = pytest.mark.timeout(240)


def write_channel(root: Path, sites: dict[str, dict[str, Any]], schema: str, **top: Any) -> Path:
    conf = root / "conf"
    (conf / "channels").mkdir(parents=True, exist_ok=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(root / "meta.db")}}))
    rules = [{"source": rf"{schema}\..*"}]
    (conf / "channels" / "ch.yaml").write_text(yaml.safe_dump({"sites": sites, "tables": rules, **top}))
    return conf


def site(server: Any, setl_server_id: int, **extra: Any) -> dict[str, Any]:
    return {"host": server.host, "port": server.port, "user": server.user, "password": server.password,
            "setl_server_id": setl_server_id, **extra}


def check(conf: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "check", "--channel", "ch"],
                          capture_output=True, text=True, timeout=180)


def test_each_unsafe_setting_is_refused_with_its_fix(tmp_path, mariadb_source, mariadb_factory):
    """Same server_id and gtid_domain_id, a binlog filter hiding setl's schema, a keyless table, clashing
    auto-increments, a reserved id that is a server's, and a user without BINLOG REPLAY: one line each."""
    other = mariadb_factory(server_id=1, options={"binlog_ignore_db": "setl"})  # mariadb_source's server_id
    schema = "chk_unsafe"
    for server in (mariadb_source, other):
        server.query(f"CREATE DATABASE IF NOT EXISTS {schema}")
        server.query(f"CREATE TABLE IF NOT EXISTS {schema}.keyless (v INT)")
        server.query(f"CREATE TABLE IF NOT EXISTS {schema}.counted (id INT AUTO_INCREMENT PRIMARY KEY)")
    other.query("CREATE USER plain@'%' IDENTIFIED BY 'pw'")
    other.query("GRANT ALL ON *.* TO plain@'%'")
    other.query("REVOKE SUPER, BINLOG REPLAY ON *.* FROM plain@'%'")
    conf = write_channel(tmp_path, {"east": site(mariadb_source, 4201),
                                    "west": {**site(other, 1), "user": "plain", "password": "pw"}}, schema,
                         loop_guard="server_id")
    try:
        result = check(conf)
    finally:
        mariadb_source.query(f"DROP DATABASE {schema}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("error") and "channel:ch" in line]
    assert result.returncode == 2, result.stdout + result.stderr
    expected = {  # a cause and its fix, per line
        "both have server_id 1": "SET GLOBAL server_id",
        "both have gtid_domain_id 0": "SET GLOBAL gtid_domain_id",
        "sites.west.setl_server_id 1 is the server_id of site": "choose a server_id",
        "site west filters its binlog": "remove binlog_do_db and binlog_ignore_db",
        f"{schema}.keyless have no primary key": "ADD PRIMARY KEY",
        f"hand out the same AUTO_INCREMENT keys to {schema}.counted": "auto_increment_increment = 2",
        "may not set its session's server_id": "GRANT BINLOG REPLAY, BINLOG ADMIN ON *.* TO 'plain'",
    }
    for cause, fix in expected.items():
        found = [line for line in lines if cause in line]
        assert len(found) >= 1 and fix in found[0], (cause, lines)
    assert not any("site east filters" in line for line in lines), lines


def test_a_sound_channel_checks_ok(tmp_path, mariadb_factory):
    """Distinct ids and domains, interleaved auto-increments, keyed tables, no filter: the channel checks ok."""
    east, west = (mariadb_factory(server_id=30 + i, options={"gtid_domain_id": i, "auto_increment_increment": 2,
                                                             "auto_increment_offset": i}) for i in (1, 2))
    for server in (east, west):
        server.query("CREATE DATABASE sound")
        server.query("CREATE TABLE sound.t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    conf = write_channel(tmp_path, {"east": site(east, 4301, setl_gtid_domain_id=51),
                                    "west": site(west, 4302, setl_gtid_domain_id=52)}, "sound")
    result = check(conf)
    channel = [line for line in result.stdout.splitlines() if "channel:ch" in line]
    assert [line.split()[0] for line in channel] == ["ok"], result.stdout + result.stderr
    assert "east (server_id 31, gtid_domain_id 1)" in channel[0]
    directions = [line for line in result.stdout.splitlines() if "pipeline=ch." in line]
    assert {line.split()[1] for line in directions} == {"pipeline=ch.east-to-west", "pipeline=ch.west-to-east"}
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_channel_file_names_each_mistake(tmp_path):
    """Two sites with one reserved server_id, or a third site, are refused naming the file and key."""
    conf = write_channel(tmp_path, {"east": {"setl_server_id": 7}, "west": {"setl_server_id": 7}}, "x")
    with pytest.raises(ConfigError, match=r"sites.west.setl_server_id: 7 is also east's"):
        load_channel(conf, "ch")
    conf = write_channel(tmp_path, {"a": {"setl_server_id": 7}, "b": {"setl_server_id": 8},
                                    "c": {"setl_server_id": 9}}, "x")
    with pytest.raises(ConfigError, match="exactly two sites, got 3"):
        load_channel(conf, "ch")
    conf = write_channel(tmp_path, {"a": {"setl_server_id": 7}, "b": {}}, "x")
    with pytest.raises(ConfigError, match="sites.b.setl_server_id: required"):
        load_channel(conf, "ch")
    conf = write_channel(tmp_path, {"a": {"setl_server_id": 7}, "b": {"setl_server_id": 8}}, "x", loop_guard="row")
    with pytest.raises(ConfigError, match="loop_guard: 'row' is not one of auto, server_id, marker"):
        load_channel(conf, "ch")


def test_a_loader_that_may_not_mark_its_writes_stops_with_the_grant(tmp_path, mariadb_source, mariadb_target):
    """`setl start` of a loop_guard server_id direction whose user lacks BINLOG REPLAY stops, naming the GRANT."""
    mariadb_target.query("CREATE USER IF NOT EXISTS unmarked@'%' IDENTIFIED BY 'pw'")
    mariadb_target.query("GRANT ALL ON *.* TO unmarked@'%'")
    mariadb_target.query("REVOKE SUPER, BINLOG REPLAY, BINLOG ADMIN ON *.* FROM unmarked@'%'")
    at = mariadb_source.query("SHOW MASTER STATUS")[0]
    conf = write_channel(tmp_path, {"east": site(mariadb_source, 4401, start={"file": at[0], "pos": int(at[1])}),
                                    "west": {**site(mariadb_target, 4402), "user": "unmarked", "password": "pw"}},
                         "chk_nomark", loop_guard="server_id")
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline",
                             "ch.east-to-west", "--until-caught-up"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("setl: error")]
    assert len(errors) == 1, result.stderr
    assert "pipeline=ch.east-to-west" in errors[0] and "user 'unmarked' may not set its session's server_id" \
        in errors[0] and "GRANT BINLOG REPLAY, BINLOG ADMIN ON *.* TO 'unmarked'@'%'" in errors[0], errors
    assert "Traceback" not in result.stderr
