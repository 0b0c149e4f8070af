"""The source alone, reader thread or reader process, of one or more checkouts on one backlog: what
bounds `sources.reader_process` without the target's load, old code against new in the same rounds.

    python3 tools/bench/reader_ab.py [--seconds 10] [--rounds 4] [--profile DIR] TREE:MODE [TREE:MODE ...]

MODE is ``process`` or ``thread``; TREE is a built checkout (``build_ext --inplace``). One MariaDB
source and one sysbench ``oltp_write_only`` backlog; each round runs every variant once
(`catchup.py --child source`, the order reversed every other round); rows/s end to end and within
the open, the CPU µs a row of the whole run and of the reader process, the load average. With
``--profile DIR`` each run is sampled by py-spy, every thread of both processes, waiting included
(``--idle --subprocesses``), as DIR/MODE-ROUND.txt (collapsed stacks); its CPU figures then count
py-spy's own, and "reader process" is py-spy's child, not the reader's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="sysbench backlog duration")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("variants", nargs="+", metavar="TREE:MODE")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tools"))
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    import catchup
    import sysbench

    from setl.testing.servers import MariaDBServer

    for variant in args.variants:
        if variant.rpartition(":")[2] not in ("process", "thread"):
            parser.error(f"{variant}: MODE is process or thread")
    with tempfile.TemporaryDirectory(prefix="setl-reader-ab-") as tmp, \
            MariaDBServer(Path(tmp) / "source", server_id=1) as source:
        sysbench.prepare(sysbench.Conn.from_server(source), tables=4, table_size=10_000)
        start = catchup.head(source)
        sysbench.run(sysbench.Conn.from_server(source), seconds=args.seconds, threads=4, tables=4, table_size=10_000)
        end = catchup.head(source)
        span = ["--port", str(source.port), "--start-file", start[0], "--start-pos", str(start[1]),
                "--end-file", end[0], "--end-pos", str(end[1])]
        results: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in args.variants}
        server_id = 5000
        for n in range(args.rounds):
            for variant in args.variants if n % 2 == 0 else args.variants[::-1]:
                tree, _, mode = variant.rpartition(":")
                server_id += 1
                argv_ = [sys.executable, str(Path(tree) / "tools/bench/catchup.py"), "--child", "source", *span,
                         "--server-id", str(server_id), "--root", tree]
                argv_ += ["--child-reader-process"] if mode == "process" else []
                if args.profile:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    argv_ = ["py-spy", "record", "--idle", "--threads", "--subprocesses", "-r", "200", "-f", "raw",
                             "-o", str(args.profile / f"{mode}-{n}.txt"), "--", *argv_]
                out, wall, _, _ = catchup.run_child(argv_, cwd=Path(tree))
                assert out is not None
                rows = out["rows"]
                child = sum(cpu for cpu, _ in catchup.LAST_GRANDCHILDREN.values())
                results[variant].append((rows / wall, rows / out["seconds"], catchup.LAST_CHILD_CPU[0] / rows * 1e6,
                                         child / rows * 1e6))
                print(f"{variant}: {rows} rows, {rows / wall:,.0f}/s end to end, {rows / out['seconds']:,.0f}/s in "
                      f"the open, CPU µs a row {catchup.LAST_CHILD_CPU[0] / rows * 1e6:.1f} (reader process "
                      f"{child / rows * 1e6:.1f}), load {os.getloadavg()[0]:.1f}", flush=True)
        for variant, runs in results.items():
            med = [statistics.median(r[i] for r in runs) for i in range(4)]
            print(f"median {variant}: {med[0]:,.0f}/s end to end, {med[1]:,.0f}/s in the open, CPU µs a row "
                  f"{med[2]:.1f} (reader process {med[3]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
