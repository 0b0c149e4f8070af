"""Snapshot reads (`Op.READ` row changes) made in bulk, for the paths that make one per copied row:
a chunk handed on by the snapshot, and the same reads mapped by Extract.

`new_reads` and `mapped_reads` build exactly what the `RowChange` constructor builds. Where the
compiled module (`setl._reads`, built by ``pip install``) is present and `RowChange` has the fields
it was written for, with no validator, converter or post-init hook, it sets each change's slots
in C; otherwise the constructor is called per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from setl.model import Op, Position, RowChange, TableName

#: The fields the compiled constructors set, in order.
FIELDS = ("op", "schema", "table", "primary_key", "before", "after", "position", "commit_time", "source", "sequence")


def _plain_fields() -> bool:
    """Whether `RowChange` is still the slotted class of `FIELDS` whose construction only stores them."""
    fields = attrs.fields(RowChange)
    return (tuple(f.name for f in fields) == FIELDS and "__slots__" in RowChange.__dict__
            and all(f.validator is None and f.converter is None and f.on_setattr is None for f in fields)
            and not hasattr(RowChange, "__attrs_post_init__") and not hasattr(RowChange, "__attrs_pre_init__"))


def _new_reads(schema: str, table: str, key: tuple[str, ...], rows: Iterable[Mapping[str, Any]],
               position: Position | None, source: TableName | None = None) -> list[RowChange]:
    read = Op.READ
    return [RowChange(read, schema, table, key, None, row, position, None, source) for row in rows]


def _mapped_reads(schema: str, table: str, key: tuple[str, ...], reads: Iterable[RowChange],
                  source: TableName | None) -> list[RowChange]:
    read = Op.READ
    return [RowChange(read, schema, table, key, None, r.after, r.position, r.commit_time, source) for r in reads]


try:
    import setl._reads as _compiled
except ImportError:  # not built: the constructor per row
    COMPILED = False
else:
    COMPILED = _plain_fields()


def new_reads(schema: str, table: str, key: tuple[str, ...], rows: Sequence[Mapping[str, Any]],
              position: Position | None, source: TableName | None = None) -> list[RowChange]:
    """A snapshot read of each row (its after-image), all at `position`, without commit time; with
    `source` (the table read, as Extract would route it) when given."""
    if COMPILED:
        return _compiled.new_reads(schema, table, key, rows, position, source)
    return _new_reads(schema, table, key, rows, position, source)


def mapped_reads(schema: str, table: str, key: tuple[str, ...], reads: Sequence[RowChange],
                 source: TableName | None) -> list[RowChange]:
    """Each of `reads` as a read of `schema`.`table` (key `key`, from `source`), with its own
    after-image, position and commit time. Compiled, a read that is one already (a snapshot read
    made with its `source`, which a route that changes nothing hands on) is itself in the list:
    equal either way, since `source` is not part of equality."""
    if COMPILED:
        return _compiled.mapped_reads(schema, table, key, reads, source)
    return _mapped_reads(schema, table, key, reads, source)


def _read_run_end(changes: Sequence[Any], start: int) -> int:
    first = changes[start]
    end, count, read = start + 1, len(changes), Op.READ
    schema, table, key = first.schema, first.table, first.primary_key
    while end < count:
        following = changes[end]
        if (type(following) is not RowChange or following.op is not read or following.table != table
                or following.schema != schema or following.primary_key != key):
            break
        end += 1
    return end


def read_run_end(changes: Sequence[Any], start: int) -> int:
    """The index after the run of snapshot reads that begins at `changes[start]` (a `RowChange`
    read) and goes on while each change is a `RowChange` read of the same schema, table and key:
    a chunk, which Extract routes once."""
    if COMPILED:
        return _compiled.read_run_end(changes, start)
    return _read_run_end(changes, start)
