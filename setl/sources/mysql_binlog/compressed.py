"""MariaDB's compressed binlog events (`log_bin_compress=ON`) as the events they stand for.

MariaDB 10.2+ writes a query or rows event whose body is at least `log_bin_compress_min_len`
bytes as its compressed kind: QUERY_COMPRESSED_EVENT (165), WRITE/UPDATE/DELETE_ROWS_COMPRESSED
(166-168 for the V1 forms, 169-171 for V2). The header, the post-header and the fixed part of the
body are as in the plain event; the rest (a query's text; a rows event's row images, after its
column count and bitmaps) is one zlib stream behind a header byte ``0b1000_0LLL`` and ``LLL``
big-endian bytes of its inflated length (`binlog_buf_compress` in MariaDB's log_event.cc).

`inflate` turns the packet of such an event into the packet of the plain event it stands for:
the plain type, the event size of the inflated body, and a CRC32 computed anew when the stream
has checksums. Both ways into an event take every packet through it (setl's in `fast.FastStream`,
the library's parse of other bodies through `plain_packet`, in `stream.BinlogStream.parse`), so
the rest of setl never sees a compressed event. A packet that does not inflate exactly (a corrupt
header, a zlib error, an inflated length other than the one written) raises `InflateError`;
nothing is skipped.
"""

from __future__ import annotations

import struct
import zlib

from setl.errors import CorruptEvent

#: compressed event type -> the plain type it stands for
PLAIN_TYPE: dict[int, int] = {
    165: 0x02,  # QUERY_COMPRESSED_EVENT -> QUERY_EVENT
    166: 0x17, 167: 0x18, 168: 0x19,  # WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT_V1 -> *_ROWS_EVENT_V1
    169: 0x1E, 170: 0x1F, 171: 0x20,  # WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT -> *_ROWS_EVENT_V2
}
#: the post-header's length where the format description does not say (MariaDB's own values)
_POST_HEADER = {165: 13, 166: 8, 167: 8, 168: 8, 169: 10, 170: 10, 171: 10}
_UPDATES = frozenset({167, 170})
#: the packet's OK byte, then the 19-byte event header
_HEADER = 20
_TYPE_AT, _SIZE_AT = 5, 10
_LARGEST = 1 << 30  # max_allowed_packet's ceiling: no event inflates past it


class InflateError(ValueError):
    """A binlog event whose bytes do not hold what its type and lengths say."""


def is_compressed(packet: bytes) -> bool:
    """Whether `packet` (a binlog stream packet, its OK byte first) holds a compressed event."""
    return len(packet) > _HEADER and packet[0] == 0 and packet[_TYPE_AT] in PLAIN_TYPE


def inflate(packet: bytes, checksum: bool, post_header: int | None = None) -> bytes:
    """The packet of the plain event that compressed `packet` stands for.

    `checksum`: whether the stream's events end in a 4-byte CRC32 (`binlog_checksum`);
    `post_header`: the post-header length the format description gives the compressed type
    (None: MariaDB's). Raises `InflateError` where the bytes do not inflate exactly.
    """
    kind = packet[_TYPE_AT]
    declared = struct.unpack_from("<I", packet, _SIZE_AT)[0]
    end = 1 + declared - (4 if checksum else 0)  # the body's end in the packet
    if declared < 19 + (4 if checksum else 0) or 1 + declared > len(packet):
        raise InflateError(f"event size {declared} does not fit its packet of {len(packet) - 1} bytes")
    post = _POST_HEADER[kind] if not post_header else post_header
    at = _HEADER + post
    if kind == 165:
        if at > end:
            raise InflateError("the query event ends inside its post-header")
        db_len = packet[_HEADER + 8]
        status_len = struct.unpack_from("<H", packet, _HEADER + 11)[0]
        at += status_len + db_len + 1
    else:
        if post >= 10:  # V2: a variable header, its length counting its own two bytes
            if at + 2 > end:
                raise InflateError("the rows event ends inside its post-header")
            extra = struct.unpack_from("<H", packet, _HEADER + 8)[0]
            if extra < 2:
                raise InflateError(f"the rows event's extra data length {extra} is below 2")
            at = _HEADER + 8 + extra
        width, at = _packed_int(packet, at, end)
        at += (width + 7) // 8 * (2 if kind in _UPDATES else 1)
    if at >= end:
        raise InflateError("the event ends before its compressed part")
    body = _inflated(packet[at:end])
    plain = bytearray(packet[:at])
    plain += body
    size = len(plain) - 1 + (4 if checksum else 0)
    plain[_TYPE_AT] = PLAIN_TYPE[kind]
    struct.pack_into("<I", plain, _SIZE_AT, size)
    if checksum:
        plain += struct.pack("<I", zlib.crc32(memoryview(plain)[1:]))
    return bytes(plain)


def _packed_int(packet: bytes, at: int, end: int) -> tuple[int, int]:
    """A length-encoded integer at `at`, and the offset after it."""
    if at >= end:
        raise InflateError("the rows event ends before its column count")
    first = packet[at]
    if first < 251:
        return first, at + 1
    size = {252: 2, 253: 3, 254: 8}.get(first)
    if size is None or at + 1 + size > end:
        raise InflateError(f"the rows event's column count is not a valid length (first byte {first})")
    return int.from_bytes(packet[at + 1:at + 1 + size], "little"), at + 1 + size


def _inflated(data: bytes) -> bytes:
    """The bytes of one compressed part: its header byte, its length, its zlib stream."""
    head = data[0]
    if head & 0xE0 != 0x80:
        raise InflateError(f"the compressed part's header byte {head:#04x} is not 0b100xxxxx")
    algorithm, lenlen = (head & 0x70) >> 4, head & 0x07
    if algorithm != 0:
        raise InflateError(f"the compressed part uses algorithm {algorithm}; only zlib (0) exists")
    if not 1 <= lenlen <= 4 or len(data) < 1 + lenlen:
        raise InflateError(f"the compressed part's length takes {lenlen} bytes")
    length = int.from_bytes(data[1:1 + lenlen], "big")
    if length > _LARGEST:
        raise InflateError(f"the compressed part claims {length} bytes inflated")
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data[1 + lenlen:], length + 1)
    except zlib.error as exc:
        raise InflateError(f"the compressed part does not inflate: {exc}") from None
    if inflater.unused_data:
        raise InflateError(f"{len(inflater.unused_data)} bytes follow the compressed part's zlib stream")
    if len(body) != length or not inflater.eof:
        raise InflateError(f"the compressed part inflates to {len(body)}{'+' if not inflater.eof else ''} bytes, "
                           f"not the {length} it claims")
    return body


def corrupt(exc: InflateError, kind: int, log_file: str | None, log_pos: int) -> CorruptEvent:
    """The error that stops the reader at a compressed event (type `kind`, ending at `log_pos`) that
    does not inflate."""
    where = f"{log_file}:{log_pos}" if log_file else f"offset {log_pos}"
    return CorruptEvent(f"compressed binlog event (type {kind}, written with log_bin_compress=ON) ending at "
                           f"{where} is corrupt: {exc}", stage="select")


def plain_packet(packet: bytes, checksum: bool, post_header_lengths: bytes | None) -> bytes:
    """The packet the library parses for `packet`: `packet` itself, or the plain event a compressed
    one stands for; a compressed event that does not inflate raises CorruptEvent."""
    if not is_compressed(packet):
        return packet
    kind = packet[_TYPE_AT]
    post_header = post_header_lengths[kind - 1] if post_header_lengths and len(post_header_lengths) >= kind else None
    try:
        return inflate(packet, checksum, post_header)
    except InflateError as exc:
        raise corrupt(exc, kind, None, int.from_bytes(packet[14:18], "little")) from exc
