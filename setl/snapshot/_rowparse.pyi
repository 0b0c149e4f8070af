"""Types of the compiled row parser (`_rowparse.pyx`, used by `setl.snapshot.rows`)."""

from collections.abc import Iterable
from typing import Any

class RowParser:
    def __init__(self, fields: Iterable[tuple[str, str | None, Any]]) -> None: ...
    def parse(self, data: bytes) -> dict[str, Any]: ...
