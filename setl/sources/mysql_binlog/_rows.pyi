"""Types of the compiled row decoder (`_rows.pyx`)."""

from collections.abc import Callable, Sequence
from typing import Any

class Truncated(ValueError): ...

class RowDecoder:
    def __init__(self, columns: Sequence[Any], charset_to_encoding: Callable[[str], str],
                 time2: Callable[[bytes, int], Any], make_date: Callable[[int, int, int], Any],
                 make_datetime: Callable[..., Any]) -> None: ...
    def decode(self, data: bytes, pos: int, end: int, kind: int) -> list[dict[str, Any]]: ...

def full_bitmap(data: bytes, pos: int, ncols: int) -> bool: ...


class Framer:
    def __init__(self, conn: Any) -> None: ...
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
