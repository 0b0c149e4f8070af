"""The binlog source's DDL: each query event's statement parsed once into its model (`setl.ddl`),
the table it acts on, the tables each schema holds as of the binlog read so far, and the source
session's sql_mode. `setl.sources.mysql_binlog.assembler` hands it the DDL it reads."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from setl import ddl
from setl.model import DdlChange, Position
from setl.sources.mysql_binlog.statements import _DDL_DATABASE, _LEADING_COMMENTS, _unquote, ddl_target


class KnownTables:
    """The tables of each schema, as of the binlog read so far: loaded from the server when the
    reader opens, then kept up to date by CREATE, DROP and RENAME TABLE and DROP DATABASE."""

    def __init__(self, tables: Iterable[tuple[str, str]] = ()) -> None:
        self._schemas: dict[str, set[str]] = {}
        for schema, table in tables:
            self._schemas.setdefault(schema, set()).add(table)

    def track(self, statement: str, default_schema: str, parsed: ddl.Statement | None = None
              ) -> tuple[str, list[str]] | None:
        """Note what `statement` (whose model is `parsed`) does to the set; for DROP DATABASE,
        ``(schema, its tables)``."""
        match = _DDL_DATABASE.match(_LEADING_COMMENTS.sub("", statement, count=1))
        if match:
            name = _unquote(match["name"])
            if statement.lstrip().upper().startswith("DROP"):
                return name, sorted(self._schemas.pop(name, ()))
            return None
        if parsed is None:
            parsed = ddl.parse(statement)
        refs = [(ref.schema or default_schema, ref.table) for ref in parsed.tables]
        if parsed.kind in ("create_table", "create_sequence") and refs:
            self._schemas.setdefault(refs[0][0], set()).add(refs[0][1])
        elif parsed.kind in ("drop_table", "drop_sequence"):
            for schema, table in refs:
                self._schemas.get(schema, set()).discard(table)
        elif parsed.kind == "rename_table":
            for (old_schema, old), (new_schema, new) in zip(refs[::2], refs[1::2]):
                self._schemas.get(old_schema, set()).discard(old)
                self._schemas.setdefault(new_schema, set()).add(new)
        return None


@attrs.frozen
class DdlRead:
    """A DDL statement as the source read it: the (schema, table or None) it acts on, and its model."""

    schema: str
    table: str | None
    statement: str
    model: ddl.Statement

    def change(self, at: Position, sql_mode: str | None = None) -> DdlChange:
        return DdlChange(self.schema, self.table, self.statement, at, sql_mode=sql_mode, ddl=self.model)


class DdlEvents:
    """Reads the DDL of query events (on the reader thread): parses each statement once (`read`),
    and turns one logged on its own into the changes to hand on (`changes`), keeping `tables_of`
    up to date. `mode_names` gives a query event's sql_mode bits as names (asked of the source)."""

    def __init__(self, tables_of: KnownTables | None = None) -> None:
        self.tables_of = tables_of if tables_of is not None else KnownTables()
        self.mode_names: Callable[[int], str | None] | None = None

    @staticmethod
    def read(statement: str, default_schema: str) -> DdlRead:
        """`statement`'s model and the (schema, table) it acts on (the session's `default_schema`
        for an unqualified name)."""
        model = ddl.parse(statement)
        schema, table = ddl_target(statement, default_schema, model)
        return DdlRead(schema, table, statement, model)

    def changes(self, read: DdlRead, default_schema: str, end: Position, sql_mode_bits: object
                ) -> tuple[DdlChange, ...]:
        """The changes of a DDL logged on its own, ending at `end`: a DROP DATABASE becomes one DROP
        TABLE per table the schema held, each for the table rules to decide."""
        dropped = self.tables_of.track(read.statement, default_schema, read.model)
        if dropped is not None and dropped[1]:
            schema = dropped[0]
            return tuple(DdlChange(schema, name, f"DROP TABLE IF EXISTS {ddl.quote(schema)}.{ddl.quote(name)}", end)
                         for name in dropped[1])
        mode = None
        if self.mode_names is not None and isinstance(sql_mode_bits, int):
            mode = self.mode_names(sql_mode_bits)
        return (read.change(end, mode),)


__all__ = ["DdlEvents", "DdlRead", "KnownTables"]
