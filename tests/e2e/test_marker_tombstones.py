"""Tombstones under the marker loop guard (docs/conflicts.md): two primaries whose channel user may not
set its session's server_id, so both directions mark their writes with the mark row and comment. The
tombstone triggers setl makes on each site (by the loader writing it, and for a table created while
the channel runs by the direction reading it, over a marked connection of its own) stay on their
site: no CREATE TRIGGER crosses, a delete racing an insert settles alike on both sites, and both
binlogs stop growing once the writers stop."""

from __future__ import annotations

import datetime
import json
import re
import subprocess

import pytest

from setl.testing.servers import MariaDBServer, wait_until
from tests.e2e.test_bidirectional import equal_sites, rows, stop, two_primaries
from tests.e2e.test_marker_loop_guard import PASSWORD, USER, still, unprivileged

pytestmark = pytest.mark.timeout(300)

TABLE = "t (id INT PRIMARY KEY, v VARCHAR(20), ts DATETIME(6) NOT NULL)"
T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, 678901)


@pytest.fixture(scope="module")
def marker_sites(tmp_path_factory: pytest.TempPathFactory):
    """Two primaries with a user that may not set its session's server_id but may make triggers
    (log_bin_trust_function_creators=1: no SUPER needed)."""
    def setup(server: MariaDBServer) -> None:
        server.query(f"CREATE USER {USER}@'%' IDENTIFIED BY '{PASSWORD}'")
        server.query(f"GRANT ALL ON *.* TO {USER}@'%'")
        server.query(f"REVOKE SUPER, BINLOG REPLAY, BINLOG ADMIN ON *.* FROM {USER}@'%'")
        server.query("SET GLOBAL log_bin_trust_function_creators = 1")

    with two_primaries(tmp_path_factory, "mtomb", 30, domains=20, interleaved=False, setup=setup) as servers:
        yield servers


def triggers(server: MariaDBServer, schema: str) -> dict[str, tuple[str, ...]]:
    """Table -> the sites its tombstone triggers on `server` write into their tombstones (quoted in the body)."""
    found: dict[str, tuple[str, ...]] = {}
    for table, body in server.query("SELECT EVENT_OBJECT_TABLE, ACTION_STATEMENT FROM information_schema.TRIGGERS "
                                    "WHERE TRIGGER_SCHEMA = %s ORDER BY TRIGGER_NAME", (schema,)):
        found[table] = (*found.get(table, ()), *(s for s in ("'east'", "'west'") if s in body))
    return found


def trigger_sessions(server: MariaDBServer) -> list[tuple[int, bool]]:
    """Per CREATE TRIGGER statement the server's binlogs hold, its connection id (thread_id, as
    `mariadb-binlog` prints it: MariaDB rewrites a CREATE TRIGGER's text, no comment survives) and
    whether the mark row written last before it (its `session`, decoded by ``--verbose``) is that
    session's: the rule by which the other direction's reader drops it."""
    files = sorted(str(path) for path in server.datadir.glob("mysql-bin.[0-9]*"))
    text = subprocess.run(["mariadb-binlog", "--verbose", *files], capture_output=True, text=True, check=True,
                          timeout=60).stdout
    sessions, thread, mark_row, last_mark = [], 0, False, None
    for line in text.splitlines():
        found = re.search(r"\bthread_id=(\d+)", line)
        if found:
            thread = int(found[1])
        elif re.match(r"### (INSERT INTO|UPDATE) `setl`\.`setl_channel_mark`", line):
            mark_row = True
        elif mark_row and (session := re.match(r"###\s+@2=(\d+)", line)):
            last_mark, mark_row = int(session[1]), False
        elif re.search(r"\bCREATE\b.*\bTRIGGER\b", line, re.I):
            sessions.append((thread, last_mark == thread))
    return sessions


def test_tombstones_under_the_marker_guard_settle_a_race_and_no_trigger_crosses(tmp_path, marker_sites):
    """Marker guard, tombstones by default: each site's triggers write its own name, an insert racing the
    other site's delete ends deleted on both (the loss recorded), a table created while the channel runs
    gets triggers on both sites, no CREATE TRIGGER reaches the other binlog, and both binlogs stand still."""
    east, west = marker_sites
    schema = "mark_tomb"
    channel = unprivileged(equal_sites(tmp_path, "mt", east, west, schema, TABLE,
                                       conflicts={"policy": "last_writer_wins", "column": "ts"}))
    for n, site in enumerate(("east", "west"), 1):
        channel.config["sites"][site]["priority"] = n
    channel.write()
    check = channel.run("check", "--channel", channel.name)
    assert "loop_guard auto: east marker, west marker" in check.stdout, check.stdout + check.stderr
    assert "tombstones on" in check.stdout and "tombstone" not in "".join(
        line for line in check.stdout.splitlines() if line.startswith("error")), check.stdout
    table = f"{schema}.t"
    proc = channel.spawn()  # both loaders open: each makes its site's triggers
    try:
        wait_until(lambda: triggers(east, schema) == {"t": ("'east'", "'east'")}
                   and triggers(west, schema) == {"t": ("'west'", "'west'")}, timeout=60, message=channel.logs)
        still(channel, east, west, [table], proc)
    finally:
        assert stop(proc) == 0, channel.logs()

    # With the channel stopped: both insert key 1, east's later, and east deletes it (its tombstone, T0+5).
    west.query(f"INSERT INTO {table} VALUES (1, 'west-loses', %s)", (T0,))
    east.query(f"INSERT INTO {table} VALUES (1, 'east-wins', %s)", (T0 + datetime.timedelta(seconds=5),))
    east.query(f"DELETE FROM {table} WHERE id = 1")
    assert east.query("SELECT site FROM setl.setl_tombstones WHERE table_name = %s", (table,)) == [("east",)]
    proc = channel.spawn()
    try:
        still(channel, east, west, [table], proc)
        assert rows(east, table) == [] == rows(west, table)
        lost = east.query("SELECT decision, source_row FROM setl.setl_conflicts WHERE table_name = %s", (table,))
        assert [(d, json.loads(s)["v"]) for d, s in lost] == [("target_won", "west-loses")]

        # A table created on west while the channel runs: west-to-east carries it and makes its triggers
        # on east (its target) and on west (its source, over a connection marked as east-to-west's writes).
        west.query(f"CREATE TABLE {schema}.{TABLE.replace('t (', 'u (', 1)}")
        wait_until(lambda: triggers(east, schema).get("u") == ("'east'", "'east'")
                   and triggers(west, schema).get("u") == ("'west'", "'west'"), timeout=60, message=channel.logs)
        west.query(f"INSERT INTO {schema}.u VALUES (1, 'w', %s), (2, 'w', %s)", (T0, T0))
        wait_until(lambda: len(rows(east, f"{schema}.u")) == 2, timeout=60, message=channel.logs)
        west.query(f"DELETE FROM {schema}.u WHERE id = 1")  # west's own trigger leaves west's tombstone
        heads = still(channel, east, west, [table, f"{schema}.u"], proc)
        assert rows(east, f"{schema}.u") == rows(west, f"{schema}.u") and len(rows(east, f"{schema}.u")) == 1
        assert west.query("SELECT site FROM setl.setl_tombstones WHERE table_name = %s", (f"{schema}.u",)) \
            == [("west",)]
        assert east.query("SELECT site FROM setl.setl_tombstones WHERE table_name = %s", (f"{schema}.u",)) \
            == [("west",)]  # buried by east's loader as west's delete
        # Each site's triggers still write its own name, and each binlog holds only its own site's four
        # CREATE TRIGGERs (t and u): none crossed and was made again by the other direction's loader.
        assert triggers(east, schema) == {"t": ("'east'",) * 2, "u": ("'east'",) * 2}
        assert triggers(west, schema) == {"t": ("'west'",) * 2, "u": ("'west'",) * 2}
        # Each made in a session that wrote the mark the other direction's reader drops (never crossing).
        for server in (east, west):
            made = trigger_sessions(server)
            assert len(made) == 4 and all(marked for _, marked in made), made
        logs = "".join(path.read_text(errors="replace") for path in sorted(tmp_path.glob("setl-*.log")))
        crossed = [line for line in logs.splitlines() if "DDL not applied" in line and "TRIGGER" in line.upper()]
        assert not crossed, crossed  # no reader handed on a CREATE TRIGGER setl made
        assert still(channel, east, west, [table, f"{schema}.u"], proc) == heads, channel.logs()
        assert proc.poll() is None, channel.logs()
    finally:
        assert stop(proc) == 0, channel.logs()
