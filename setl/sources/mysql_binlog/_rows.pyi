"""Types of the compiled row decoder (`_rows.pyx`)."""

from collections.abc import Callable, Sequence
from typing import Any

from setl.sources.mysql_binlog.rowcodec import Corrupt as Corrupt
from setl.sources.mysql_binlog.rowcodec import Truncated as Truncated

class RowDecoder:
    def __init__(self, columns: Sequence[Any], charset_to_encoding: Callable[[str], str],
                 time2: Callable[[bytes, int], Any], make_date: Callable[[int, int, int], Any],
                 make_datetime: Callable[..., Any], json_value: Callable[[bytes], Any] | None = None) -> None: ...
    def decode(self, data: bytes, pos: int, end: int, kind: int, present: tuple[bytes, bytes] | None = None
               ) -> list[dict[str, Any]]: ...

def full_bitmap(data: bytes, pos: int, ncols: int) -> bool: ...


class Framer:
    def __init__(self, io: Any) -> None: ...
    def sync(self) -> None: ...
    def packet(self) -> bytes: ...

class EventHeader:
    timestamp: int
    event_type: int
    server_id: int
    event_size: int
    log_pos: int
    flags: int
    event: Any
    def __init__(self, data: bytes) -> None: ...

def le_int(data: bytes, pos: int, size: int) -> int: ...
def equal_at(data: bytes, pos: int, size: int, other: bytes) -> bool: ...
def count_rows(data: bytes, pos: int, end: int, kind: int, widths: Any) -> int: ...
