"""The conflicts half of the two-way benchmark (issue 36): conflicts found against conflicts made,
and what detection costs the load path.

Starts one MariaDB (setl.testing.servers) holding two sites, databases ``site_a`` and ``site_b``,
each with a table ``t`` of `--keys` rows, and a MySQL sink into each with a ``conflicts:`` policy
(last writer wins on ``updated_at``, sites a: 1, b: 2). For `--rounds` rounds, each site's writers
update `--writes` random rows of their own half of the keys, and `--shared` percent of the writes
go to a key of a common range instead (the same key on both sides in a round is a conflict made);
then each site's changes, with the before- and after-images the binlog would carry, are shipped
to the other site as one batch (the loop-back filter's job, the other site's own writes never
echoed, is done here by construction). Printed: rows/s applied with detection, conflicts made,
found on each side (each made conflict must be found on both sides: the record of every lost
write), and whether the two sites end equal. The same batches loaded without ``conflicts:`` give
the baseline rows/s in the same run.

It drives the sinks directly, without a binlog reader: the end-to-end half (sysbench on both
primaries, lag each way) needs the channel's loop-back filter (tools/bench/bench_bidirectional.py).

    python3 tools/bench/bench_conflicts.py [--keys 20000] [--rounds 10] [--writes 2000] [--shared 1]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.model import Batch, Op, Position, RowChange  # noqa: E402
from setl.sinks.conflicts import ConflictPolicy, TablePolicy  # noqa: E402
from setl.sinks.mysql import MysqlLoad  # noqa: E402
from setl.testing.servers import MariaDBServer  # noqa: E402

T0 = datetime.datetime(2026, 1, 1)
SITES = {"a": 1, "b": 2}


class Site:
    """A site: its rows (as the binlog would image them), its sink, its batches' positions."""

    def __init__(self, server: MariaDBServer, name: str, keys: int, conflicts: bool) -> None:
        self.name, self.db = name, f"site_{name}"
        self.rows = {k: {"id": k, "v": 0, "who": "init", "updated_at": T0} for k in range(keys)}
        other = "b" if name == "a" else "a"
        lww = TablePolicy("last_writer_wins", "updated_at")
        policy = ConflictPolicy(other, name, SITES, lww) if conflicts else None
        self.load = MysqlLoad(server.target_config(), pipeline=f"{other}_to_{name}", position_schema=self.db,
                              conflicts=policy)
        self.batches = 0

    def apply(self, changes: list[RowChange]) -> None:
        self.batches += 1
        n = self.batches
        placed = tuple(RowChange(c.op, self.db, "t", ("id",), c.before, c.after, Position("bench.000001", n * 10 + 5))
                       for c in changes)
        self.load.load(Batch(self.load.pipeline, n, 1, Position("bench.000001", n * 10),
                             Position("bench.000001", n * 10 + 10), placed))


def setup(server: MariaDBServer, keys: int) -> None:
    for db in ("site_a", "site_b"):
        server.query(f"DROP DATABASE IF EXISTS {db}")
        server.query(f"CREATE DATABASE {db}")
        server.query(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v BIGINT NOT NULL, who VARCHAR(16) NOT NULL, "
                     "updated_at DATETIME(6) NOT NULL)")
        for start in range(0, keys, 5000):
            values = ", ".join(f"({k}, 0, 'init', '{T0}')" for k in range(start, min(keys, start + 5000)))
            server.query(f"INSERT INTO {db}.t VALUES {values}")


def run(server: MariaDBServer, args: argparse.Namespace, conflicts: bool) -> dict[str, Any]:
    """One run of every round; the figures."""
    setup(server, args.keys)
    rng = random.Random(args.seed)
    a, b = Site(server, "a", args.keys, conflicts), Site(server, "b", args.keys, conflicts)
    shared_range = range(0, max(1, args.keys // 100))  # the keys both sides write now and then
    own = {"a": range(len(shared_range), (args.keys + len(shared_range)) // 2),
           "b": range((args.keys + len(shared_range)) // 2, args.keys)}
    made = applied = 0
    seconds = 0.0
    clock = T0
    with contextlib.ExitStack() as stack:
        for site in (a, b):
            site.load.open()
            stack.callback(site.load.close)
        for _ in range(args.rounds):
            logs: dict[str, dict[int, RowChange]] = {"a": {}, "b": {}}
            for site in (a, b):
                for _ in range(args.writes):
                    clock += datetime.timedelta(microseconds=rng.randrange(1, 50))
                    span = shared_range if rng.random() * 100 < args.shared else own[site.name]
                    key = rng.choice(span)
                    before = site.rows[key]
                    after = {"id": key, "v": before["v"] + 1, "who": site.name,
                             "updated_at": max(clock, before["updated_at"])}
                    site.rows[key] = after
                    first = logs[site.name].get(key)
                    logs[site.name][key] = RowChange(Op.UPDATE, "", "t", ("id",),
                                                     first.before if first else before, after)
            made += len(set(logs["a"]) & set(logs["b"]))
            for site in (a, b):  # each site's users write their rows; then each gets the other's
                server.query(f"REPLACE INTO {site.db}.t VALUES " + ", ".join(
                    f"({c.after['id']}, {c.after['v']}, '{site.name}', '{c.after['updated_at']}')"
                    for c in logs[site.name].values()) if logs[site.name] else "DO 0")
            for site, other in ((a, b), (b, a)):
                changes = list(logs[other.name].values())
                started = time.perf_counter()
                site.apply(changes)
                seconds += time.perf_counter() - started
                applied += len(changes)
            for site in (a, b):  # what the target holds now is what its next writes replace
                site.rows = {r[0]: {"id": r[0], "v": r[1], "who": r[2], "updated_at": r[3]}
                             for r in server.query(f"SELECT id, v, who, updated_at FROM {site.db}.t")}
    found = {}
    if conflicts:
        for site in (a, b):
            found[site.name] = server.query(f"SELECT COUNT(*) FROM {site.db}.setl_conflicts")[0][0]
    equal = (server.query("CHECKSUM TABLE site_a.t")[0][1] == server.query("CHECKSUM TABLE site_b.t")[0][1])
    return {"rows_per_second": applied / seconds if seconds else 0.0, "made": made, "found": found, "equal": equal}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--writes", type=int, default=2_000, help="writes per site per round")
    parser.add_argument("--shared", type=float, default=1.0, help="percent of writes to the shared keys")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args(argv)
    server = MariaDBServer(server_id=36).start()
    try:
        base = run(server, args, conflicts=False)
        found = run(server, args, conflicts=True)
    finally:
        server.cleanup()
    ratio = found["rows_per_second"] / base["rows_per_second"]
    print(f"applied with conflict detection: {found['rows_per_second']:,.0f} rows/s; without (baseline, same "
          f"batches): {base['rows_per_second']:,.0f} rows/s; ratio {ratio:.2f}")
    print(f"conflicts made: {found['made']}; found on site a: {found['found']['a']}, on site b: "
          f"{found['found']['b']} (each must equal made)")
    print(f"sites equal at the end: with detection {found['equal']}; without {base['equal']}")
    ok = found["equal"] and found["found"]["a"] == found["found"]["b"] == found["made"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
