"""A setl target that writes a change log: every row change of a batch as one JSON line, then a
commit line holding the batch's end position, in ``PATH/PIPELINE.jsonl``.

It is the example of a connector plugin: a config class, a Load, and a `TargetConnector`
declaration registered in the ``setl.targets`` entry-point group (see this package's setup.cfg).

Line formats::

    {"op": "update", "schema": "shop", "table": "orders", "key": ["id"],
     "before": {...}, "after": {...}, "position": "mysql-bin.000003:4711"}
    {"ddl": "ALTER TABLE ...", "schema": "shop", "table": "orders", "position": "..."}
    {"commit": {"log": "mysql-bin.000003", "offset": 5120, "batch": 12, "epoch": 3}}

``op`` is insert, update, delete or read (a row an initial snapshot copied: after image only,
"insert, or replace the row with the same key"). Only lines up to the last commit line count: a
crash in the middle of a batch leaves a tail that the next `open` cuts off. Values JSON cannot
hold (decimals, dates, bytes) are written as text.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from setl.connectors import BuildContext, TargetConnector
from setl.errors import LoadError
from setl.model import Batch, DdlChange, Position, RowChange
from setl.stages.load import Load, LoadCapabilities

__all__ = ["JsonlLoad", "JsonlTargetConfig", "connector", "iter_changes", "read_log", "table_rows", "table_state"]


@attrs.frozen
class JsonlTargetConfig:
    """``target: {type: jsonl, path: DIR}``: the change log goes to DIR/PIPELINE.jsonl."""

    type: Literal["jsonl"]
    path: str
    fsync: bool = True


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def _line(change: RowChange | DdlChange) -> dict[str, Any]:
    where = str(change.position) if change.position is not None else None
    if isinstance(change, DdlChange):
        return {"ddl": change.statement, "schema": change.schema, "table": change.table, "position": where}
    return {"op": change.op.value, "schema": change.schema, "table": change.table, "key": list(change.primary_key),
            "before": None if change.before is None else dict(change.before),
            "after": None if change.after is None else dict(change.after), "position": where}


def read_log(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], dict[str, Any] | None, int]:
    """The committed lines of a change log (change and commit lines), its last commit line's
    contents (None before the first), and the byte length of the committed part."""
    lines: list[dict[str, Any]] = []
    committed: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    size = 0
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return [], None, 0
    offset = 0
    for raw in data.splitlines(keepends=True):
        offset += len(raw)
        if not raw.endswith(b"\n"):
            break  # a line cut short by a crash
        record = json.loads(raw)
        lines.append(record)
        if "commit" in record:
            committed, last, size = list(lines), record["commit"], offset
    return committed, last, size


def table_state(path: str | os.PathLike[str], table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Table ``schema.table`` as the committed part of the log leaves it, by key (the log folded)."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for record in read_log(path)[0]:
        if "op" not in record or f"{record['schema']}.{record['table']}" != table:
            continue
        key = record["key"]
        if record["before"] is not None:
            state.pop(tuple(record["before"][k] for k in key), None)
        if record["after"] is not None:
            state[tuple(record["after"][k] for k in key)] = record["after"]
    return state


def table_rows(path: str | os.PathLike[str], table: str) -> list[dict[str, Any]]:
    """Every row of table ``schema.table`` as the committed part of the log leaves it, duplicates
    included (what a table without a primary key holds): an insert or read adds its after image,
    a delete removes one row equal to its before image, an update does both."""
    rows: list[dict[str, Any]] = []
    for record in read_log(path)[0]:
        if "op" not in record or f"{record['schema']}.{record['table']}" != table:
            continue
        if record["before"] is not None and record["before"] in rows:
            rows.remove(record["before"])
        if record["after"] is not None:
            rows.append(record["after"])
    return rows


class JsonlLoad(Load):
    """Appends batches to the pipeline's change log (see the module docstring).

    A batch whose end is not after the last committed one is already in and is skipped, so
    replays after a crash add nothing; a batch of an older epoch than the last committed one
    (a deposed leader) is refused.
    """

    def __init__(self, directory: str | os.PathLike[str], *, pipeline: str, fsync: bool = True) -> None:
        self.path = Path(directory) / f"{pipeline}.jsonl"
        self.pipeline = pipeline
        self.fsync = fsync
        self._file: Any = None
        self._last: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _lines, self._last, size = read_log(self.path)
        self._file = open(self.path, "ab")
        self._file.truncate(size)  # the tail of a batch that never got its commit line
        self._file.seek(0, os.SEEK_END)

    def _error(self, batch: Batch, message: str) -> LoadError:
        return LoadError(message, pipeline=self.pipeline, stage="load", batch=batch.id, position=batch.end)

    def load(self, batch: Batch) -> None:
        with self._lock:
            if self._file is None:
                self.open()
            last = self.committed()
            if last is not None and batch.end <= last:
                return
            if self._last is not None and batch.epoch < self._last["epoch"]:
                raise self._error(batch, f"epoch {batch.epoch} is older than epoch {self._last['epoch']} "
                                         f"of the log's last batch; refusing a deposed leader's batch")
            commit = {**batch.end.to_dict(), "batch": batch.id, "epoch": batch.epoch}
            size = self._file.seek(0, os.SEEK_END)
            try:
                lines = [_line(change) for change in batch.changes] + [{"commit": commit}]
                self._file.write("".join(json.dumps(line, default=_default) + "\n" for line in lines).encode())
                self._file.flush()
                if self.fsync:
                    os.fsync(self._file.fileno())
            except (OSError, TypeError, ValueError) as exc:
                self._file.truncate(size)
                self._file.seek(0, os.SEEK_END)
                raise self._error(batch, f"cannot append to {self.path}: {exc}") from exc
            self._last = commit

    def committed(self) -> Position | None:
        if self._file is None:
            self._last = read_log(self.path)[1]
        return None if self._last is None else Position.from_dict(self._last)

    def committed_epoch(self) -> int | None:
        self.committed()
        return None if self._last is None else int(self._last["epoch"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _build(config: JsonlTargetConfig, context: BuildContext) -> Load:
    return JsonlLoad(context.resolve(config.path), pipeline=context.name, fsync=config.fsync)


#: What the ``jsonl`` entry point of the ``setl.targets`` group registers.
connector = TargetConnector("jsonl", JsonlTargetConfig, _build,
                            LoadCapabilities(stores_position=True, creates_tables=True),
                            help="a JSON-lines change log, one line per row change")


def iter_changes(path: str | os.PathLike[str]) -> Iterator[Mapping[str, Any]]:
    """The committed row-change lines of a log, in order."""
    return (record for record in read_log(path)[0] if "op" in record)

