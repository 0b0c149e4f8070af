"""A two-way channel whose sites' user may not set its session's server_id (no BINLOG REPLAY, no
SUPER): `loop_guard: auto` falls back to the marker row (docs/bidirectional.md). Rows, DDL both
ways (a DROP TABLE, whose text MariaDB rewrites, included) and a transaction split in pieces cross
once each; both sites end equal and both binlogs stop growing once the writers stop."""

from __future__ import annotations

import time
from typing import Any

import pytest

from setl.testing.servers import MariaDBServer, wait_until
from tests.e2e.test_bidirectional import SPLIT, Channel, columns, equal_sites, head, rows, stop, two_primaries

pytestmark = pytest.mark.timeout(300)

USER, PASSWORD = "plain", "pw"


@pytest.fixture(scope="module")
def unprivileged_sites(tmp_path_factory: pytest.TempPathFactory):
    """Two primaries as `test_bidirectional`'s, each with a user that may not set its session's server_id."""
    def unprivileged_user(server: MariaDBServer) -> None:
        server.query(f"CREATE USER {USER}@'%' IDENTIFIED BY '{PASSWORD}'")
        server.query(f"GRANT ALL ON *.* TO {USER}@'%'")
        server.query(f"REVOKE SUPER, BINLOG REPLAY, BINLOG ADMIN ON *.* FROM {USER}@'%'")

    with two_primaries(tmp_path_factory, "msite", 20, domains=10, setup=unprivileged_user) as servers:
        yield servers


def unprivileged(channel: Channel, **extra: Any) -> Channel:
    """The channel's sites reached as the user without the privilege."""
    for site in channel.config["sites"].values():
        site.update(user=USER, password=PASSWORD)
    channel.config.update(extra)
    channel.write()
    return channel


def still(channel: Channel, east: MariaDBServer, west: MariaDBServer, tables: list[str], proc: Any,
          timeout: float = 90) -> tuple[Any, Any]:
    """Wait until both sites hold the same rows of `tables` and both binlog heads stood still for 3 s; the heads."""
    seen: list[tuple] = []

    def settled() -> bool:
        assert proc.poll() is None, channel.logs()
        seen.append((head(east), head(west), all(rows(east, t) == rows(west, t) for t in tables)))
        return len(seen) >= 7 and seen[-1][2] and all(s == seen[-1] for s in seen[-7:])

    wait_until(settled, timeout=timeout, interval=0.5, message=lambda: f"not still: {seen[-3:]}\n{channel.logs()}")
    return seen[-1][0], seen[-1][1]


def test_without_the_privilege_the_marker_keeps_every_change_from_returning(tmp_path, unprivileged_sites):
    """Rows, DDL each way (DROP TABLE too) and a split transaction cross once; then both binlogs stand still."""
    east, west = unprivileged_sites
    schema = "app_marker"
    channel = unprivileged(equal_sites(tmp_path, "mk", east, west, schema,
                                       "t (id INT AUTO_INCREMENT PRIMARY KEY, site VARCHAR(8), n INT)"))
    check = channel.run("check", "--channel", channel.name)
    assert "loop_guard auto: east marker, west marker" in check.stdout, check.stdout + check.stderr
    proc = channel.spawn()
    try:
        for i in range(10):  # auto-increment hands out odd keys on east, even on west
            east.query(f"INSERT INTO {schema}.t (site, n) VALUES ('east', {i})")
            west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', {i})")
        east.query(f"UPDATE {schema}.t SET n = n + 100 WHERE site = 'east' AND n < 5")
        west.query(f"DELETE FROM {schema}.t WHERE site = 'west' AND n >= 8")
        # Both directions past their start before any DDL: a table first met after its source was
        # altered is judged by its current shape, which the target does not have yet (a start-up race
        # of the target-table check, not of the loop guard).
        wait_until(lambda: proc.poll() is None and len(rows(west, f"{schema}.t")) == 18
                   and rows(east, f"{schema}.t") == rows(west, f"{schema}.t"), timeout=60, message=channel.logs)
        east.query(f"ALTER TABLE {schema}.t ADD COLUMN note VARCHAR(20) NULL")  # DDL on east ...
        west.query(f"CREATE TABLE {schema}.u (id INT PRIMARY KEY, v VARCHAR(10))")  # ... and on west
        west.query(f"CREATE TABLE {schema}.gone (id INT PRIMARY KEY)")
        wait_until(lambda: proc.poll() is None and "note" in columns(west, schema, "t")
                   and columns(east, schema, "u") == ["id", "v"] and columns(east, schema, "gone") == ["id"],
                   timeout=60, message=channel.logs)
        east.query(f"DROP TABLE {schema}.gone")  # logged as the server rewrote it: no comment survives
        west.query(f"INSERT INTO {schema}.t (site, n, note) VALUES ('west', 99, 'after ddl')")
        big = ", ".join(f"({k}, 'v{k % 10}')" for k in range(1, 3 * SPLIT + 51))
        east.query(f"INSERT INTO {schema}.u (id, v) VALUES {big}")  # one transaction of 650 rows: 4 pieces
        heads = still(channel, east, west, [f"{schema}.t", f"{schema}.u"], proc)
        assert len(rows(west, f"{schema}.u")) == 3 * SPLIT + 50
        assert len(rows(west, f"{schema}.t")) == 10 + 8 + 1
        assert columns(east, schema, "t") == columns(west, schema, "t") == ["id", "site", "n", "note"]
        assert columns(west, schema, "gone") == [] == columns(east, schema, "gone")
        time.sleep(2)  # several heartbeats and batch waits more: a returning change would move a head
        assert (head(east), head(west)) == heads, channel.logs()
        assert proc.poll() is None, channel.logs()
        for server, mark in ((west, "mk:east-to-west"), (east, "mk:west-to-east")):  # the marker did the work
            marked = server.query("SELECT COUNT(*), COALESCE(SUM(seq), 0) FROM setl.setl_channel_mark WHERE mark = %s",
                                  (mark,))[0]
            assert marked[0] >= 1 and marked[1] >= 4, (mark, marked)
        assert channel.logs().count("loop guard marker") >= 2, channel.logs()
    finally:
        assert stop(proc) == 0, channel.logs()


def test_marker_mode_refuses_a_site_logging_statements(tmp_path, unprivileged_sites):
    """`setl check --channel` with loop_guard marker refuses a site whose binlog_format is not ROW, naming the fix."""
    east, west = unprivileged_sites
    channel = Channel(tmp_path, "mr", east, west, "app_refused", loop_guard="marker")
    east.query("SET GLOBAL binlog_format = 'STATEMENT'")
    try:
        result = channel.run("check", "--channel", channel.name)
    finally:
        east.query("SET GLOBAL binlog_format = 'ROW'")
    lines = [line for line in result.stdout.splitlines() if line.startswith("error") and "channel:mr" in line]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and "site east logs with binlog_format STATEMENT: the marker loop guard needs ROW" \
        in lines[0] and "SET GLOBAL binlog_format = ROW" in lines[0], lines
