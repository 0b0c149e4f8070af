"""`setl check --channel` of a channel with ``conflicts.tombstones: true``: a site whose user could not
make setl's tombstone triggers (binlog on, no SUPER, log_bin_trust_function_creators=0) is refused in
one line with the fix (docs/conflicts.md); tombstones off asks nothing of the kind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.timeout(240)


def check(root: Path, sites: dict[str, dict[str, Any]], tombstones: bool) -> list[str]:
    """The error lines `setl check --channel ch` prints about the channel itself."""
    conf = root / f"conf_{tombstones}"
    (conf / "channels").mkdir(parents=True, exist_ok=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(root / "meta.db")}}))
    (conf / "channels" / "ch.yaml").write_text(yaml.safe_dump({
        "sites": sites, "tables": [{"source": r"chk_tomb\..*"}],
        "conflicts": {"policy": "last_writer_wins", "column": "ts", "tombstones": tombstones}}))
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "check", "--channel", "ch"],
                            capture_output=True, text=True, timeout=180)
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("error") and "channel:ch" in line]


def test_tombstones_need_super_or_trusted_trigger_creators(tmp_path, mariadb_source, mariadb_target):
    """Tombstones on and a site user without SUPER where log_bin_trust_function_creators=0: one line naming
    the site, the cause and both fixes; with the setting at 1, or tombstones off, no such line."""
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
        assert not [line for line in check(tmp_path, sites, False) if "tombstone" in line]
        mariadb_source.query("SET GLOBAL log_bin_trust_function_creators = 1")
        assert not [line for line in check(tmp_path, sites, True) if "tombstone" in line]
    finally:
        mariadb_source.query(f"SET GLOBAL log_bin_trust_function_creators = {int(trusted)}")
        mariadb_source.query(f"DROP USER IF EXISTS {user}@'%'")
