"""The reader process's frame format (`process`): a frame of transactions as plain values, row
images as columns per shape, and back. Compiled by setup.py as it is (the .py serves where it is
not built): the node's side, `Decoder`, runs for every row change the reader process hands on.

`Decoder` builds each `RowChange` by storing its fields straight into the class's slots (what the
attrs ``__init__`` does through ``object.__setattr__``, at about half the cost); `fast_row_changes`
says whether `RowChange` is still the plain slotted class that is exact for, else `RowChange(...)`
serves.
"""

from __future__ import annotations

from typing import Any

import attrs

from setl.model import Change, Position, RowChange, Transaction

#: `RowChange`'s fields in the order `Decoder` stores them; any other class shape (a field more, a
#: validator, a converter, a post-init hook, no slots) makes `Decoder` call `RowChange(...)` instead
_FIELDS = ("op", "schema", "table", "primary_key", "before", "after", "position", "commit_time", "source", "sequence")


def fast_row_changes() -> bool:
    """Whether `RowChange` can be built slot by slot exactly as its ``__init__`` builds it."""
    fields = attrs.fields(RowChange)
    return (tuple(f.name for f in fields) == _FIELDS
            and all(f.validator is None and f.converter is None and f.init for f in fields)
            and not hasattr(RowChange, "__attrs_post_init__")
            and not hasattr(RowChange, "__attrs_pre_init__")
            and tuple(getattr(RowChange, "__slots__", ())) in (_FIELDS, _FIELDS + ("__weakref__",))
            and "__dict__" not in RowChange.__dict__)


class Encoder:
    """The child's side: a frame of transactions as plain values. Each row change is a shape (op,
    table, key, the kind and column names of each image: sent once, then known by its number), a
    position and a commit time; the images' values travel as columns per shape and frame. A change
    of any other kind (DDL, a sequence's state, one with a `source`) is one object (rare)."""

    def __init__(self) -> None:
        self.shapes: dict[tuple[Any, ...], int] = {}

    def frame(self, txs: list[Transaction]) -> tuple[Any, ...]:
        shapes = self.shapes
        new: list[tuple[int, tuple[Any, ...]]] = []
        befores: dict[int, list[tuple[Any, ...]]] = {}
        afters: dict[int, list[tuple[Any, ...]]] = {}
        row_shapes: list[int] = []
        row_positions: list[int] = []
        row_times: list[float | None] = []
        positions: dict[Position | None, int] = {}
        heads: list[tuple[Any, ...]] = []
        row_change = RowChange
        for tx in txs:
            objects: list[tuple[int, Any]] = []
            for i, change in enumerate(tx.changes):
                if type(change) is tuple:  # the child's assembler's (`_Assembler.plain_rows`)
                    op, schema, table, primary_key, before, after, at, commit_time = change
                elif type(change) is not row_change or change.sequence is not None or change.source is not None:
                    objects.append((i, change))
                    continue
                else:
                    op, schema, table, primary_key = change.op, change.schema, change.table, change.primary_key
                    before, after, at, commit_time = change.before, change.after, change.position, change.commit_time
                key = (op, schema, table, primary_key,
                       type(before), None if before is None else tuple(before),
                       type(after), None if after is None else tuple(after))
                shape = shapes.get(key)
                if shape is None:
                    shape = shapes[key] = len(shapes)
                    new.append((shape, key))
                if shape not in befores:
                    befores[shape], afters[shape] = [], []
                if before is not None:
                    befores[shape].append(tuple(before.values()))
                if after is not None:
                    afters[shape].append(tuple(after.values()))
                p = positions.get(at)
                if p is None:
                    p = positions[at] = len(positions)
                row_shapes.append(shape)
                row_positions.append(p)
                row_times.append(commit_time)
            # the end by its number among the frame's positions, as the rows' positions: a `Position`
            # object pickled costs its slots' getstate in Python (about 40% of a frame's pickling)
            end = positions.get(tx.end)
            if end is None:
                end = positions[tx.end] = len(positions)
            heads.append((end, tx.complete, tx.nbytes, len(tx.changes), objects))
        columns = {shape: (list(zip(*befores[shape])), list(zip(*afters[shape]))) for shape in befores}
        places = [None if at is None else (at.log, at.offset, at.gtid, at.row) for at in positions]
        return (new, heads, columns, row_shapes, row_positions, row_times, places)


class Decoder:
    """The node's side: the transactions of a frame `Encoder.frame` made."""

    def __init__(self) -> None:
        self.shapes: dict[int, tuple[Any, ...]] = {}
        self.fast = fast_row_changes()

    def frame(self, frame: tuple[Any, ...]) -> list[Transaction]:
        new, heads, columns, row_shapes, row_positions, row_times, places = frame
        self.shapes.update(new)
        # per shape: its images in row order, and its op, schema, table and key
        images: dict[int, tuple[Any, Any, Any, str, str, tuple[str, ...]]] = {}
        for shape, (before_columns, after_columns) in columns.items():
            key = self.shapes[shape]
            n = row_shapes.count(shape)
            images[shape] = (iter(_images(key[4], key[5], before_columns, n)),
                             iter(_images(key[6], key[7], after_columns, n)), key[0], key[1], key[2], key[3])
        positions = [None if p is None else Position(p[0], p[1], p[2], row=p[3]) for p in places]
        rows = zip(row_shapes, row_positions, row_times)
        txs = []
        if self.fast:
            d = RowChange.__dict__
            new_row = object.__new__
            s0, s1, s2, s3, s4 = (d["op"].__set__, d["schema"].__set__, d["table"].__set__,
                                  d["primary_key"].__set__, d["before"].__set__)
            s5, s6, s7, s8, s9 = (d["after"].__set__, d["position"].__set__, d["commit_time"].__set__,
                                  d["source"].__set__, d["sequence"].__set__)
        row_change = RowChange
        for end, complete, nbytes, count, objects in heads:
            changes: list[Change] = []
            add = changes.append
            o = 0
            pending = len(objects)
            for i in range(count):
                if pending and objects[o][0] == i:
                    add(objects[o][1])
                    o += 1
                    pending -= 1
                    continue
                shape, p, commit_time = next(rows)
                befores, afters, op, schema, table, primary_key = images[shape]
                if self.fast:
                    change = new_row(row_change)
                    s0(change, op)
                    s1(change, schema)
                    s2(change, table)
                    s3(change, primary_key)
                    s4(change, next(befores))
                    s5(change, next(afters))
                    s6(change, positions[p])
                    s7(change, commit_time)
                    s8(change, None)
                    s9(change, None)
                    add(change)
                else:
                    add(row_change(op, schema, table, primary_key, next(befores), next(afters), positions[p],
                                   commit_time))
            txs.append(Transaction(tuple(changes), positions[end], complete, nbytes))
        return txs


def _images(kind: type, names: tuple[str, ...] | None, columns: list[tuple[Any, ...]], n: int) -> list[Any]:
    """`n` images of `kind` with columns `names` (None: no image) from their values by column."""
    if names is None:
        return [None] * n
    if not names:
        return [kind() for _ in range(n)]
    if kind is dict:
        return [dict(zip(names, values)) for values in zip(*columns)]
    return [kind(zip(names, values)) for values in zip(*columns)]
