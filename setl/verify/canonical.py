"""The canonical text of a replicated value, in Python: what a column's value becomes when
`setl verify` compares rows fetched from both ends (a row filter, or a type with no exact
server-side text on the target: floats, JSON, SET, addresses into PostgreSQL).

A value's text is the same whichever end (and driver) it comes from when the two values are the
same value: MariaDB's text-protocol value (after `setl.snapshot.reader.ChunkReader.convert`, so
in `setl.values`' forms), PyMySQL's and psycopg's target values. NULL is None, never a text, so
NULL and ``''`` differ. The server-side texts (`setl.verify.mariadb`, `setl.verify.postgresql`)
follow the same forms where they can.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import ipaddress
import json
import socket
import uuid
from collections.abc import Sequence
from typing import Any

from setl.model import InvalidDate
from setl.values import Geometry, single

INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year", "bit", "bool",
                      "boolean"})
STRINGS = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum"})
BINARIES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})


def text(kind: str, value: Any) -> str | None:
    """The canonical text of `value`, a value of a column whose source ``DATA_TYPE`` is `kind`."""
    if value is None:
        return None
    if isinstance(value, InvalidDate):
        return str(value.text)
    if isinstance(value, Geometry):
        return value.data.hex().upper()
    if kind in INTEGERS:
        if isinstance(value, (bytes, bytearray)):
            return str(int.from_bytes(value, "big"))
        return str(int(value))
    if kind == "decimal":
        return str(value)
    if kind == "float":
        return repr(single(float(value)))
    if kind == "double":
        return repr(float(value))
    if kind == "date":
        return value.isoformat() if isinstance(value, datetime.date) else str(value)
    if kind in ("datetime", "timestamp"):
        if isinstance(value, datetime.datetime):
            if value.tzinfo is not None:
                value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
            return value.strftime("%Y-%m-%d %H:%M:%S.%f")
        return str(value)
    if kind == "time":
        if isinstance(value, datetime.timedelta):
            micros = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
        elif isinstance(value, datetime.time):
            micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        else:
            return str(value)
        return str(decimal.Decimal(micros).scaleb(-6).quantize(decimal.Decimal("0.000001")))
    if kind in BINARIES:
        if isinstance(value, str):
            value = value.encode("utf-8")
        return bytes(value).hex().upper()
    if kind == "json":
        parsed = json.loads(value) if isinstance(value, (str, bytes, bytearray)) else value
        return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if kind == "set":
        members = sorted(value) if isinstance(value, (set, frozenset)) else sorted(str(value).split(",")) \
            if value != "" else []
        return ",".join(members)
    if kind == "uuid":
        return str(uuid.UUID(str(value)))
    if kind in ("inet4", "inet6"):
        address = ipaddress.ip_address(str(value).split("/")[0])
        if address.version == 6:
            return socket.inet_ntop(socket.AF_INET6, address.packed)
        return str(address)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def row_text(texts: Sequence[str | None]) -> str:
    """One row's texts as one string, each ``LENGTH:TEXT`` (``~`` for NULL): no two rows share it."""
    return "".join("~" if t is None else f"{len(t)}:{t}" for t in texts)


def row_hash(texts: Sequence[str | None]) -> str:
    return hashlib.md5(row_text(texts).encode("utf-8", "surrogateescape")).hexdigest()


def summary(hashes: Sequence[str]) -> tuple[int, int]:
    """(count, sum of the first 60 bits) of rows' md5 hex hashes: the aggregate both servers compute
    (order-free, and duplicates count)."""
    return len(hashes), sum(int(h[:15], 16) for h in hashes)
