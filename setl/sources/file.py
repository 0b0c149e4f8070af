"""A JSON-lines file of transactions as a source: the bundled demo and the process-level tests.

Each line is one transaction::

    {"changes": [{"op": "insert", "schema": "demo", "table": "orders", "key": ["id"],
                  "after": {"id": 1, "amount": 5}}]}

`op` is insert, update, delete or read (a snapshot row: `after` only, applied
as "insert, or replace the row with the same key"); updates carry `before` and
`after`, deletes `before`. A change ``{"ddl": "ALTER TABLE ...", "schema": ..., "table": ...}``
is a DDL. A transaction's position is ``Position(file name, byte offset after
its line)``. With `follow`, lines appended later are read as they arrive; a
line without its newline yet is left for the next poll.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, BinaryIO, Literal

import attrs

from setl.errors import SourceError
from setl.model import Change, DdlChange, Op, Position, RowChange, Transaction
from setl.stages.select import Select


@attrs.frozen
class FileSourceConfig:
    """A JSON-lines file of transactions (the demo and test source)."""

    type: Literal["file"]
    path: str  # the JSON-lines file (relative to the conf directory)
    start: str = "earliest"  # earliest (the first line) or latest (the end of the file), without a position
    follow: bool = True  # wait for lines appended to the file (tail -f) instead of ending at its end


def encode_transaction(changes: list[Change]) -> str:
    """One JSON line (with its newline) for `changes`, as `FileSource` reads it."""
    items: list[dict[str, Any]] = []
    for change in changes:
        if isinstance(change, DdlChange):
            items.append({"ddl": change.statement, "schema": change.schema, "table": change.table})
            continue
        item: dict[str, Any] = {
            "op": change.op.value, "schema": change.schema, "table": change.table,
            "key": list(change.primary_key),
        }
        if change.before is not None:
            item["before"] = dict(change.before)
        if change.after is not None:
            item["after"] = dict(change.after)
        items.append(item)
    return json.dumps({"changes": items}, separators=(",", ":")) + "\n"


class FileSource(Select):
    """Reads transactions from a JSON-lines file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, *, start: str = "earliest", follow: bool = True,
                 pipeline: str = "") -> None:
        self.path = Path(path)
        self.log = self.path.name
        self.start = start
        self.follow = follow
        self.pipeline = pipeline
        self._file: BinaryIO | None = None
        self._offset = 0

    def _error(self, message: str, offset: int) -> SourceError:
        return SourceError(message, pipeline=self.pipeline, stage="select",
                           position=Position(self.log, offset))

    def open(self, start: Position | None) -> None:
        try:
            file = open(self.path, "rb")
        except OSError as exc:
            raise self._error(f"cannot open {self.path}: {exc.strerror}", 0) from exc
        self._file = file
        if start is not None:
            if start.log != self.log:
                raise self._error(f"position {start} belongs to another log than {self.log}", start.offset)
            size = os.fstat(file.fileno()).st_size
            if start.offset > size:
                raise self._error(f"position {start} is past the end of {self.path} ({size} bytes)",
                                  start.offset)
            self._offset = start.offset
        elif self.start == "latest":
            self._offset = self._complete_end()
        else:
            self._offset = 0
        file.seek(self._offset)

    def _complete_end(self) -> int:
        """The offset after the last complete line. It never moves the reader's file position:
        the node's sampler asks for the `head` from its own thread while Select polls, and a seek
        between Select's seek and readline would make it read from the wrong offset."""
        assert self._file is not None
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        if os.pread(fd, 1, size - 1) == b"\n":
            return size
        data = self.path.read_bytes()[:size]
        return data.rfind(b"\n") + 1

    def poll(self, timeout: float) -> Transaction | None:
        assert self._file is not None, "poll() before open()"
        deadline = time.monotonic() + timeout
        while True:
            self._file.seek(self._offset)
            line = self._file.readline()
            if line.endswith(b"\n"):
                offset = self._offset
                self._offset += len(line)
                return self._decode(line, offset, self._offset)
            if not self.follow or time.monotonic() >= deadline:
                if not self.follow and time.monotonic() < deadline:
                    time.sleep(min(0.01, timeout))
                return None
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))

    def _decode(self, line: bytes, offset: int, end: int) -> Transaction:
        position = Position(self.log, end)
        try:
            record = json.loads(line)
            changes = tuple(self._change(item, position) for item in record["changes"])
        except (ValueError, KeyError, TypeError) as exc:
            raise self._error(f"bad transaction line at byte {offset}: {exc}", offset) from exc
        return Transaction(changes, position, nbytes=len(line))

    @staticmethod
    def _change(item: dict[str, Any], position: Position) -> Change:
        if "ddl" in item:
            return DdlChange(item["schema"], item.get("table"), item["ddl"], position)
        op = Op(item["op"])
        before, after = item.get("before"), item.get("after")
        if ((op is Op.INSERT and after is None) or (op is Op.DELETE and before is None)
                or (op is Op.UPDATE and (before is None or after is None)) or (op is Op.READ and after is None)):
            raise ValueError(f"{op.value} change without the images it needs")
        if op is Op.READ and before is not None:
            raise ValueError("read change with a before image (a snapshot read has its after image only)")
        return RowChange(op, item["schema"], item["table"], tuple(item.get("key") or ()),
                         before, after, position)

    def tell(self) -> Position:
        return Position(self.log, self._offset)

    def head(self) -> Position:
        if self._file is None:
            raise RuntimeError("head() before open()")
        return Position(self.log, self._complete_end())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
