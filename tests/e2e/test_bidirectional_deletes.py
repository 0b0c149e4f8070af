"""A delete racing an insert of the same key in a two-way channel between two live MariaDB primaries
(docs/conflicts.md, "Tombstones"): a key inserted on both sites at once, the winning site deleting
it before the losing insert reaches it. The deleting site's tombstone (written by the trigger setl
makes when the direction into that site opens) beats the losing insert there, so both sites end
without the row, the lost insert recorded, and nothing returns. A delete made before the triggers
existed (a table created on both sites while the channel runs) stops the direction it would
leave different, with one line and the fix, instead (``conflicts.tombstones: true`` throughout)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from setl.testing.servers import MariaDBServer, wait_until
from tests.e2e.test_bidirectional import Channel, equal_sites, head, settled, stop, two_primaries

TABLE = "t (id INT PRIMARY KEY, v VARCHAR(20), ts DATETIME(6) NOT NULL)"
T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, 678901)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MariaDBServer]]:
    """Two primaries with binlogs, distinct server_ids and GTID domains."""
    with two_primaries(tmp_path_factory, "site", 20, interleaved=False) as servers:
        yield servers


def follow(channel: Channel, *pipelines: str, code: int = 0) -> str:
    """`setl start --until-caught-up` of `pipelines`: each applies what its source holds now, then exits
    `code` (0: all applied); its output."""
    args = [a for p in pipelines for a in ("--pipeline", p)]
    done = channel.run("start", *args, "--until-caught-up", timeout=180)
    assert (done.returncode == 0) == (code == 0), done.stdout + done.stderr
    return done.stdout + done.stderr


# (the other order, the loser's insert reaching the winner before the delete reaches the loser, and
# every other interleaving are the sink property's: tests/sinks/test_conflicts.py)
def nothing_returns(channel: Channel, east: MariaDBServer, west: MariaDBServer) -> None:
    """Run both directions until they settle, then 3 s more: neither binlog head moves (no change
    returns to where it started); the node then stops with exit 0."""
    proc = channel.spawn()
    try:
        heads = settled(channel, east, west, proc)
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=3)
        wait_until(lambda: datetime.datetime.now() > deadline or (head(east), head(west)) != heads, timeout=10)
        assert (head(east), head(west)) == heads, "a change returned to where it started"
    finally:
        assert stop(proc) == 0, channel.logs()


@pytest.mark.parametrize("order", ["delete-reaches-the-loser-first"])
def test_an_insert_racing_the_winners_delete_ends_deleted_on_both_sites(tmp_path: Path, sites: list[MariaDBServer],
                                                                         order: str) -> None:
    """East and west insert key 1 at once, east's later; east's insert wins on west, east deletes the
    row, west's losing insert reaches east after the delete: both end without the row, the lost insert
    is in east's setl_conflicts (a tombstone won), and both binlogs then stand still."""
    east, west = sites
    schema = f"race_{order.split('-')[0]}"
    channel = equal_sites(tmp_path, schema, east, west, schema, TABLE,
                          conflicts={"policy": "last_writer_wins", "column": "ts", "tombstones": True})
    for n, site in enumerate(("east", "west"), 1):
        channel.config["sites"][site]["priority"] = n
    channel.write()
    east_to_west, west_to_east = channel.pipelines
    follow(channel, east_to_west, west_to_east)  # both loaders open: each site's tombstone triggers are made
    triggers = [r[0] for r in east.query(f"SHOW TRIGGERS FROM {schema}")]
    assert len(triggers) == 2 and all(name.startswith("setl_tombstone_") for name in triggers)

    west.query(f"INSERT INTO {schema}.t VALUES (1, 'west-loses', %s)", (T0,))
    east.query(f"INSERT INTO {schema}.t VALUES (1, 'east-wins', %s)", (T0 + datetime.timedelta(seconds=5),))
    follow(channel, east_to_west)  # west: east's insert meets west's row, and wins
    assert west.query(f"SELECT v FROM {schema}.t") == [("east-wins",)]
    east.query(f"DELETE FROM {schema}.t WHERE id = 1")  # the winner deletes before the loser's insert arrives
    tomb = east.query("SELECT site, stamp FROM setl.setl_tombstones WHERE table_name = %s", (f"{schema}.t",))
    assert tomb == [("east", str(T0 + datetime.timedelta(seconds=5)))]
    if order.startswith("delete"):
        follow(channel, east_to_west)
        follow(channel, west_to_east)
    else:
        follow(channel, west_to_east)
        follow(channel, east_to_west)

    assert east.query(f"SELECT * FROM {schema}.t") == [] and west.query(f"SELECT * FROM {schema}.t") == []
    lost = east.query("SELECT decision, reason, source_row, target_row FROM setl.setl_conflicts WHERE table_name = %s",
                      (f"{schema}.t",))
    assert [(d, json.loads(s)["v"], t) for d, _, s, t in lost] == [("target_won", "west-loses", None)]
    assert "tombstone of site east's delete" in lost[0][1]
    won = west.query("SELECT decision, target_row FROM setl.setl_conflicts WHERE table_name = %s", (f"{schema}.t",))
    assert [(d, json.loads(t)["v"]) for d, t in won] == [("source_won", "west-loses")]

    nothing_returns(channel, east, west)  # both directions running: once settled, neither binlog grows
    assert east.query(f"SELECT * FROM {schema}.t") == [] and west.query(f"SELECT * FROM {schema}.t") == []


def test_a_delete_before_the_new_tables_triggers_racing_an_insert_stops_with_the_fix(
        tmp_path: Path, sites: list[MariaDBServer]) -> None:
    """Both sites create table u while the channel runs; east inserts and deletes key 1 before any trigger
    is on u, west inserts key 1 stamped earlier: west's insert reaches east (no row, no tombstone there),
    east's later delete then wins on west but left no tombstone on east, so east-to-west stops with one
    line (table, key, position, fix) rather than leave west without the row east holds; the fix (the key
    deleted on west by hand) and a resume end both sites equal, and nothing returns."""
    east, west = sites
    schema = "race_new"
    channel = equal_sites(tmp_path, schema, east, west, schema, TABLE,
                          conflicts={"policy": "last_writer_wins", "column": "ts", "tombstones": True})
    for n, site in enumerate(("east", "west"), 1):
        channel.config["sites"][site]["priority"] = n
    channel.write()
    east_to_west, west_to_east = channel.pipelines
    follow(channel, east_to_west, west_to_east)  # both directions opened before the table exists
    new = TABLE.replace("t (", "u (", 1)
    for server in (west, east):
        server.query(f"CREATE TABLE IF NOT EXISTS {schema}.{new}")
    east.query(f"INSERT INTO {schema}.u VALUES (1, 'east', %s)", (T0 + datetime.timedelta(seconds=5),))
    east.query(f"DELETE FROM {schema}.u WHERE id = 1")
    assert east.query("SELECT COUNT(*) FROM setl.setl_tombstones WHERE table_name = %s", (f"{schema}.u",)) == [(0,)]
    west.query(f"INSERT INTO {schema}.u VALUES (1, 'west', %s)", (T0,))
    follow(channel, west_to_east)  # east: no row and no tombstone of key 1, so west's insert is applied
    assert east.query(f"SELECT v FROM {schema}.u") == [("west",)]
    out = follow(channel, east_to_west, code=1)
    lines = [line for line in out.splitlines() if line.startswith("setl: error") and "left no tombstone" in line]
    assert lines, out
    line = lines[0]
    assert f"table={schema}.u" in line and "key [1]" in line and "position=" in line and "fix:" in line, line
    assert west.query(f"SELECT v FROM {schema}.u") == [("west",)]  # nothing of the refused batch written
    assert f"setl resume --pipeline {east_to_west}" in line, line  # the refusal paused the direction
    west.query(f"DELETE FROM {schema}.u WHERE id = 1")  # the fix: the delete's outcome, by hand on west
    resumed = channel.run("resume", "--pipeline", east_to_west)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    follow(channel, east_to_west)
    follow(channel, west_to_east)
    assert east.query(f"SELECT * FROM {schema}.u") == [] and west.query(f"SELECT * FROM {schema}.u") == []
    nothing_returns(channel, east, west)
