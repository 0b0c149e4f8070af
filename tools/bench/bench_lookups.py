"""The source's questions while a pipeline runs: a connection per question against one kept open.

The node's sampler asks every source that is behind how far its log ends (`bytes_behind`, every
`refresh_every` seconds, for the lag figures), and the binlog reader asks a table's kind and engine
as it meets new tables. PyMySQL (1.2 on) builds a TLS context from the system's CA store for every
connection it opens, even without ``ssl`` (it tries TLS first), so a connection per question costs
more than the question. This script starts a throwaway MariaDB (the test harness's, no TLS) and
times `--calls` calls of each, in the same run:

* baseline: ``pymysql.connect`` + ``SHOW BINARY LOGS`` + close per call (what the source did);
* setl: `MysqlBinlogSource.bytes_behind`, on the connection the source keeps.

It prints CPU and wall milliseconds per call (medians of `--repeat` rounds) and the ratio.

    PYTHONPATH=. python3 tools/bench/bench_lookups.py [--calls 50] [--repeat 5]

Measured 2026-11-26 (2-core VM, PyMySQL 1.2.4): baseline 15.7 ms CPU per call, setl 0.04 ms
(433x less CPU; wall 15.9 against 0.06 ms). At
100 pipelines catching up, each asked every 2 s, that is 0.8 of a core saved; a source that offers
TLS adds a handshake per connection on both sides.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import time

import pymysql

from setl.model import Position
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.testing.servers import MariaDBServer


def timed(fn, calls: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of `fn`."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return 1000 * (time.process_time() - cpu) / calls, 1000 * (time.perf_counter() - wall) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"PyMySQL {importlib.metadata.version('PyMySQL')}; {args.calls} calls a round, "
          f"{args.repeat} rounds (medians)")
    with MariaDBServer(server_id=1) as server:
        file = server.query("SHOW MASTER STATUS")[0][0]
        start = Position(file, 4)
        source = MysqlBinlogSource(host="127.0.0.1", port=server.port, user="root", password="", server_id=77,
                                   pipeline="bench")

        def per_connection() -> None:
            conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", password="", autocommit=True)
            try:
                with conn.cursor() as cur:
                    cur.execute("SHOW BINARY LOGS")
                    cur.fetchall()
            finally:
                conn.close()

        try:
            results: dict[str, list[tuple[float, float]]] = {"baseline": [], "setl": []}
            for _ in range(args.repeat):
                results["baseline"].append(timed(per_connection, args.calls))
                results["setl"].append(timed(lambda: source.bytes_behind(start), args.calls))
        finally:
            source.close()
    medians = {name: (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
               for name, runs in results.items()}
    for name, (cpu, wall) in medians.items():
        label = "connection per question" if name == "baseline" else "setl bytes_behind (kept connection)"
        print(f"{label:38} {cpu:8.2f} ms CPU {wall:8.2f} ms wall per call")
    print(f"ratio baseline/setl: CPU {medians['baseline'][0] / max(medians['setl'][0], 1e-6):.0f}x, "
          f"wall {medians['baseline'][1] / medians['setl'][1]:.0f}x")


if __name__ == "__main__":
    main()
