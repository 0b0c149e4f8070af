"""Site wins (east) with tombstones, its exact ranking of west's insert against east's delete (issue
36, docs/conflicts.md "Settling it exactly") in the field, on two live MariaDB primaries: east's
delete of many keys in one transaction handed on in pieces, west's inserts in split transactions
too; the same race read by a reader process and by the node's shared reader; under the marker loop
guard; and random concurrent writes on both sites while both directions run. Each ends with both
sites equal, no conflict recorded `unsettled:`, and (where the channel then runs on) both binlogs
standing still."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from setl.testing.servers import MariaDBServer
from tests.e2e.test_bidirectional import Channel, equal_sites, rows, settled, stop, two_primaries
from tests.e2e.test_bidirectional_deletes import follow, nothing_returns
from tests.e2e.test_bidirectional_property import Write, losers, lost_writes, write
from tests.e2e.test_bidirectional_site_wins import WINS_EAST, conflicts
from tests.e2e.test_marker_loop_guard import PASSWORD, USER, still, unprivileged

pytestmark = pytest.mark.timeout(300)

TABLE = "t (id INT PRIMARY KEY, v VARCHAR(20), ts DATETIME(6) NOT NULL)"
T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, 678901)
PIECE = 20  # pipeline.batch.max_rows (the sources' max_rows_in_memory): a bigger transaction comes in pieces
KEYS = 60  # east deletes them in one transaction: 3 pieces


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MariaDBServer]]:
    """Two primaries with binlogs, distinct server_ids and GTID domains, and a user that may not set
    its session's server_id but may make triggers (for the marker loop guard)."""
    def setup(server: MariaDBServer) -> None:
        server.query(f"CREATE USER {USER}@'%' IDENTIFIED BY '{PASSWORD}'")
        server.query(f"GRANT ALL ON *.* TO {USER}@'%'")
        server.query(f"REVOKE SUPER, BINLOG REPLAY, BINLOG ADMIN ON *.* FROM {USER}@'%'")
        server.query("SET GLOBAL log_bin_trust_function_creators = 1")

    with two_primaries(tmp_path_factory, "swf", 60, domains=60, interleaved=False, setup=setup) as servers:
        yield servers


def site_wins_channel(tmp_path: Path, schema: str, east: MariaDBServer, west: MariaDBServer, table: str = TABLE,
                      sources: dict[str, Any] | None = None, marker: bool = False) -> Channel:
    """A site-wins (east) channel over `table` of `schema`, batches (and pieces of a bigger
    transaction) of `PIECE` rows, the node's `sources` settings, as the unprivileged user (marker
    loop guard) with `marker`; not opened yet."""
    settings = {"meta": {"store": "sqlite", "path": str(tmp_path / "meta.db")}, "sources": sources or {}}
    channel = equal_sites(tmp_path, schema, east, west, schema, table, conflicts=WINS_EAST, settings=settings)
    channel.config["pipeline"]["batch"]["max_rows"] = PIECE
    for n, site in enumerate(("east", "west"), 1):
        channel.config["sites"][site]["priority"] = n
    if marker:
        unprivileged(channel)
    channel.write()
    return channel


def values(keys: range | list[int], v: str, at: datetime.datetime) -> str:
    return ", ".join(f"({k}, '{v}', '{at.isoformat(sep=' ')}')" for k in keys)


def race(channel: Channel, east: MariaDBServer, west: MariaDBServer) -> None:
    """East inserts `KEYS` keys and deletes them all in one transaction (pieces of `PIECE` rows); west
    inserts the odd keys in one transaction before east's changes reach it (raced), and, once they did,
    the even keys in one transaction (after). Each insert is ranked right: the raced ones lose on both
    sites (recorded on east `target_won`, "raced"; on west east's insert won), the later ones stand
    on both, no conflict of them, none `unsettled:`."""
    schema = channel.schema
    east_to_west, west_to_east = channel.pipelines
    raced, after = list(range(1, KEYS + 1, 2)), list(range(2, KEYS + 1, 2))
    follow(channel, east_to_west, west_to_east)  # both loaders open: each site's tombstone triggers are made
    east.query(f"INSERT INTO {schema}.t VALUES {values(range(1, KEYS + 1), 'east', T0)}")
    east.query(f"DELETE FROM {schema}.t WHERE id <= {KEYS}")  # one transaction, 3 pieces
    assert east.query("SELECT COUNT(DISTINCT deleted_gtid) FROM setl.setl_tombstones WHERE table_name = %s",
                      (f"{schema}.t",)) == [(1,)]
    west.query(f"INSERT INTO {schema}.t VALUES {values(raced, 'west-race', T0 + datetime.timedelta(seconds=1))}")
    follow(channel, east_to_west)
    assert rows(west, f"{schema}.t") == []
    assert west.query("SELECT COUNT(*) FROM setl.setl_delete_arrivals WHERE table_name = %s",
                      (f"{schema}.t",)) == [(KEYS,)]
    pieces = west.query("SELECT COUNT(*) FROM setl.setl_delete_arrivals WHERE table_name = %s AND origin_piece = 1",
                        (f"{schema}.t",))[0][0]
    assert pieces == KEYS, pieces  # east's delete was handed on in pieces (a position with a row inside it)
    west.query(f"INSERT INTO {schema}.t VALUES {values(after, 'west-after', T0 + datetime.timedelta(seconds=2))}")
    follow(channel, west_to_east)
    found = conflicts(east, schema)
    assert sorted(json.loads(k)[0] for (k,) in east.query(
        "SELECT row_key FROM setl.setl_conflicts WHERE table_name = %s", (f"{schema}.t",))) == raced, found
    assert all(d == "target_won" and lost == "west-race" and "raced" in r for d, r, lost in found), found
    split = east.query("SELECT COUNT(*) FROM setl.setl_conflicts WHERE table_name = %s AND position LIKE %s",
                       (f"{schema}.t", "%+%"))[0][0]
    assert split > 0, split  # west's raced insert came in pieces (a batch position inside the transaction)
    assert [k for k, v, _ in rows(east, f"{schema}.t")] == after
    assert {v for _, v, _ in rows(east, f"{schema}.t")} == {"west-after"}


def ends_equal(channel: Channel, east: MariaDBServer, west: MariaDBServer) -> None:
    """Both sites hold west's later inserts only; west recorded east's winning inserts over its raced
    rows; no conflict anywhere is `unsettled:`."""
    schema = channel.schema
    assert rows(east, f"{schema}.t") == rows(west, f"{schema}.t")
    assert [k for k, *_ in rows(west, f"{schema}.t")] == list(range(2, KEYS + 1, 2))
    on_west = conflicts(west, schema)
    assert sorted(lost for _, _, lost in on_west) == ["west-race"] * (KEYS // 2), on_west
    unsettled = [r for _, r, _ in conflicts(east, schema) + on_west if r.startswith("unsettled")]
    assert not unsettled, unsettled


def test_a_delete_in_pieces_ranks_each_insert_of_the_loser_right(tmp_path: Path, sites: list[MariaDBServer]) -> None:
    """East deletes 60 keys in one transaction handed on in 3 pieces; west's inserts of half of them
    before the delete arrived (one transaction, in 2 pieces) lose on both sites, of the other half
    after it (likewise) stand on both; nothing `unsettled:`, the sites equal, both binlogs then still."""
    east, west = sites
    channel = site_wins_channel(tmp_path, "swf_pieces", east, west)
    race(channel, east, west)
    nothing_returns(channel, east, west)
    ends_equal(channel, east, west)


@pytest.mark.parametrize("reader", ["reader_process", "shared_reader"])
def test_the_race_read_by_a_reader_process_or_the_shared_reader(tmp_path: Path, sites: list[MariaDBServer],
                                                                reader: str) -> None:
    """The same race, both directions read by a reader process (`sources.reader_process`) or by the
    node's shared reader (`sources.shared_reader_server_id`): ranked alike, the sites equal."""
    east, west = sites
    sources = {"reader_process": True} if reader == "reader_process" else {"shared_reader_server_id": 4_000_061}
    channel = site_wins_channel(tmp_path, f"swf_{reader}", east, west, sources=sources)
    race(channel, east, west)
    nothing_returns(channel, east, west)
    ends_equal(channel, east, west)


def test_the_race_under_the_marker_loop_guard(tmp_path: Path, sites: list[MariaDBServer]) -> None:
    """The same race where the loaders may not set their session's server_id (the marker loop guard):
    ranked alike, the sites equal, and nothing loops back (both binlogs still)."""
    east, west = sites
    channel = site_wins_channel(tmp_path, "swf_marker", east, west, marker=True)
    check = channel.run("check", "--channel", channel.name)
    assert "loop_guard auto: east marker, west marker" in check.stdout, check.stdout + check.stderr
    race(channel, east, west)
    proc = channel.spawn()
    try:
        heads = still(channel, east, west, [f"{channel.schema}.t"], proc)
        assert still(channel, east, west, [f"{channel.schema}.t"], proc) == heads, channel.logs()
    finally:
        assert stop(proc) == 0, channel.logs()
    ends_equal(channel, east, west)


RANDOM_KEYS = 6
OPS = ["upsert", "upsert", "update", "delete", "delete"]


def random_writers(sites: dict[str, MariaDBServer], table: str, seed: int, seconds: float) -> list[Write]:
    """Two writer threads per site, each its own connection and random stream (from `seed`), writing
    upserts, updates and deletes of `RANDOM_KEYS` keys for `seconds`; every write as its writer saw it."""
    done: list[Write] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(2 * len(sites))

    def writer(site: str, n: int) -> None:
        rng = random.Random(f"{seed}-{site}-{n}")
        try:
            with contextlib.closing(sites[site].connect()) as conn:
                start.wait(10)
                ends = time.monotonic() + seconds
                step = 0
                while time.monotonic() < ends:
                    made = write(conn, table, f"{site}{n}-", step, rng.choice(OPS), rng.randrange(RANDOM_KEYS))
                    with lock:
                        done.append(made)
                    step += 1
                    time.sleep(rng.choice([0, 0, 0.001, 0.005, 0.02]))
        except BaseException as exc:  # re-raised by the caller
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(site, n), name=f"writer-{site}{n}") for site in sites
               for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    assert not errors and not any(t.is_alive() for t in threads), (seed, errors)
    return done


def test_random_concurrent_writes_end_equal_with_every_lost_write_of_west_recorded(
        tmp_path: Path, sites: list[MariaDBServer]) -> None:
    """Two writers per site for 10 s (seeded), inserts, updates and deletes of 6 keys, both directions
    running in a node, readers in processes of their own: once the writers stop and the channel
    caught up, the sites are equal, no conflict is `unsettled:`, and every write of west whose
    version is on neither site (and that no write replaced knowingly) is a conflict's lost version."""
    east, west = sites
    seed = int(os.environ.get("SETL_TEST_SEED") or int.from_bytes(os.urandom(4), "big"))  # to run one again
    table = "t (id INT PRIMARY KEY, v VARCHAR(16) NOT NULL, deleted TINYINT NOT NULL, updated_at DATETIME(6) NOT NULL)"
    channel = site_wins_channel(tmp_path, "swf_random", east, west, table=table, sources={"reader_process": True})
    name = f"{channel.schema}.t"
    proc = channel.spawn()
    try:
        settled(channel, east, west, proc)  # both loaders open: each site's tombstone triggers are made
        writes = random_writers(channel.servers, name, seed, 10)
        settled(channel, east, west, proc, timeout=120)
    finally:
        assert stop(proc) == 0, f"seed {seed}\n{channel.logs()}"
    where = f"seed {seed} ({len(writes)} writes)"
    final = rows(east, name)
    assert final == rows(west, name), f"{where}: the sites differ\n{final}\n{rows(west, name)}\n{writes}"
    unsettled = [r for _, r, _ in conflicts(east, channel.schema) + conflicts(west, channel.schema)
                 if r.startswith("unsettled")]
    assert not unsettled, f"{where}: {unsettled}"
    versions = {r[0]: r[1] for r in final}
    recorded = losers(east, name) | losers(west, name)
    missing = [w for w in lost_writes(writes, versions) if w.site.startswith("west") and w.after not in recorded]
    assert not missing, f"{where}: lost writes of west with no conflict recorded: {missing}\nall writes: {writes}"
    assert any(w.site.startswith("west") and w.op == "upsert" and w.before is None and w.took for w in writes), where
    print(f"{where}: {len(conflicts(east, channel.schema))} conflicts on east, {len(conflicts(west, channel.schema))} "
          f"on west, {len(lost_writes(writes, versions))} lost writes")  # -s: what the run raced
