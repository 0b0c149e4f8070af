"""Table copies (snapshots) as data every floor shares: a table's copy progress as the meta store
keeps it (`TableProgress`, with the encoding of its last key) and a source's ``source.snapshot``
settings (`SnapshotSettings`).

It sits on the model floor, beside `setl.model`: the meta stores (which persist progress, with an
ack), the MySQL source (whose config holds the settings) and `setl.snapshot` (which copies tables)
all read it, so none of the lower ones imports the `setl.snapshot` package.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import enum
import json
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from setl.model import TableName


@attrs.frozen
class SnapshotSettings:
    """How tables are copied (``source.start: snapshot``, ``setl snapshot``)."""

    chunk_rows: int = 0  # rows per chunk (split on the primary key by the server); 0: pipeline.batch.max_rows
    readers: int = 0  # chunks read at once; 0: the pipeline's parallelism
    max_chunks: int = 0  # chunks read and not yet handed on, at most; 0: twice the readers
    progress_every: float = 5.0  # seconds between progress log lines when not on a terminal
    #: where chunks are read: python (reader threads of setl) or spark (Spark tasks, on spark.master)
    engine: Literal["python", "spark"] = "python"


class CopyStatus(str, enum.Enum):
    """Where a table's copy is. PENDING: its TRUNCATE is not acked yet (a resume emits it again);
    COPYING: chunks up to `last_key` are acked; DONE: every chunk is acked."""

    PENDING = "pending"
    COPYING = "copying"
    DONE = "done"


@attrs.frozen
class TableProgress:
    """One source table's copy within a pipeline's snapshot.

    `last_key` is the primary key (in key column order) of the last row of the last acked chunk,
    in a contiguous run from the table's start; None before the first. `key` names the key columns
    the copy splits on (None when not known): a resume whose table has another key by then starts the
    copy again instead of reading after a key of another shape. `rows` counts the rows of
    acked chunks, `estimate` is the server's ``TABLE_ROWS`` when the copy began. Times are seconds
    since the epoch.
    """

    schema: str
    table: str
    status: CopyStatus = CopyStatus.PENDING
    last_key: tuple[Any, ...] | None = None
    rows: int = 0
    estimate: int = 0
    chunks: int = 0
    started: float = 0.0
    updated: float = 0.0
    key: tuple[str, ...] | None = None

    @property
    def name(self) -> TableName:
        return TableName(self.schema, self.table)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "table": self.table, "status": self.status.value,
                "last_key": encode_key(self.last_key), "rows": self.rows, "estimate": self.estimate,
                "chunks": self.chunks, "started": self.started, "updated": self.updated,
                "key": None if self.key is None else list(self.key)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TableProgress":
        return cls(str(data["schema"]), str(data["table"]), CopyStatus(data["status"]),
                   decode_key(data.get("last_key")), int(data.get("rows") or 0), int(data.get("estimate") or 0),
                   int(data.get("chunks") or 0), float(data.get("started") or 0.0),
                   float(data.get("updated") or 0.0),
                   None if data.get("key") is None else tuple(str(c) for c in data["key"]))


def _tag(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        return {"d": str(value)}
    if isinstance(value, datetime.datetime):
        return {"dt": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"da": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {"td": value.total_seconds()}
    if isinstance(value, datetime.time):
        return {"t": value.isoformat()}
    raise TypeError(f"a primary-key value of type {type(value).__name__} cannot be stored as snapshot progress")


def _untag(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    (kind, text), = value.items()
    return {"b": lambda: base64.b64decode(text), "d": lambda: decimal.Decimal(text),
            "dt": lambda: datetime.datetime.fromisoformat(text), "da": lambda: datetime.date.fromisoformat(text),
            "td": lambda: datetime.timedelta(seconds=text), "t": lambda: datetime.time.fromisoformat(text)}[kind]()


def encode_key(key: tuple[Any, ...] | None) -> str | None:
    """A key as JSON text, its values tagged so that they come back with their Python types."""
    return None if key is None else json.dumps([_tag(v) for v in key])


def decode_key(text: str | None) -> tuple[Any, ...] | None:
    return None if text is None else tuple(_untag(v) for v in json.loads(text))
