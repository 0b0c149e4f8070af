"""Site wins (east) with tombstones in a two-way channel between two live MariaDB primaries: west's
insert of a key east deleted, meeting east's tombstone there, ranked by when east's delete reached
west (docs/conflicts.md, "Settling it exactly", issue 36). West's loader of east's deletes records
where west's binlog stood when each arrived; east's loader of west's insert asks west for it. An
insert made after the delete arrived stands on both sites, with no conflict; one that raced the
delete loses on both, recorded on east, whichever direction runs first, also across a kill -9 of the
west-to-east direction between the insert and the delete's arrival."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from setl.testing.servers import MariaDBServer, wait_until
from tests.e2e.test_bidirectional import Channel, equal_sites, two_primaries
from tests.e2e.test_bidirectional_deletes import follow, nothing_returns

pytestmark = pytest.mark.timeout(300)

TABLE = "t (id INT PRIMARY KEY, v VARCHAR(20), ts DATETIME(6) NOT NULL)"
T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, 678901)
WINS_EAST = {"policy": "site_wins", "site": "east", "tombstones": True}


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MariaDBServer]]:
    """Two primaries with binlogs, distinct server_ids and GTID domains."""
    with two_primaries(tmp_path_factory, "swins", 30, interleaved=False) as servers:
        yield servers


def channel_of(tmp_path: Path, schema: str, east: MariaDBServer, west: MariaDBServer) -> Channel:
    """A site-wins (east) channel over table t of `schema`, both directions opened once (triggers made)."""
    channel = equal_sites(tmp_path, schema, east, west, schema, TABLE, conflicts=WINS_EAST)
    for n, site in enumerate(("east", "west"), 1):
        channel.config["sites"][site]["priority"] = n
    channel.write()
    follow(channel, *channel.pipelines)
    return channel


def conflicts(server: MariaDBServer, schema: str) -> list[tuple[str, str, str | None]]:
    """(decision, reason, the lost version's v) of `server`'s recorded conflicts of table t."""
    found = server.query("SELECT decision, reason, source_row, target_row FROM setl.setl_conflicts WHERE "
                         "table_name = %s ORDER BY id", (f"{schema}.t",))
    return [(d, r, None if (s if d == "target_won" else t) is None else json.loads(s if d == "target_won" else t)["v"])
            for d, r, s, t in found]


def test_an_insert_made_after_the_winners_delete_arrived_stands_on_both_sites(tmp_path: Path,
                                                                               sites: list[MariaDBServer]) -> None:
    """East inserts key 1 and, once both sites hold it, deletes it; the delete reaches west (recorded
    there with west's binlog position); west then inserts key 1 again: on east it meets east's
    tombstone and is applied, no conflict anywhere, both sites end with west's row."""
    east, west = sites
    schema = "sw_after"
    channel = channel_of(tmp_path, schema, east, west)
    east_to_west, west_to_east = channel.pipelines
    east.query(f"INSERT INTO {schema}.t VALUES (1, 'east', %s)", (T0,))
    follow(channel, east_to_west)
    east.query(f"DELETE FROM {schema}.t WHERE id = 1")
    follow(channel, east_to_west)
    assert west.query(f"SELECT * FROM {schema}.t") == []
    assert west.query("SELECT COUNT(*) FROM setl.setl_delete_arrivals WHERE table_name = %s",
                      (f"{schema}.t",)) == [(1,)]
    west.query(f"INSERT INTO {schema}.t VALUES (1, 'west-after', %s)", (T0 + datetime.timedelta(seconds=1),))
    follow(channel, west_to_east)
    assert east.query(f"SELECT v FROM {schema}.t") == [("west-after",)]
    assert conflicts(east, schema) == [] and conflicts(west, schema) == []
    nothing_returns(channel, east, west)
    assert east.query(f"SELECT * FROM {schema}.t") == west.query(f"SELECT * FROM {schema}.t")


@pytest.mark.parametrize("order", ["delete-reaches-west-first", "insert-reaches-east-first-across-a-kill"])
def test_an_insert_racing_the_winners_delete_loses_on_both_sites(tmp_path: Path, sites: list[MariaDBServer],
                                                                 order: str) -> None:
    """East inserts and deletes key 1; west inserts key 1 before east's delete reaches it. Delete first:
    on west east's changes remove west's row (recorded there), the arrival recorded after the insert
    in west's binlog, so on east the insert loses ("raced"). Insert first, west-to-east killed -9 once
    it applied the insert and started again: on east the insert loses (no arrival recorded on west),
    recorded once; east's delete then removes it on west. Both end without the row."""
    east, west = sites
    schema = "sw_race_" + order.split("-")[0]
    channel = channel_of(tmp_path, schema, east, west)
    east_to_west, west_to_east = channel.pipelines
    east.query(f"INSERT INTO {schema}.t VALUES (1, 'east', %s)", (T0,))
    east.query(f"DELETE FROM {schema}.t WHERE id = 1")
    west.query(f"INSERT INTO {schema}.t VALUES (1, 'west-race', %s)", (T0 + datetime.timedelta(seconds=1),))
    if order.startswith("delete"):
        follow(channel, east_to_west)
        assert west.query(f"SELECT * FROM {schema}.t") == []
        follow(channel, west_to_east)
        ((decision, reason, lost),) = conflicts(east, schema)
        assert (decision, lost) == ("target_won", "west-race") and "raced" in reason, reason
    else:
        with open(tmp_path / "setl-west-to-east.log", "w") as log:
            proc = subprocess.Popen(channel.argv("start", "--pipeline", west_to_east), stdout=log,
                                    stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: proc.poll() is not None or conflicts(east, schema), timeout=60,
                       message=lambda: channel.logs())
            assert proc.poll() is None, (tmp_path / "setl-west-to-east.log").read_text()  # killed while running
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        follow(channel, west_to_east)  # started again: nothing applied twice
        ((decision, reason, lost),) = conflicts(east, schema)
        assert (decision, lost) == ("target_won", "west-race") and "before site east's latest delete" in reason, reason
        follow(channel, east_to_west)
    assert east.query(f"SELECT * FROM {schema}.t") == [] and west.query(f"SELECT * FROM {schema}.t") == []
    assert not [r for d, r, _ in conflicts(east, schema) + conflicts(west, schema) if r.startswith("unsettled")]
    assert [(d, lost) for d, _, lost in conflicts(west, schema)] == [("source_won", "west-race")]
    nothing_returns(channel, east, west)
    assert east.query(f"SELECT * FROM {schema}.t") == [] and west.query(f"SELECT * FROM {schema}.t") == []
