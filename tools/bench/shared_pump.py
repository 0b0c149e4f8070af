"""The shared binlog reader's hand-on alone (`SharedReader._hand_on`): CPU per transaction.

No server: K subscriptions of one table each take bulks of `--bulk` one-table transactions of two
rows each (the pump's `PUMP_BULK`), spread round-robin over the K tables, as a sysbench catch-up
hands them on; nobody takes them, so the buffers are as large as the run. Prints the best of
`--repeat` runs in process CPU microseconds per transaction, for the setl of this checkout and of
each `--compare-tree DIR` (old against new in the same run)::

    python3 tools/bench/shared_pump.py --compare-tree /work/main
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RUN = """
import sys, time
sys.path.insert(0, sys.argv[1])
from setl.model import Position, Transaction
from setl.sources import shared_binlog
from setl.testing.harness import insert

pipelines, count, bulk, repeat = (int(a) for a in sys.argv[2:6])
log = "mysql-bin.000001"
txs = [Transaction((insert(f"t{n % pipelines}", {"id": n}), insert(f"t{n % pipelines}", {"id": n + 1})),
                   Position(log, 100 * n + 199), True, 10) for n in range(count)]


class Source:  # the reader's stream is never opened: `_hand_on` only
    host, port = "bench", 0


reader = shared_binlog.SharedReader("bench", Source(), Position(log, 4))
best = None
for _ in range(repeat):
    subs = tuple(shared_binlog._Subscription(f"p{k}", Position(log, 4), 10**9,
                                             (lambda k: lambda schema, table: table == f"t{k}")(k))
                 for k in range(pipelines))
    started = time.process_time()
    for i in range(0, count, bulk):
        reader._hand_on(txs[i:i + bulk], subs)
    spent = time.process_time() - started
    best = spent if best is None else min(best, spent)
    assert sum(sub.queued_rows() for sub in subs) == 2 * count
print(f"{best / count * 1e6:.2f}")
"""


def measure(tree: Path, args: argparse.Namespace) -> float:
    out = subprocess.run([sys.executable, "-c", _RUN, str(tree), str(args.pipelines), str(args.transactions),
                          str(args.bulk), str(args.repeat)], check=True, capture_output=True, text=True, cwd=tree)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=8)
    parser.add_argument("--transactions", type=int, default=25_600)
    parser.add_argument("--bulk", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compare-tree", action="append", default=[], metavar="DIR",
                        help="also measure the setl of checkout DIR (repeatable)")
    args = parser.parse_args()
    trees = [ROOT, *(Path(tree).resolve() for tree in args.compare_tree)]
    print(f"{args.pipelines} pipelines of one table each, {args.transactions} transactions in bulks of {args.bulk}, "
          f"best of {args.repeat}")
    for tree in trees:
        print(f"{tree}: {measure(tree, args):.2f} us per transaction")


if __name__ == "__main__":
    main()
