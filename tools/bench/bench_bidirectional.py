"""Two-way sync end to end (issue 36): a channel between two live MariaDB primaries under sysbench
on both at once, then with 1% of the writes to shared keys.

Starts two MariaDB servers, ``east`` and ``west`` (distinct server_id and GTID domain, interleaved
auto-increments), prepares sysbench's tables in ``sb_east`` on east and ``sb_west`` on west
(disjoint keys: each site's sysbench writes its own database), copies each to the other site and
starts a channel (`conf/channels/bench.yaml`, both directions in one `setl start`) at both binlog
heads. Then:

1. **Follow.** For each rate of `--rates` (sysbench tx/s on *each* site, ascending) both sites run
   sysbench for `--window` seconds while each commits a marker row every 20 ms; a direction's lag is
   the time from a marker's commit on its source to the marker being visible on the other site. A
   direction *follows* a rate when its lag p99 is under `--bound` seconds (an unbroken run from the
   lowest rate up); it is reported in row changes/s (sysbench's achieved tx/s x 4).
2. **Conflicts.** For `--conflict-seconds` both sites run sysbench at `--conflict-rate` and a small
   writer on each site updates random rows of ``bench.shared`` (`--shared-keys` rows, last writer
   wins on ``updated_at``, stamped ``GREATEST(NOW(6), updated_at + 1 µs)``) at 1% of that site's row
   changes, each reading (locked) the version it replaces. A conflict *made* is a fork: writes on
   both sites that replaced the same version of a key. It is *found* when a ``setl_conflicts`` row
   on either site names that key and that version as the source's before-image. Every *lost write*
   (a version that is not the final one and that no write replaced knowingly) must be the losing
   version of a recorded conflict.
3. **Verify.** Once both directions settle: `setl verify --channel bench` and CHECKSUM TABLE of
   every table on both sites, and both binlogs standing still.
4. **Catch-up, two-way against one-way.** The channel stops and both sites run sysbench unthrottled
   for `--backlog-seconds`. The baselines, in the same run: a one-way pipeline catching up east's
   backlog into a third server that holds east's tables as they were at the backlog's start, once
   without and once with the channel's conflicts block. Then the channel catches up both backlogs at
   once (`--until-caught-up`; each direction's time is when its ack reached its backlog's end).
   Printed: rows/s of each (start-up included), and the ratios two-way/one-way.

Peak RSS (VmHWM) of the setl process is sampled in each phase.

    python3 tools/bench/bench_bidirectional.py [--rates 100,250,500,1000] [--window 25] [--bound 1.0]
        [--conflict-rate 250] [--conflict-seconds 60] [--shared-keys 10] [--backlog-seconds 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import catchup  # noqa: E402
import sysbench  # noqa: E402

from setl.meta import SqliteMetaStore  # noqa: E402
from setl.testing.servers import MariaDBServer  # noqa: E402

SITES = ("east", "west")
STAMP = "GREATEST(NOW(6), updated_at + INTERVAL 1 MICROSECOND)"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] if ordered else float("inf")


class Node:
    """`setl start` of both directions (or of one pipeline) in the background, its peak RSS sampled."""

    def __init__(self, conf: Path, pipelines: list[str], *extra: str) -> None:
        argv = [sys.executable, "-m", "setl.cli", "--conf", str(conf), "start",
                *(a for p in pipelines for a in ("--pipeline", p)), *extra]
        self.log = open(conf.parent / f"setl-{int(time.time() * 1000)}.log", "w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self.rss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-rss", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.rss = max(self.rss, catchup.peak_rss_mib(self.proc.pid))

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise SystemExit(f"setl stopped ({self.proc.returncode}):\n{Path(self.log.name).read_text()[-3000:]}")

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._stop.set()
        self._thread.join(5)
        self.log.close()
        return code

    def stop(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._thread.join(5)
        self.log.close()


class Markers:
    """Each site commits a marker row every 20 ms into its own table; the other site's arrival times."""

    def __init__(self, servers: dict[str, MariaDBServer]) -> None:
        self.servers = servers
        self.committed: dict[str, dict[int, float]] = {s: {} for s in servers}
        self.seen: dict[str, dict[int, float]] = {s: {} for s in servers}  # by the *source* site's name
        self.next_id = {s: 1 for s in servers}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _write(self, site: str) -> None:
        with contextlib.closing(self.servers[site].connect(database="bench")) as conn, conn.cursor() as cur:
            while not self._stop.is_set():
                n = self.next_id[site]
                cur.execute(f"INSERT INTO lag_{site} (id) VALUES (%s)", (n,))
                self.committed[site][n] = time.time()
                self.next_id[site] = n + 1
                self._stop.wait(0.02)

    def _watch(self, site: str, other: str) -> None:
        seen, newest_seen = self.seen[site], max(self.seen[site], default=0)
        with contextlib.closing(self.servers[other].connect(database="bench")) as conn, conn.cursor() as cur:
            while not self._stop.is_set():
                cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM lag_{site}")
                newest = cur.fetchone()[0]
                now = time.time()
                for n in range(newest_seen + 1, newest + 1):
                    seen[n] = now
                newest_seen = max(newest_seen, newest)
                time.sleep(0.005)

    def start(self) -> dict[str, int]:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._write, args=(s,), name=f"marks-{s}") for s in SITES] + [
            threading.Thread(target=self._watch, args=(s, o), name=f"watch-{s}") for s, o in zip(SITES, SITES[::-1])]
        for thread in self._threads:
            thread.start()
        return dict(self.next_id)

    def drained(self, up_to: dict[str, int]) -> bool:
        return all(n in self.seen[s] for s in SITES for n in range(1, up_to[s]))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def lags(self, site: str, first: int, last: int, now: float) -> list[float]:
        return [max(0.0, self.seen[site].get(n, now) - self.committed[site][n]) for n in range(first, last)
                if n in self.committed[site]]


class SharedWriter:
    """Updates random rows of bench.shared on one site at a fixed rate; records (key, replaced, written)."""

    def __init__(self, server: MariaDBServer, site: str, keys: int, rate: float, seed: int) -> None:
        self.server, self.site, self.keys, self.rate = server, site, keys, rate
        self.rng = random.Random(seed)
        self.writes: list[tuple[int, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"shared-{site}")

    def _run(self) -> None:
        with contextlib.closing(self.server.connect()) as conn, conn.cursor() as cur:
            step = 0
            began = time.monotonic()
            while not self._stop.is_set():
                key = self.rng.randrange(self.keys)
                token = f"{self.site}{step}"
                cur.execute("BEGIN")
                cur.execute("SELECT v FROM bench.shared WHERE id = %s FOR UPDATE", (key,))
                before = cur.fetchone()[0]
                cur.execute(f"UPDATE bench.shared SET v = %s, site = %s, updated_at = {STAMP} WHERE id = %s",
                            (token, self.site, key))
                cur.execute("COMMIT")
                self.writes.append((key, before, token))
                step += 1
                self._stop.wait(max(0.0, began + step / self.rate - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def conflicts_made_and_found(writers: list[SharedWriter], servers: dict[str, MariaDBServer]) -> dict[str, Any]:
    """Forks made by the writers against the conflicts recorded on both sites, and the lost writes."""
    by_fork: dict[tuple[int, str], set[str]] = {}
    for writer in writers:
        for key, before, _ in writer.writes:
            by_fork.setdefault((key, before), set()).add(writer.site)
    made = {fork for fork, sites in by_fork.items() if len(sites) == 2}
    records: dict[str, list[tuple]] = {}
    for site, server in servers.items():
        records[site] = [(json.loads(k)[0], json.loads(b)["v"] if b else None, d, json.loads(s), json.loads(t))
                         for k, b, d, s, t in server.query(
                             "SELECT row_key, source_before, decision, source_row, target_row FROM "
                             "setl.setl_conflicts WHERE table_name = 'bench.shared'")]
    recorded = {(key, before) for rows in records.values() for key, before, *_ in rows}
    found = made & recorded
    final = dict(servers["east"].query("SELECT id, v FROM bench.shared"))
    replaced = {before for w in writers for _, before, _ in w.writes}
    lost = [(key, token) for w in writers for key, _, token in w.writes
            if token != final[key] and token not in replaced]
    losers = {(t if d == "source_won" else s)["v"] for rows in records.values() for _, _, d, s, t in rows
              if (t if d == "source_won" else s) is not None}
    return {"writes": sum(len(w.writes) for w in writers), "made": len(made), "found": len(found),
            "recorded": {site: len(rows) for site, rows in records.items()}, "lost": len(lost),
            "lost_unrecorded": [x for x in lost if x[1] not in losers]}


def heads(servers: dict[str, MariaDBServer]) -> dict[str, tuple[str, int]]:
    return {site: catchup.head(server) for site, server in servers.items()}


def acks(meta: Path, pipelines: dict[str, str]) -> dict[str, tuple[str, int] | None]:
    """The acked position of each direction (by its source site)."""
    store = SqliteMetaStore(meta)
    try:
        out: dict[str, tuple[str, int] | None] = {}
        for site, name in pipelines.items():
            ack = store.position(name)
            out[site] = (ack.position.log, ack.position.offset) if ack is not None else None
        return out
    finally:
        store.close()


def settle(servers: dict[str, MariaDBServer], meta: Path, pipelines: dict[str, str], node: Node,
           timeout: float = 300) -> dict[str, tuple[str, int]]:
    """Wait until each direction acked its source's head twice in a row with the heads unchanged."""
    last = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node.check()
        now = (heads(servers), acks(meta, pipelines))
        if now[0] == now[1] and now == last:
            return now[0]
        last = now
        time.sleep(0.5)
    raise SystemExit(f"the channel did not settle within {timeout:.0f}s: {last}")


def checksums(servers: dict[str, MariaDBServer], tables: dict[str, list[str]]) -> bool:
    sums = {site: {db: sysbench.checksums(sysbench.Conn.from_server(server, db), names)
                   for db, names in tables.items()} for site, server in servers.items()}
    return sums["east"] == sums["west"]


def write_channel(folder: Path, servers: dict[str, MariaDBServer], start: dict[str, tuple[str, int]]) -> Path:
    conf = folder / "conf"
    (conf / "channels").mkdir(parents=True, exist_ok=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"node": {"id": "bench"},
                                                    "meta": {"store": "sqlite", "path": str(folder / "meta.db")}}))
    channel = {
        "sites": {site: {"host": s.host, "port": s.port, "user": s.user, "password": s.password,
                         "setl_server_id": 4001 + i, "setl_gtid_domain_id": 41 + i, "priority": i + 1,
                         "start": {"file": start[site][0], "pos": start[site][1]}}
                  for i, (site, s) in enumerate(servers.items())},
        "tables": [{"source": r"sb_.*\..*"}, {"source": r"bench\..*"}],
        "pipeline": {"parallelism": 3, "batch": {"max_rows": 5000, "max_wait_ms": 20}},
        # sysbench's tables are disjoint (no conflict can arise); bench.shared is last writer wins
        "conflicts": {"policy": "site_wins", "site": "east",
                      "tables": {"bench.shared": {"policy": "last_writer_wins", "column": "updated_at"}}},
    }
    (conf / "channels" / "bench.yaml").write_text(yaml.safe_dump(channel, sort_keys=False))
    return conf


def follow(args: argparse.Namespace, servers: dict[str, MariaDBServer], node: Node) -> dict[str, float]:
    """Phase 1: the highest row changes/s each direction follows with lag p99 under the bound."""
    markers = Markers(servers)
    followed: dict[str, float] = {}
    broke: set[str] = set()
    rates = [int(r) for r in args.rates.split(",")]
    print(f"{'tx/s per site':>13} {'achieved east/west':>19} {'east->west p50/p99 ms':>22} "
          f"{'west->east p50/p99 ms':>22}", flush=True)
    for rate in rates:
        first = markers.start()
        loads = {site: sysbench.start(sysbench.Conn.from_server(server, f"sb_{site}"), seconds=args.window,
                                      threads=args.threads, rate=rate, tables=args.tables,
                                      table_size=args.table_size) for site, server in servers.items()}
        results = {site: load.wait() for site, load in loads.items()}
        last = dict(markers.next_id)
        deadline = time.monotonic() + max(60.0, args.window * 2)
        while not markers.drained(last) and time.monotonic() < deadline:
            node.check()
            time.sleep(0.5)
        now = time.time()
        markers.stop()
        cells = []
        for site in SITES:
            lags = markers.lags(site, first[site], last[site], now)
            p50, p99 = percentile(lags, 50), percentile(lags, 99)
            cells.append(f"{p50 * 1000:>9.0f} / {p99 * 1000:>9.0f}")
            if p99 >= args.bound:
                broke.add(site)
            elif site not in broke:  # the highest of an unbroken run of followed rates from the lowest up
                followed[site] = results[site].tps * 4
        print(f"{rate:>13} {results['east'].tps:>9.0f}/{results['west'].tps:<9.0f} {cells[0]:>22} {cells[1]:>22}",
              flush=True)
    return {**followed, **{f"{site}_broke": 1.0 for site in broke}}


def conflicts_phase(args: argparse.Namespace, servers: dict[str, MariaDBServer], node: Node) -> dict[str, Any]:
    """Phase 2: sysbench on both sites plus 1% of each site's row changes to the shared keys."""
    per_site = args.conflict_rate * 4 * args.shared_percent / 100  # shared writes/s on each site
    writers = [SharedWriter(server, site, args.shared_keys, per_site, seed=args.seed + i)
               for i, (site, server) in enumerate(servers.items())]
    loads = {site: sysbench.start(sysbench.Conn.from_server(server, f"sb_{site}"), seconds=args.conflict_seconds,
                                  threads=args.threads, rate=args.conflict_rate, tables=args.tables,
                                  table_size=args.table_size) for site, server in servers.items()}
    for writer in writers:
        writer.start()
    results = {site: load.wait() for site, load in loads.items()}
    for writer in writers:
        writer.stop()
    node.check()
    return {"writers": writers, "tps": {site: r.tps for site, r in results.items()}, "per_site": per_site}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100,250,500,1000", help="sysbench tx/s on each site, ascending")
    parser.add_argument("--window", type=float, default=25, help="seconds at each rate")
    parser.add_argument("--bound", type=float, default=1.0, help="lag p99 bound in seconds")
    parser.add_argument("--conflict-rate", type=int, default=250, help="sysbench tx/s on each site in phase 2")
    parser.add_argument("--conflict-seconds", type=float, default=60)
    parser.add_argument("--shared-percent", type=float, default=1.0, help="shared writes, percent of row changes")
    parser.add_argument("--shared-keys", type=int, default=10)
    parser.add_argument("--backlog-seconds", type=float, default=20)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=4, help="sysbench threads on each site")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args(argv)
    began = time.monotonic()
    tables = [f"sbtest{n}" for n in range(1, args.tables + 1)]
    ok = True
    with tempfile.TemporaryDirectory(prefix="setl-bidi-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        servers = {site: stack.enter_context(MariaDBServer(
            folder / site, server_id=1 + i, options={"gtid_domain_id": 1 + i, "auto_increment_increment": 2,
                                                    "auto_increment_offset": 1 + i}))
            for i, site in enumerate(SITES)}
        for site, server in servers.items():
            sysbench.prepare(sysbench.Conn.from_server(server, f"sb_{site}"), tables=args.tables,
                             table_size=args.table_size)
        for site, other in zip(SITES, SITES[::-1]):  # each site's tables copied to the other, before the heads
            p0 = catchup.read_tables(servers[site], f"sb_{site}", tables)
            sysbench.create_tables(sysbench.Conn.from_server(servers[other], f"sb_{site}"), tables=args.tables)
            catchup.write_tables(servers[other], f"sb_{site}", p0)
        for server in servers.values():
            server.query("CREATE DATABASE bench")
            for site in SITES:
                server.query(f"CREATE TABLE bench.lag_{site} (id INT PRIMARY KEY, "
                             "at TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6))")
            server.query("CREATE TABLE bench.shared (id INT PRIMARY KEY, v VARCHAR(24) NOT NULL, "
                         "site VARCHAR(8) NOT NULL, updated_at DATETIME(6) NOT NULL)")
            server.query("INSERT INTO bench.shared SELECT seq, 'init', 'init', '2026-01-01' FROM bench.seq_0_to_"
                         f"{args.shared_keys - 1}")
        conf = write_channel(folder / "channel", servers, heads(servers))
        pipelines = {"east": "bench.east-to-west", "west": "bench.west-to-east"}
        meta = folder / "channel" / "meta.db"
        all_tables = {f"sb_{s}": tables for s in SITES} | {"bench": ["lag_east", "lag_west", "shared"]}

        node = Node(conf, list(pipelines.values()))
        try:
            settle(servers, meta, pipelines, node)  # started and caught up before the first step
            print(f"phase 1: sysbench oltp_write_only on both sites ({args.tables} tables x {args.table_size} "
                  f"rows each, {args.threads} threads), {args.window:.0f}s per rate", flush=True)
            followed = follow(args, servers, node)
            for site, other in zip(SITES, SITES[::-1]):
                print(f"{site} -> {other} follows {followed.get(site, 0):,.0f} row changes/s with lag p99 < "
                      f"{args.bound:g}s" + (" (the highest rate tried: try higher --rates)"
                                            if site in followed and f"{site}_broke" not in followed else ""))
            print(f"\nphase 2: sysbench {args.conflict_rate} tx/s on each site for {args.conflict_seconds:.0f}s, "
                  f"plus {args.shared_percent:g}% of each site's row changes as updates of {args.shared_keys} "
                  "shared keys", flush=True)
            phase2 = conflicts_phase(args, servers, node)
            settle(servers, meta, pipelines, node)
            still = heads(servers)
            time.sleep(2)
            standing = heads(servers) == still
            found = conflicts_made_and_found(phase2["writers"], servers)
            print(f"shared writes: {found['writes']} ({phase2['per_site']:.1f}/s on each site); conflicts made "
                  f"(forks: writes on both sites replacing one version): {found['made']}; found in setl_conflicts: "
                  f"{found['found']} of {found['made']}; rows recorded east {found['recorded']['east']}, west "
                  f"{found['recorded']['west']}; lost writes {found['lost']}, unrecorded "
                  f"{len(found['lost_unrecorded'])}")
            verify = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "verify", "--channel",
                                     "bench"], cwd=ROOT, capture_output=True, text=True, timeout=600)
            equal = checksums(servers, all_tables)
            print(f"\nphase 3: setl verify --channel: exit {verify.returncode}; CHECKSUM TABLE equal on both sites: "
                  f"{equal}; both binlogs still for 2s: {standing}; peak RSS of the channel's node "
                  f"{node.rss:.0f} MiB", flush=True)
            ok = ok and verify.returncode == 0 and equal and standing and found["found"] == found["made"] \
                and not found["lost_unrecorded"]
            if verify.returncode != 0:
                print(verify.stdout[-3000:] + verify.stderr[-3000:])
        finally:
            node.stop()
            follow_rss = node.rss

        # phase 4: backlogs on both sites with the channel stopped; one-way baselines, then the channel
        start = heads(servers)
        p0 = catchup.read_tables(servers["east"], "sb_east", tables)
        loads = {site: sysbench.start(sysbench.Conn.from_server(server, f"sb_{site}"), seconds=args.backlog_seconds,
                                      threads=args.threads, rate=0, tables=args.tables, table_size=args.table_size)
                 for site, server in servers.items()}
        rows = {site: load.wait().row_changes for site, load in loads.items()}
        end = heads(servers)
        print(f"\nphase 4: backlogs of {rows['east']:,} (east) and {rows['west']:,} (west) row changes", flush=True)
        oneway = {}
        # first the baselines: east's binlog then ends at its backlog's end (the channel writes it later)
        for label, conflicts in (("plain", False), ("conflicts", True)):
            third = MariaDBServer(folder / f"oneway-{label}", server_id=9).start()
            sysbench.create_tables(sysbench.Conn.from_server(third, "sb_east"), tables=args.tables)
            catchup.write_tables(third, "sb_east", p0)
            conf_one = catchup.write_conf(folder / f"oneway-{label}-conf", "oneway", servers["east"], third,
                                          start["east"], max_wait_ms=20, tables=(r"sb_east\..*",))
            if conflicts:  # the same detection as the channel's (locking reads), on a one-way pipeline
                with open(conf_one / "pipelines" / "oneway.yaml", "a") as spec:
                    spec.write("site: east\nconflicts: {policy: site_wins, site: east, sites: {east: 1, west: 2}}\n")
            one = Node(conf_one, ["oneway"], "--until-caught-up")
            t1 = time.monotonic()
            if one.wait(600) != 0:
                raise SystemExit(f"the one-way pipeline failed:\n{Path(one.log.name).read_text()[-3000:]}")
            wall_one = time.monotonic() - t1
            equal_one = sysbench.checksums(sysbench.Conn.from_server(third, "sb_east"), tables) == \
                sysbench.checksums(sysbench.Conn.from_server(servers["east"], "sb_east"), tables)
            oneway[label] = (rows["east"] / wall_one, wall_one, one.rss, equal_one)
            third.cleanup()
        two = Node(conf, list(pipelines.values()), "--until-caught-up")
        t0 = time.monotonic()
        reached: dict[str, float] = {}
        while len(reached) < 2:
            if two.proc.poll() is not None and two.proc.returncode != 0:
                two.check()
            now = acks(meta, pipelines)
            for site in SITES:
                at = now[site]
                if site not in reached and at is not None and at >= end[site]:
                    reached[site] = time.monotonic() - t0
            time.sleep(0.05)
        if two.wait(300) != 0:
            raise SystemExit(f"the channel's catch-up failed:\n{Path(two.log.name).read_text()[-3000:]}")
        wall_two = time.monotonic() - t0
        equal_two = checksums(servers, {f"sb_{s}": tables for s in SITES})
        rate = {site: rows[site] / reached[site] for site in SITES}
        base = oneway["plain"][0]
        print(f"two-way (both backlogs at once, one node): east -> west {rate['east']:,.0f} rows/s "
              f"({reached['east']:.1f}s), west -> east {rate['west']:,.0f} rows/s ({reached['west']:.1f}s), "
              f"together {(rows['east'] + rows['west']) / wall_two:,.0f} rows/s ({wall_two:.1f}s with start-up); "
              f"peak RSS {two.rss:.0f} MiB; equal: {equal_two}")
        for label, (speed, wall, rss, equal) in oneway.items():
            what = "no conflicts block" if label == "plain" else "with the conflicts block"
            print(f"one-way, east's backlog alone ({what}): {speed:,.0f} rows/s ({wall:.1f}s with start-up); "
                  f"peak RSS {rss:.0f} MiB; equal: {equal}")
        print(f"detection's cost one-way: with/without conflicts block {oneway['conflicts'][0] / base:.2f}")
        together = (rows["east"] + rows["west"]) / wall_two
        print(f"ratio two-way/one-way, per direction: east -> west {rate['east'] / base:.2f}, west -> east "
              f"{rate['west'] / base:.2f}; both directions together {together / base:.2f}")
        print(f"peak RSS while following: {follow_rss:.0f} MiB; total {time.monotonic() - began:.0f}s")
        ok = ok and equal_two and all(equal for *_, equal in oneway.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
