"""Write the demo change stream for pipeline p1, or check p1's SQLite target against it.

    python tools/demo.py [--transactions N] [--out var/demo/p1.jsonl]
    python tools/demo.py --verify [--target var/demo/p1-target.db]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
from pathlib import Path

from setl.sources.file import FileSource, encode_transaction
from setl.testing.harness import delete, insert, reference_state, update

ROOT = Path(__file__).resolve().parent.parent


def generate(transactions: int, seed: int = 7) -> list[list]:
    """A stream of orders and customers: inserts, updates, deletes, a few key changes."""
    rng = random.Random(seed)
    customers: dict[int, dict] = {}
    orders: dict[int, dict] = {}
    stream = []
    next_order = 1
    for n in range(transactions):
        tx = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.15 or not customers:
                cid = rng.randint(1, 500)
                row = {"id": cid, "name": f"customer {cid}", "country": rng.choice(["DE", "FR", "JP", "BR"])}
                tx.append(update("customers", customers[cid], row) if cid in customers else insert("customers", row))
                customers[cid] = row
            elif roll < 0.6 or not orders:
                row = {"id": next_order, "customer_id": rng.choice(list(customers)),
                       "amount": round(rng.uniform(1, 500), 2), "status": "new"}
                orders[next_order] = row
                next_order += 1
                tx.append(insert("orders", row))
            elif roll < 0.9:
                oid = rng.choice(list(orders))
                row = dict(orders[oid], status=rng.choice(["paid", "shipped", "returned"]))
                tx.append(update("orders", orders[oid], row))
                orders[oid] = row
            else:
                oid = rng.choice(list(orders))
                tx.append(delete("orders", orders.pop(oid)))
            if rng.random() < 0.05:
                tx.append(insert("audit_log", {"id": n * 10 + len(tx), "note": "not replicated"}))
        stream.append(tx)
    return stream


def verify(stream_path: Path, target: Path) -> int:
    source = FileSource(stream_path, follow=False)
    source.open(None)
    txs = []
    while (tx := source.poll(0)) is not None:
        txs.append(tx)
    expected = {k: v for k, v in reference_state(txs).items() if not k.startswith("demo.audit_")}
    db = sqlite3.connect(target)
    problems = 0
    for table, rows in expected.items():
        cursor = db.execute(f'SELECT * FROM "{table}"')
        names = [d[0] for d in cursor.description]
        actual = {(r[0],): dict(zip(names, r)) for r in cursor}
        if actual != rows:
            problems += 1
            print(f"{table}: target has {len(actual)} rows, expected {len(rows)}; they differ")
        else:
            print(f"{table}: {len(rows)} rows, equal to the stream")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=ROOT / "var/demo/p1.jsonl")
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--target", type=Path, default=ROOT / "var/demo/p1-target.db")
    args = parser.parse_args()
    if args.verify:
        return verify(args.out, args.target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as out:
        for tx in generate(args.transactions):
            out.write(encode_transaction(tx))
    print(f"wrote {args.transactions} transactions to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
