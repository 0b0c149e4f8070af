"""What handing transactions from a reader process to the node costs per row change, each side:
setl's frames (`setl.sources.mysql_binlog.process`: values as columns per shape, pickled) against
two baselines measured in the same run: pickled `RowChange` objects, and Arrow IPC (the images'
columns built, written, read back and turned into dicts; no `RowChange` built, no type mapping).

    python3 tools/bench/reader_frames.py [--transactions 2000] [--repeat 7]

Rows are sysbench ``oltp_write_only``'s (id, k, c CHAR(120), pad CHAR(60)), four changes a
transaction on four tables (an update of k, an update of c, a delete, an insert). Figures are the
best of `--repeat` in CPU time (`time.process_time`), µs per row change.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def transactions(count: int) -> list[Any]:
    from setl.model import Op, Position, RowChange, Transaction

    def row(i: int) -> dict[str, Any]:
        return {"id": i, "k": i * 7 % 10_007, "c": f"{i:011d}-" * 10, "pad": f"{i:011d}-" * 5}

    txs = []
    for t in range(count):
        at = Position("mysql-bin.000001", 1000 + 900 * t, f"0-1-{t}")
        i = 4 * t
        txs.append(Transaction((
            RowChange(Op.UPDATE, "sbtest", "sbtest1", ("id",), row(i), {**row(i), "k": i + 1}, at, 1.0),
            RowChange(Op.UPDATE, "sbtest", "sbtest2", ("id",), row(i + 1), {**row(i + 1), "c": "x" * 119}, at, 1.0),
            RowChange(Op.DELETE, "sbtest", "sbtest3", ("id",), row(i + 2), None, at, 1.0),
            RowChange(Op.INSERT, "sbtest", "sbtest4", ("id",), None, row(i + 3), at, 1.0),
        ), at, True, 900))
    return txs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import pyarrow as pa

    from setl.sources.mysql_binlog.frames import Decoder, Encoder

    txs = transactions(args.transactions)
    rows = 4 * len(txs)

    def best(f: Callable[[], Any]) -> tuple[float, Any]:
        least, result = float("inf"), None
        for _ in range(args.repeat):
            began = time.process_time()
            result = f()
            least = min(least, time.process_time() - began)
        return least / rows * 1e6, result

    frame_us, frame = best(lambda: Encoder().frame(txs))
    dump_us, data = best(lambda: pickle.dumps(frame, protocol=5))
    load_us, loaded = best(lambda: pickle.loads(data))
    decode_us, back = best(lambda: Decoder().frame(loaded))
    if back != txs:
        raise SystemExit("the frames did not decode to the transactions they were made of")
    obj_dump_us, objects = best(lambda: pickle.dumps(txs, protocol=5))
    obj_load_us, _ = best(lambda: pickle.loads(objects))

    names = ["id", "k", "c", "pad"]

    def arrow_write() -> Any:
        changes = [c for tx in txs for c in tx.changes]
        columns = {f"{side}_{n}": [None if getattr(c, side) is None else getattr(c, side)[n] for c in changes]
                   for side in ("before", "after") for n in names}
        batch = pa.RecordBatch.from_pydict(columns)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return sink.getvalue()

    arrow_child_us, buffer = best(arrow_write)

    def arrow_read() -> Any:
        batch = pa.ipc.open_stream(buffer).read_next_batch()
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        return [(dict(zip(names, r[:4])), dict(zip(names, r[4:]))) for r in zip(*columns)]

    arrow_parent_us, _ = best(arrow_read)
    print(f"{rows} row changes; µs of CPU per row change (best of {args.repeat}); frame bytes per row "
          f"{len(data) / rows:.0f}, pickled objects {len(objects) / rows:.0f}")
    print(f"{'hand-off':<44} {'reader process':>15} {'node':>8}")
    print(f"{'setl frames (columns per shape, pickled)':<44} {frame_us + dump_us:>15.2f} {load_us + decode_us:>8.2f}")
    print(f"{'pickled RowChange objects (baseline)':<44} {obj_dump_us:>15.2f} {obj_load_us:>8.2f}")
    print(f"{'Arrow IPC, no RowChange built':<44} {arrow_child_us:>15.2f} {arrow_parent_us:>8.2f}")
    print(f"setl frames by step: encode {frame_us:.2f}, pickle {dump_us:.2f} | unpickle {load_us:.2f}, "
          f"decode {decode_us:.2f}")
    print(f"node side, setl frames / pickled objects: {(load_us + decode_us) / obj_load_us:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
