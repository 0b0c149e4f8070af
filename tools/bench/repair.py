"""`setl repair` against copying the table again: the time to bring a drifted target back, through the
pipeline, by repairing the differing keys or by re-copying the whole table (`setl snapshot
--table`), in the same run.

Starts a MariaDB source and target (setl.testing.servers), prepares one sysbench table of
`--table-size` rows, copies it with ``setl start --until-caught-up`` (``start: snapshot``), and then,
in `--repeat` rounds, drifts the target (one row in every `--differ-every` changed, as many deleted,
and as many extra rows), finds the drift with `setl verify --json` (not timed), and times:

* ``repair``: ``setl repair --from-report`` (pipeline stopped: the requests are queued) and the
  ``setl start --until-caught-up`` that serves them;
* ``re-copy``: ``setl snapshot --table`` and the ``setl start --until-caught-up`` that copies it.

Each ends with `setl verify` finding the table equal. Prints both times and their ratio (medians).

    python3 tools/bench/repair.py [--table-size 200000] [--differ-every 1000] [--repeat 3]

Measured (defaults: 200,000 rows, 600 keys differing: 200 changed, 200 deleted, 200 extra; 2 cores
shared with other work, load average 4 to 6): repair 1.1 s (rounds 1.1, 1.1, 1.2), re-copy 3.4 s
(3.1, 3.7, 3.4), repair/re-copy 0.34x; both include the start-up of `setl start` (most of the
repair's time), and a re-copy grows with the table while a repair grows with the keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.testing.servers import MariaDBServer  # noqa: E402
from tools import sysbench  # noqa: E402


def setl(conf: Path, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), *args], capture_output=True,
                          text=True, timeout=3600)
    if done.returncode not in ok:
        raise SystemExit(f"setl {' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-3000:]}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-size", type=int, default=200_000)
    parser.add_argument("--differ-every", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="setl-bench-repair-") as tmp, MariaDBServer() as source, \
            MariaDBServer() as target:
        work = Path(tmp)
        print(f"preparing 1 x {args.table_size} sysbench rows ...", flush=True)
        sysbench.prepare(sysbench.Conn.from_server(source, "sb"), tables=1, table_size=args.table_size,
                         ddl_in_binlog=False)
        conf = work / "conf"
        (conf / "pipelines").mkdir(parents=True)
        (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(work / "meta.db")}}))
        (conf / "pipelines" / "bench.yaml").write_text(yaml.safe_dump({
            "source": {"type": "mysql", "host": source.host, "port": source.port, "user": source.user,
                       "server_id": 3901, "start": "snapshot", "snapshot": {"chunk_rows": 10_000}},
            "target": {"type": "mysql", "host": target.host, "port": target.port, "user": target.user},
            "tables": [{"source": r"sb\..*", "target": "copied.{table}"}],
            "pipeline": {"parallelism": 4, "batch": {"max_rows": 10_000, "max_wait_ms": 100}},
        }, sort_keys=False))
        print("copying with setl start --until-caught-up ...", flush=True)
        setl(conf, "start", "--pipeline", "bench", "--until-caught-up")
        conn: Any = target.connect(database="copied")
        every = args.differ_every

        def drift() -> int:
            with conn.cursor() as cur:
                changed = cur.execute(f"UPDATE sbtest1 SET k = k + 1 WHERE id % {every} = 1")
                deleted = cur.execute(f"DELETE FROM sbtest1 WHERE id % {every} = 2")
                extra = cur.execute(f"INSERT INTO sbtest1 (id, k, c, pad) SELECT id + 100000000, k, c, pad "
                                    f"FROM sbtest1 WHERE id % {every} = 3")
            return changed + deleted + extra

        def timed(*steps: tuple[str, ...]) -> float:
            began = time.perf_counter()
            for step in steps:
                setl(conf, *step, ok=(0, 1) if step[0] == "repair" else (0,))
            seconds = time.perf_counter() - began
            report = json.loads(setl(conf, "verify", "--pipeline", "bench", "--json").stdout)
            assert report["equal"], report
            return seconds

        start = ("start", "--pipeline", "bench", "--until-caught-up")
        repairs, copies = [], []
        for round_ in range(1, args.repeat + 1):
            keys = drift()
            report = work / "report.json"
            report.write_text(setl(conf, "verify", "--pipeline", "bench", "--json", ok=(1,)).stdout)
            repairs.append(timed(("repair", "--pipeline", "bench", "--from-report", str(report)), start))
            drift()
            copies.append(timed(("snapshot", "--pipeline", "bench", "--table", "sb.sbtest1"), start))
            print(f"round {round_}: {keys} keys differing in {args.table_size:,} rows: repair {repairs[-1]:.1f}s, "
                  f"re-copy {copies[-1]:.1f}s ({repairs[-1] / copies[-1]:.2f}x)", flush=True)
        repair, copy = statistics.median(repairs), statistics.median(copies)
        print(f"medians of {args.repeat}: repair {repair:.1f}s, re-copy {copy:.1f}s, repair/re-copy "
              f"{statistics.median(r / c for r, c in zip(repairs, copies)):.2f}x (each includes a setl start's "
              "start-up)")
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
