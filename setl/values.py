"""One value per stored value: the form setl hands on for MariaDB types whose value arrives in two
shapes, as the binlog's row image and as a snapshot's (text protocol) read.

A snapshot row and a later binlog change of the same row are merged by key (`setl.sinks.merge`),
so they must carry equal keys: a row copied with key ``'6ccd…'`` and deleted with key
``b'l\\xcd…'`` would be two keys, and the copied row would come back. Both readers therefore
bring these values to one form here:

- ``UUID``: the server's text, ``8-4-4-4-12`` lower-case hex (the binlog carries the 16 bytes in
  text order).
- ``INET6``: the text `socket.inet_ntop` gives for its 16 bytes (``::ffff:1.2.3.4``,
  ``2001:db8::1``); a snapshot's text is parsed and written again the same way, so the two agree
  whatever the server's own spelling of an address.
- ``INET4``: the dotted quad.
- ``FLOAT``: the single-precision value as a Python float (the binlog's 4 bytes widened;
  a snapshot reads the shortest decimal, ``1.1``, and is brought to ``1.100000023841858``).
- Spatial types (``GEOMETRY``, ``POINT``, ``LINESTRING``, ``POLYGON``, their ``MULTI`` forms and
  ``GEOMETRYCOLLECTION``): a `Geometry` holding the server's own bytes (the SRID, 4 bytes
  little-endian, then the WKB), which both readers get alike. Being its own type, it tells every
  sink that the value is spatial: MariaDB writes the bytes back, PostgreSQL writes PostGIS
  geometry (EWKB), WKB or WKT, Parquet WKB.

This module imports nothing from setl: sources, the snapshot and sinks all read it.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Callable
from typing import Any

import attrs

#: information_schema ``DATA_TYPE``s whose binlog value (bytes) is handed on as text.
TEXT_TYPES = frozenset({"uuid", "inet6", "inet4"})


def uuid_from_binlog(value: Any) -> Any:
    if isinstance(value, bytes) and len(value) == 16:
        return str(uuid.UUID(bytes=value))
    return value


def inet6_from_binlog(value: Any) -> Any:
    if isinstance(value, bytes) and len(value) == 16:
        return socket.inet_ntop(socket.AF_INET6, value)
    return value


def inet4_from_binlog(value: Any) -> Any:
    if isinstance(value, bytes) and len(value) == 4:
        return socket.inet_ntoa(value)
    return value


def uuid_from_text(value: Any) -> Any:
    return str(uuid.UUID(value)) if isinstance(value, str) else value


def inet6_from_text(value: Any) -> Any:
    if isinstance(value, str):
        return socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, value))
    return value


def inet4_from_text(value: Any) -> Any:
    return value


_SINGLE = struct.Struct("<f")


def single(value: Any) -> Any:
    """A FLOAT read as text (its shortest decimal) as the binlog's single-precision value."""
    if isinstance(value, float):
        return _SINGLE.unpack(_SINGLE.pack(value))[0]
    return value


#: information_schema ``DATA_TYPE``s of the spatial types, held as `Geometry`.
SPATIAL_TYPES = frozenset({"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                           "multipolygon", "geometrycollection"})

_UINT32 = {1: struct.Struct("<I"), 0: struct.Struct(">I")}
_XY = {1: struct.Struct("<dd"), 0: struct.Struct(">dd")}
_EWKB_SRID_FLAG = 0x20000000
#: WKB geometry type codes (OGC simple features, 2D) -> WKT names.
_WKT_NAMES = {1: "POINT", 2: "LINESTRING", 3: "POLYGON", 4: "MULTIPOINT", 5: "MULTILINESTRING",
              6: "MULTIPOLYGON", 7: "GEOMETRYCOLLECTION"}


@attrs.frozen
class Geometry:
    """A spatial value as MariaDB and MySQL store it: `data` is the SRID (4 bytes, little-endian)
    followed by the geometry's WKB. Equal and hashed by those bytes, so it may be (part of) a key.

    Both the binlog's row image and a snapshot's read carry exactly these bytes; `wkb`, `ewkb` and
    `wkt` are the forms other systems take.
    """

    data: bytes

    @property
    def srid(self) -> int:
        return int(_UINT32[1].unpack_from(self.data, 0)[0])

    @property
    def wkb(self) -> bytes:
        """The OGC well-known binary, without the SRID."""
        return self.data[4:]

    @property
    def ewkb(self) -> bytes:
        """PostGIS's extended WKB: the WKB with the SRID inside (a plain WKB when the SRID is 0)."""
        srid = self.srid
        wkb = self.data[4:]
        if not srid or len(wkb) < 5:
            return wkb
        uint32 = _UINT32[wkb[0]]
        kind = uint32.unpack_from(wkb, 1)[0]
        return wkb[:1] + uint32.pack(kind | _EWKB_SRID_FLAG) + uint32.pack(srid) + wkb[5:]

    @property
    def wkt(self) -> str:
        """The OGC well-known text, each coordinate as Python's shortest exact text for its double
        (``1.5``, ``0.1``; integral values without ``.0``): parsing it gives the same doubles."""
        return _wkt(self.data, 4)[0]

    def __str__(self) -> str:
        return self.wkt


def _number(value: float) -> str:
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _wkt(data: bytes, at: int) -> tuple[str, int]:
    """The WKT of the WKB geometry at `data[at:]`, and where that geometry ends."""
    name, body, at = _wkt_parts(data, at)
    return (f"{name}({body})" if body is not None else f"{name} EMPTY"), at


def _wkt_parts(data: bytes, at: int) -> tuple[str, str | None, int]:
    """The type name and the text inside the parentheses (None: EMPTY) of the WKB geometry at
    `data[at:]`, and where it ends."""
    order = data[at]
    uint32, xy = _UINT32[order], _XY[order]
    kind = uint32.unpack_from(data, at + 1)[0]
    name = _WKT_NAMES.get(kind)
    if name is None:
        raise ValueError(f"WKB geometry type {kind} is not one of the OGC 2D types")
    at += 5
    if kind == 1:
        x, y = xy.unpack_from(data, at)
        return name, f"{_number(x)} {_number(y)}", at + 16
    count = uint32.unpack_from(data, at)[0]
    at += 4
    parts = []
    for _ in range(count):
        if kind == 2:  # a LINESTRING's points
            x, y = xy.unpack_from(data, at)
            parts.append(f"{_number(x)} {_number(y)}")
            at += 16
        elif kind == 3:  # a POLYGON's rings: each a count and its points
            points = uint32.unpack_from(data, at)[0]
            at += 4
            coords = struct.unpack_from(("<" if order else ">") + "d" * 2 * points, data, at)
            at += 16 * points
            parts.append("(" + ",".join(f"{_number(coords[i])} {_number(coords[i + 1])}"
                                        for i in range(0, len(coords), 2)) + ")")
        elif kind == 7:  # a GEOMETRYCOLLECTION's members, each tagged
            part, at = _wkt(data, at)
            parts.append(part)
        else:  # MULTIPOINT (1 1,2 2), MULTILINESTRING and MULTIPOLYGON ((...),(...)): untagged members
            _, body, at = _wkt_parts(data, at)
            body = "EMPTY" if body is None else body if kind == 4 else f"({body})"
            parts.append(body)
    return name, (",".join(parts) if parts else None), at


def geometry(value: Any) -> Any:
    """A spatial column's value (bytes, from either reader) as a `Geometry`."""
    if isinstance(value, (bytes, bytearray)):
        return Geometry(bytes(value))
    return value


#: DATA_TYPE -> how a binlog row image's value becomes setl's.
FROM_BINLOG: dict[str, Callable[[Any], Any]] = {
    "uuid": uuid_from_binlog, "inet6": inet6_from_binlog, "inet4": inet4_from_binlog,
}

#: DATA_TYPE -> how a snapshot's (text protocol) value becomes setl's.
FROM_TEXT: dict[str, Callable[[Any], Any]] = {
    "uuid": uuid_from_text, "inet6": inet6_from_text, "inet4": inet4_from_text, "float": single,
    **{kind: geometry for kind in SPATIAL_TYPES},
}


def as_text(value: Any) -> str:
    """A text value as str: psycopg hands text back as bytes when the connection's client encoding is
    SQL_ASCII (setl's connections ask for UTF8, whose bytes setl writes in any server encoding)."""
    return bytes(value).decode("utf-8") if isinstance(value, (bytes, bytearray, memoryview)) else str(value)
