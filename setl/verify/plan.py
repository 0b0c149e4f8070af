"""What `setl verify` compares for one source table, decided once from the pipeline's routing
plan and both ends' column types: the replicated columns (renamed, excluded ones left out), the
key, and how chunks are compared (server-side hashes, or rows fetched and compared in Python).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import attrs

from setl.errors import SetlError
from setl.model import TableName
from setl.routing import Route
from setl.snapshot.reader import TablePlan
from setl.verify import mariadb, postgresql
from setl.verify.canonical import STRINGS


@attrs.frozen
class Column:
    """A compared column: its source and target names and each end's type."""

    source: str
    target: str
    kind: str  # the source's information_schema DATA_TYPE, lower case
    target_type: str  # the target's information_schema data type, lower case


@attrs.frozen
class TableCheck:
    """How one source table is compared with its target table.

    * `columns`: the replicated source columns that exist in the target, in source order;
    * `key`: the primary-key columns (empty: a keyless table, compared as a multiset of rows);
    * `mode`: ``sql`` (each server hashes its rows' canonical texts) or ``python`` (rows fetched
      and their texts compared here), with `why` saying what forced ``python``;
    * `ranged`: chunks are key ranges (False: the table is one chunk, when the two servers may
      order its key differently);
    * `unchecked`: replicated columns not compared, each with its reason.
    """

    source: TablePlan
    route: Route
    target: TableName
    columns: tuple[Column, ...]
    key: tuple[Column, ...]
    mode: Literal["sql", "python"]
    dialect: str
    ranged: bool = True
    why: str = ""
    unchecked: Mapping[str, str] = attrs.Factory(dict)

    @property
    def keyless(self) -> bool:
        return not self.key

    @property
    def name(self) -> TableName:
        return self.source.name


def _target_only(columns: list[Column], target_types: Mapping[str, str], route: Route,
                 dialect: str) -> dict[str, str]:
    """The target's columns no compared source column maps to, each with why it is not a difference:
    a column the source dropped that ``schema_changes: ignore_drops`` keeps (docs/schema-changes.md),
    or one the target has of its own."""
    matched = {c.target.lower() if dialect == "mysql" else c.target for c in columns}
    if dialect == "postgresql":
        matched |= {postgresql.target_name(c.target) for c in columns}
    why = ("kept on the target by schema_changes: ignore_drops (not in the source)"
           if route.schema_changes == "ignore_drops" else "only in the target (not in the source)")
    return {name: why for name in target_types
            if (name.lower() if dialect == "mysql" else name) not in matched}


def plan_table(source: TablePlan, route: Route, target_types: Mapping[str, str] | None, dialect: str, *,
               pipeline: str) -> TableCheck:
    """The check of `source` along `route`, given the target table's column types (None: it does
    not exist: a `SetlError`)."""
    where = {"pipeline": pipeline, "table": str(source.name)}
    if target_types is None:
        raise SetlError(f"target table {route.target} does not exist", stage="verify", **where)
    columns, unchecked = [], {}
    for name in source.columns:
        if not route.keeps(name):
            continue
        target_name = route.rename.get(name, name)
        found = target_types.get(target_name)
        if found is None and dialect == "mysql":
            found = next((t for c, t in target_types.items() if c.lower() == target_name.lower()), None)
        if found is None and dialect == "postgresql":  # a name over 63 bytes, as setl maps it
            found = target_types.get(postgresql.target_name(target_name))
        if found is None:
            unchecked[name] = f"no column {target_name!r} in {route.target}"
            continue
        columns.append(Column(name, target_name, source.types[name], found))
    unchecked.update(_target_only(columns, target_types, route, dialect))
    by_name = {c.source: c for c in columns}
    key = []
    for name in source.key:
        if name not in by_name:
            raise SetlError(f"key column {name!r} is not replicated to {route.target}", stage="verify", **where)
        key.append(by_name[name])
    if dialect == "postgresql":
        for c in list(columns):
            if c.kind in postgresql.UNCOMPARED:
                unchecked[c.source] = f"{c.kind} into PostgreSQL is not compared"
                columns.remove(c)
    if not columns:  # nothing would be compared but the row count: never a verdict of equal
        why = "; ".join(f"{name}: {reason}" for name, reason in unchecked.items()) or "it replicates no column"
        raise SetlError(f"no column of it could be compared with {route.target} ({why}): verify cannot tell "
                        "whether the tables are equal", stage="verify", **where)
    builder = mariadb if dialect == "mysql" else postgresql
    python = [c.source for c in columns if builder.text_sql(c.kind, c.target_type, "x") is None
              or mariadb.text_sql(c.kind, c.kind, "x") is None]
    reasons = []
    if route.filter is not None:
        reasons.append("a row filter")
    if python:
        reasons.append(f"no exact server-side text for {', '.join(python)}")
    # The servers may order string keys differently (collations): such a table is one chunk.
    ranged = not (dialect == "postgresql" and any(c.kind in STRINGS or c.kind == "set" for c in key))
    return TableCheck(source, route, route.target, tuple(columns), tuple(key), "python" if reasons else "sql",
                      dialect, ranged, "; ".join(reasons), unchecked)
