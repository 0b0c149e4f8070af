"""Shapes of row writes both SQL dialects share: statement-sized slices, images grouped by their
columns, runs of inserts in a keyless table's changes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from setl.model import Batch, Op, RowChange

T = TypeVar("T")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in consecutive slices of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def group_by_columns(images: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Row images grouped by their column lists, so each group is one multi-row statement."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for image in images:
        groups.setdefault(tuple(image), []).append(image)
    return groups


def reads_only(batch: Batch) -> bool:
    """Whether every change of `batch` is a snapshot read (`Op.READ`): a chunk, whose rows the
    target is not expected to hold yet (what a sink's straight bulk path may assume first)."""
    read = Op.READ
    return all(type(c) is RowChange and c.op is read for c in batch.changes)


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


__all__ = ["chunks", "group_by_columns", "insert_runs", "reads_only"]
