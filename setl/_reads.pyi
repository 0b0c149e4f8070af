"""Types of the compiled snapshot-read constructors (`_reads.pyx`, used through `setl.reads`)."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from setl.model import Position, RowChange, TableName

def new_reads(schema: str, table: str, key: tuple[str, ...], rows: Iterable[Mapping[str, Any]],
              position: Position | None, source: TableName | None = None) -> list[RowChange]: ...
def mapped_reads(schema: str, table: str, key: tuple[str, ...], reads: Iterable[RowChange],
                 source: TableName | None) -> list[RowChange]: ...
def read_run_end(changes: Sequence[Any], start: int) -> int: ...
