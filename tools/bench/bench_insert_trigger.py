"""What the losing site's insert trigger of an exact site-wins settlement would cost its users' inserts
(issue 36, docs/conflicts.md "Settling it exactly"): one indexed lookup, and a delete where found, of
the key's tombstone in ``setl.setl_tombstones``, in every user's insert on a site-wins table.

Starts one MariaDB (setl.testing.servers), fills ``setl_tombstones`` with `--tombstones` tombstones
of other keys, and inserts `--rows` rows into a fresh table three ways in each of `--rounds` rounds:
no trigger (the baseline, same run), an empty trigger (the cost of firing one), and the lookup
trigger; multi-row statements of 1,000 rows, then a quarter as many single-row autocommit inserts.
Prints rows/s and the ratio to the baseline. The machine is shared: read the medians.

    python3 tools/bench/bench_insert_trigger.py [--rows 20000] [--tombstones 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.sinks.conflicts import TOMBSTONES_DDL  # noqa: E402
from setl.testing.servers import MariaDBServer  # noqa: E402

LOOKUP = ("CREATE TRIGGER shop.ins AFTER INSERT ON shop.t FOR EACH ROW BEGIN IF @setl_origin IS NULL THEN "
          "DELETE FROM setl.setl_tombstones WHERE key_md5 = CONVERT(MD5(CONCAT('shop.t', ' ', JSON_ARRAY(NEW.id))) "
          "USING ascii) AND site = 'a'; END IF; END")
EMPTY = ("CREATE TRIGGER shop.ins AFTER INSERT ON shop.t FOR EACH ROW BEGIN IF @setl_origin IS NULL THEN "
         "SET @seen = 1; END IF; END")


def insert(cur: Any, trigger: str | None, rows: int, multi: bool) -> float:
    """Rows/s of `rows` inserts (multi-row statements of 1,000, or a quarter as many single-row ones)."""
    cur.execute("DROP TABLE IF EXISTS shop.t")
    cur.execute("CREATE TABLE shop.t (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
    if trigger:
        cur.execute(trigger)
    values = [(i, f"value {i}", i % 97) for i in range(rows if multi else rows // 4)]
    started = time.perf_counter()
    if multi:
        for start in range(0, len(values), 1000):
            cur.executemany("INSERT INTO shop.t VALUES (%s, %s, %s)", values[start:start + 1000])
    else:
        for row in values:
            cur.execute("INSERT INTO shop.t VALUES (%s, %s, %s)", row)
    return len(values) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--tombstones", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = MariaDBServer(server_id=7).start()
    try:
        conn = server.connect(autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE setl")
            cur.execute("CREATE DATABASE shop")
            cur.execute(TOMBSTONES_DDL.format(table="setl.setl_tombstones"))
            cur.execute("USE setl")
            cur.execute("INSERT INTO setl.setl_tombstones (key_md5, table_name, row_key, stamp, site) SELECT "
                        "MD5(CONCAT('shop.t', ' ', JSON_ARRAY(seq))), 'shop.t', JSON_ARRAY(seq), NULL, 'a' FROM "
                        f"seq_1000000_to_{1000000 + args.tombstones - 1}")
            for multi in (True, False):
                figures: dict[str, list[float]] = {"none": [], "empty": [], "lookup": []}
                for _ in range(args.rounds):
                    for name, trigger in (("none", None), ("empty", EMPTY), ("lookup", LOOKUP)):
                        figures[name].append(insert(cur, trigger, args.rows, multi))
                base = statistics.median(figures["none"])
                kind = "multi-row (1,000 a statement)" if multi else "single-row autocommit"
                print(f"{kind}: no trigger {base:,.0f} rows/s; " + "; ".join(
                    f"{name} trigger {statistics.median(figures[name]):,.0f} rows/s "
                    f"({statistics.median(figures[name]) / base:.2f}x)" for name in ("empty", "lookup")))
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
