"""`setl check --channel` of a channel with tombstones (``conflicts.tombstones`` true, or not set: the
default): a site whose user could not make setl's tombstone triggers (no TRIGGER privilege; binlog
on, no SUPER, log_bin_trust_function_creators=0) is refused in one line with the fixes
(docs/conflicts.md); ``tombstones: false`` asks nothing of the kind and says the channel runs without."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.timeout(240)


def check(root: Path, sites: dict[str, dict[str, Any]], tombstones: bool | None,
          level: str = "error", site_wins: str | None = None) -> list[str]:
    """The `level` lines `setl check --channel ch` prints about the channel itself (tombstones None: not set;
    `site_wins`: that policy, the site named winning, instead of last writer wins)."""
    conf = root / f"conf_{tombstones}_{site_wins}"
    (conf / "channels").mkdir(parents=True, exist_ok=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(root / "meta.db")}}))
    conflicts: dict[str, Any] = ({"policy": "last_writer_wins", "column": "ts"} if site_wins is None
                                 else {"policy": "site_wins", "site": site_wins})
    if tombstones is not None:
        conflicts["tombstones"] = tombstones
    (conf / "channels" / "ch.yaml").write_text(yaml.safe_dump({
        "sites": sites, "tables": [{"source": r"chk_tomb\..*"}], "conflicts": conflicts}))
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "check", "--channel", "ch"],
                            capture_output=True, text=True, timeout=180)
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith(level) and "channel:ch" in line]


def test_tombstones_need_super_or_trusted_trigger_creators(tmp_path, mariadb_source, mariadb_target):
    """Tombstones on (set or by default) and a site user without SUPER where log_bin_trust_function_creators=0:
    one line naming the site, the cause and both fixes; with the setting at 1, or tombstones off, no such line."""
    user = "notrig"
    mariadb_source.query(f"CREATE USER IF NOT EXISTS {user}@'%' IDENTIFIED BY 'pw'")
    mariadb_source.query(f"GRANT ALL ON *.* TO {user}@'%'")
    mariadb_source.query(f"REVOKE SUPER ON *.* FROM {user}@'%'")
    trusted = mariadb_source.query("SELECT @@global.log_bin_trust_function_creators")[0][0]
    sites = {"east": {"host": mariadb_target.host, "port": mariadb_target.port, "user": mariadb_target.user,
                      "password": mariadb_target.password, "setl_server_id": 4501},
             "west": {"host": mariadb_source.host, "port": mariadb_source.port, "user": user, "password": "pw",
                      "setl_server_id": 4502}}
    try:
        mariadb_source.query("SET GLOBAL log_bin_trust_function_creators = 0")
        refused = [line for line in check(tmp_path, sites, True) if "tombstone" in line]
        assert len(refused) == 1, refused
        assert "site west" in refused[0] and f"user '{user}'" in refused[0] and "error 1419" in refused[0]
        assert "SET GLOBAL log_bin_trust_function_creators = 1" in refused[0] and "GRANT SUPER" in refused[0]
        assert "conflicts.tombstones: false" in refused[0] and "setl verify --channel" in refused[0]
        assert [line for line in check(tmp_path, sites, None) if "tombstone" in line] == refused  # the default
        assert not [line for line in check(tmp_path, sites, False) if "tombstone" in line]
        without = check(tmp_path, sites, False, level="warning")
        assert len(without) == 1 and "runs WITHOUT tombstones" in without[0], without
        mariadb_source.query("SET GLOBAL log_bin_trust_function_creators = 1")
        assert not [line for line in check(tmp_path, sites, True) if "tombstone" in line]
    finally:
        mariadb_source.query(f"SET GLOBAL log_bin_trust_function_creators = {int(trusted)}")
        mariadb_source.query(f"DROP USER IF EXISTS {user}@'%'")


def test_tombstones_need_the_trigger_privilege(tmp_path, mariadb_source, mariadb_target):
    """Tombstones by default and a site user without TRIGGER on the channel's tables: one line naming the
    site, the privilege, the table and both fixes (GRANT TRIGGER, or tombstones: false); granted, none."""
    user = "notrigpriv"
    mariadb_source.query("CREATE DATABASE IF NOT EXISTS chk_tomb")
    mariadb_source.query("CREATE TABLE IF NOT EXISTS chk_tomb.t (id INT PRIMARY KEY, ts DATETIME(6))")
    mariadb_source.query(f"CREATE USER IF NOT EXISTS {user}@'%' IDENTIFIED BY 'pw'")
    mariadb_source.query(f"GRANT ALL ON *.* TO {user}@'%'")
    mariadb_source.query(f"REVOKE TRIGGER ON *.* FROM {user}@'%'")
    sites = {"east": {"host": mariadb_target.host, "port": mariadb_target.port, "user": mariadb_target.user,
                      "password": mariadb_target.password, "setl_server_id": 4511},
             "west": {"host": mariadb_source.host, "port": mariadb_source.port, "user": user, "password": "pw",
                      "setl_server_id": 4512}}
    try:
        refused = [line for line in check(tmp_path, sites, None) if "tombstone" in line]
        assert len(refused) == 1, refused
        assert "site west" in refused[0] and "lacks the TRIGGER privilege on chk_tomb.t" in refused[0], refused
        assert "GRANT TRIGGER ON" in refused[0] and "conflicts.tombstones: false" in refused[0]
        mariadb_source.query(f"GRANT TRIGGER ON chk_tomb.* TO {user}@'%'")
        assert not [line for line in check(tmp_path / "granted", sites, None) if "tombstone" in line]
    finally:
        mariadb_source.query(f"DROP USER IF EXISTS {user}@'%'")
        mariadb_source.query("DROP DATABASE IF EXISTS chk_tomb")


def test_site_wins_needs_the_losers_binlog_position(tmp_path, mariadb_source, mariadb_target):
    """Site wins with tombstones: the loader into the losing site records its binlog position (SHOW MASTER
    STATUS, BINLOG MONITOR) with each winning delete it applies. The site's user, which reads that site's
    binlog as the other direction's source, needs the privilege already: without it the check refuses
    the site in a line naming it and the privilege; granted, no such line."""
    user = "nomonitor"
    mariadb_source.query(f"CREATE USER IF NOT EXISTS {user}@'%' IDENTIFIED BY 'pw'")
    mariadb_source.query(f"GRANT ALL ON *.* TO {user}@'%'")
    mariadb_source.query(f"REVOKE SUPER, BINLOG MONITOR ON *.* FROM {user}@'%'")
    sites = {"east": {"host": mariadb_target.host, "port": mariadb_target.port, "user": mariadb_target.user,
                      "password": mariadb_target.password, "setl_server_id": 4521},
             "west": {"host": mariadb_source.host, "port": mariadb_source.port, "user": user, "password": "pw",
                      "setl_server_id": 4522}}
    try:
        refused = [line for line in check(tmp_path, sites, None, site_wins="east") if "BINLOG MONITOR" in line]
        assert len(refused) == 1 and "site west" in refused[0], refused
        mariadb_source.query(f"GRANT BINLOG MONITOR ON *.* TO {user}@'%'")
        assert not [line for line in check(tmp_path / "granted", sites, None, site_wins="east")
                    if "BINLOG MONITOR" in line or "cannot read site west" in line]
    finally:
        mariadb_source.query(f"DROP USER IF EXISTS {user}@'%'")
