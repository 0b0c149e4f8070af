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

This module imports nothing from setl: sources, the snapshot and sinks all read it.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Callable
from typing import Any

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


#: DATA_TYPE -> how a binlog row image's value becomes setl's.
FROM_BINLOG: dict[str, Callable[[Any], Any]] = {
    "uuid": uuid_from_binlog, "inet6": inet6_from_binlog, "inet4": inet4_from_binlog,
}

#: DATA_TYPE -> how a snapshot's (text protocol) value becomes setl's.
FROM_TEXT: dict[str, Callable[[Any], Any]] = {
    "uuid": uuid_from_text, "inet6": inet6_from_text, "inet4": inet4_from_text, "float": single,
}
