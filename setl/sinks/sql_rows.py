"""Shapes of row writes both SQL dialects share: statement-sized slices, images grouped by their
columns, runs of inserts in a keyless table's changes; and the scans of a batch's images asked of
every batch (one shape, a type among the values, reads only), in C where `_images.pyx` is built."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from setl.model import Batch, Op, RowChange

T = TypeVar("T")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in consecutive slices of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def group_by_columns(images: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Row images grouped by their column lists (in order), so each group is one multi-row
    statement; each group's images in their order in `images`."""
    listed = list(images)
    shape = one_shape(listed)
    if shape is not None:  # the common case: every image of one shape (a chunk's reads)
        return {shape: listed}
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for image in listed:
        groups.setdefault(tuple(image), []).append(image)
    return groups


def _one_shape(images: list[Mapping[str, Any]]) -> tuple[str, ...] | None:
    """The column list (keys in order) every image of `images` shares; None when they do not all
    share one, or `images` is empty."""
    if not images:
        return None
    shape = tuple(images[0])
    return shape if all(tuple(image) == shape for image in images) else None


def reads_only(batch: Batch) -> bool:
    """Whether every change of `batch` is a snapshot read (`Op.READ`): a chunk, whose rows the
    target is not expected to hold yet (what a sink's straight bulk path may assume first)."""
    return _only_reads(batch.changes, RowChange, Op.READ)


def holds_type(batch: Batch, kind: type) -> bool:
    """Whether a value of exactly type `kind` is in a row image (before or after) of `batch`; asked
    of every batch a SQL target prepares."""
    return _holds_type(batch.changes, RowChange, kind)


def _python_holds_type(changes: Iterable[Any], row_change: type[Any], kind: type) -> bool:
    """Whether a value of exactly type `kind` is in the before or after image of one of `changes`
    whose type is exactly `row_change` (other changes have no images)."""
    for change in changes:
        if type(change) is row_change and (
                (change.before is not None and kind in map(type, change.before.values()))
                or (change.after is not None and kind in map(type, change.after.values()))):
            return True
    return False


def _python_only_reads(changes: Iterable[Any], row_change: type[Any], read: object) -> bool:
    """Whether every one of `changes` is of type exactly `row_change` with op `read`."""
    return all(type(c) is row_change and c.op is read for c in changes)


def _python_holds_one_of(rows: list[Sequence[Any]], kinds: frozenset[type]) -> bool:
    """Whether a value of a type in `kinds` (exact types) is in one of `rows`."""
    return not kinds.isdisjoint(map(type, itertools.chain.from_iterable(rows)))


try:  # the scans in C (`_images.pyx`), these functions where it is not built
    from setl.sinks._images import holds_one_of, one_shape
    from setl.sinks._images import holds_type as _holds_type
    from setl.sinks._images import only_reads as _only_reads
except ImportError:
    _holds_type, one_shape, _only_reads = _python_holds_type, _one_shape, _python_only_reads
    holds_one_of = _python_holds_one_of
    COMPILED = False
else:
    COMPILED = True


def insert_runs(sequence: Sequence[RowChange]) -> Iterator[tuple[RowChange | None, list[Mapping[str, Any]]]]:
    """A keyless table's changes in order, each run of changes that only add a row (inserts and
    snapshot reads) gathered: ``(None, after-images)`` for such a run, ``(change, [])`` for any
    other change. A run can go to the target as one multi-row statement: rows of a table without
    a key have no order the target keeps, so only the runs' order with the other changes matters."""
    run: list[Mapping[str, Any]] = []
    for change in sequence:
        if change.before is None and change.after is not None:
            run.append(change.after)
            continue
        if run:
            yield None, run
            run = []
        yield change, []
    if run:
        yield None, run


__all__ = ["COMPILED", "chunks", "group_by_columns", "holds_one_of", "holds_type", "insert_runs", "one_shape",
           "reads_only"]
