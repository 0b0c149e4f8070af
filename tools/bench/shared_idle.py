"""K pipelines on the shared reader at the log's end: the node's CPU while the source is nearly idle.

Starts a MariaDB source and target (setl.testing.servers) with K sysbench tables, then, for this
checkout and each `--compare-tree DIR` in turn (alternating order per repeat), runs ``setl start``
(no ``--until-caught-up``) of K pipelines of one table each on ``sources.shared_reader_server_id``
from the log's end, with one one-row UPDATE a second on the source (round-robin over the tables),
and counts the node's CPU seconds (user + system, /proc) over `--seconds` after `--warm` seconds::

    python3 tools/bench/shared_idle.py --pipelines 8 --seconds 20 --repeat 2 --compare-tree /work/main
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "bench"))

import catchup  # noqa: E402 - tools/bench
import sysbench  # noqa: E402 - tools


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the CPU is counted")
    parser.add_argument("--warm", type=float, default=8.0, help="seconds after the start not counted")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--compare-tree", action="append", default=[], metavar="DIR",
                        help="also run the setl of checkout DIR (repeatable)")
    args = parser.parse_args()
    from setl.testing.servers import MariaDBServer

    trees = {"this checkout": ROOT, **{str(Path(t).resolve()): Path(t).resolve() for t in args.compare_tree}}
    k = args.pipelines
    spent: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="setl-idle-") as tmp, \
            MariaDBServer(Path(tmp) / "source", server_id=1) as source, \
            MariaDBServer(Path(tmp) / "target", server_id=2) as target:
        sysbench.prepare(sysbench.Conn.from_server(source), tables=k, table_size=1000)
        sysbench.create_tables(sysbench.Conn.from_server(target), tables=k)
        writes = 0

        def trickle(seconds: float) -> None:
            nonlocal writes
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                source.query(f"UPDATE sbtest.sbtest{writes % k + 1} SET k = k + 1 WHERE id = 1")
                writes += 1
                time.sleep(1.0)

        for n in range(args.repeat):
            order = list(trees) if n % 2 == 0 else list(reversed(trees))
            for m, label in enumerate(order):
                start = catchup.head(source)
                folder = Path(tmp) / f"run{n}-{m}"
                conf = None
                for i in range(k):
                    conf = catchup.write_conf(folder, f"p{i}", source, target, start, max_wait_ms=100,
                                              tables=(rf"sbtest\.sbtest{i + 1}$",), shared=4999)
                assert conf is not None
                names = [a for i in range(k) for a in ("--pipeline", f"p{i}")]
                proc = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", *names],
                                        cwd=trees[label], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    trickle(args.warm)
                    before = catchup.process_cpu(proc.pid)
                    trickle(args.seconds)
                    cpu = catchup.process_cpu(proc.pid) - before
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
                spent.setdefault(label, []).append(cpu)
                print(f"repeat {n + 1}: {label}: {cpu:.2f} CPU s over {args.seconds:.0f} s ({k} pipelines on the "
                      f"shared reader, one transaction a second); load average {os.getloadavg()[0]:.1f}", flush=True)
    for label, values in spent.items():
        print(f"{label}: mean {sum(values) / len(values):.2f} CPU s ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
