"""Frozen values passed between stages and threads: positions, row changes, transactions, batches."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from setl.ddl import Statement as DdlStatement
from setl.ddl import parse as parse_ddl
from setl.errors import TableRefused


@attrs.frozen(order=True)
class Position:
    """A point in a source's log, *after* the last change it covers.

    Resuming from a position re-reads nothing it covers and skips nothing after
    it. `log` is a binlog file name (ordered by its zero-padded sequence number)
    or a test source's name; `offset` is the byte or record offset within it;
    `gtid` is the GTID set executed up to here, when the source has one.

    `row` is non-zero only inside a transaction delivered in pieces (larger than
    a batch): the position then covers the first `row` row changes of the
    transaction that *starts* at (`log`, `offset`), and resuming from it reads
    that transaction again from its start and skips those `row` changes. Order
    is (log, offset, row), so such a position sorts after the transaction's
    start and before its end. Printed and parsed as ``LOG:OFFSET+ROW``.
    """

    log: str
    offset: int
    gtid: str | None = attrs.field(default=None, order=False)
    row: int = attrs.field(default=0, kw_only=True)

    def __str__(self) -> str:
        text = f"{self.log}:{self.offset}" + (f"+{self.row}" if self.row else "")
        return f"{text} (gtid {self.gtid})" if self.gtid else text

    def to_dict(self) -> dict[str, Any]:
        """The position as the meta stores keep it (JSON): log and offset, gtid and row when set."""
        data: dict[str, Any] = {"log": self.log, "offset": self.offset}
        if self.gtid:
            data["gtid"] = self.gtid
        if self.row:
            data["row"] = self.row
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Position":
        """The position `to_dict` wrote."""
        return cls(log=str(data["log"]), offset=int(data["offset"]), gtid=data.get("gtid"),
                   row=int(data.get("row") or 0))

    @classmethod
    def parse(cls, text: str) -> "Position":
        """Parse ``LOG:OFFSET`` or ``LOG:OFFSET+ROW`` as typed by an operator."""
        log, sep, rest = text.rpartition(":")
        offset, plus, row = rest.partition("+")
        if not sep or not log or not offset.isdigit() or (plus and not row.isdigit()):
            raise ValueError(f"position {text!r} is not LOG:OFFSET (or LOG:OFFSET+ROW)")
        return cls(log=log, offset=int(offset), row=int(row) if plus else 0)

    @property
    def within_transaction(self) -> bool:
        """True for a checkpoint inside a transaction delivered in pieces."""
        return self.row > 0


@attrs.frozen
class InvalidDate:
    """A DATE, DATETIME or TIMESTAMP value MySQL holds but no calendar has.

    MySQL and MariaDB store zero and partial dates (``0000-00-00``,
    ``2024-00-15``, ``0000-00-00 00:00:00``, a TIMESTAMP of 0). The binlog source
    hands them on as this value, with the server's own text, instead of None, so
    that a MySQL target can write them exactly and every other target applies a
    documented policy instead of losing them silently.
    """

    text: str

    def __str__(self) -> str:
        return self.text


class Op(str, enum.Enum):
    """What a `RowChange` did. READ is a row copied by a snapshot (Debezium's ``r``): it has only
    an after image, and a target applies it as "insert, or replace the row with the same key", so
    that a snapshot chunk copied twice leaves the target as once."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    READ = "read"


@attrs.frozen(order=True)
class TableName:
    """A table as a (schema, table) pair. Either part may hold dots, so a name is never one string
    split on a dot; `str()` (``schema.table``) is for messages only."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @classmethod
    def parse(cls, text: str) -> TableName:
        """The table an operator names as ``SCHEMA.TABLE`` (on a command line, in a config list),
        split at its first dot; a `ValueError` when either side is empty."""
        schema, dot, table = text.partition(".")
        if not (dot and schema and table):
            raise ValueError(f"{text!r} is not SCHEMA.TABLE")
        return cls(schema, table)


class PartialImage(dict[str, Any]):
    """A row image that holds only some of its table's columns: those the source logged.

    MySQL and MariaDB log partial images when the writing session runs with
    ``binlog_row_image=NOBLOB`` (BLOB/TEXT columns the statement did not need are left out) or
    ``MINIMAL`` (a before-image of the key columns only, an after-image of the columns the statement
    set). A column the image lacks is *absent*: its value is not known, which is not NULL. A stage
    that reshapes a partial image keeps this type (`partial_like`), so that the flag travels.
    """

    __slots__ = ()


def partial_like(source: Mapping[str, Any] | None, image: dict[str, Any]) -> dict[str, Any]:
    """`image` (built from `source`) as a `PartialImage` when `source` is one, else as it is."""
    return PartialImage(image) if type(source) is PartialImage else image


def partial_image_refusal(what: str, table: str, cause: str) -> str:
    """The one-line message of an error refusing a partial row image (`RowChange.partial`): `what`
    could not be applied exactly to `table` (the source table, when known) because of `cause`, and
    the fix."""
    return (f"{what} cannot be applied exactly: {cause}; the source logged a partial row image "
            f"(binlog_row_image=NOBLOB or MINIMAL in the writing session); fix: SET GLOBAL "
            f"binlog_row_image=FULL on the source and reconnect the writer's sessions, exclude {table} in the "
            f"pipeline's tables until it is past its partial changes, then re-copy it with `setl snapshot "
            f"--pipeline <pipeline> --table {table}` (docs/mysql-source.md, \"Partial row images\")")


@attrs.frozen
class RowChange:
    """One row changed by one statement, with its before and after images.

    `before` is None for inserts and `after` is None for deletes. An image holds every column of
    the row, except when it is a `PartialImage` (`partial`): then it holds only the columns the
    source logged, and a column it lacks is unknown (never None, which is NULL). A target applies
    a partial update as "set these columns of the row with this key", refuses what it cannot apply
    exactly that way (an insert lacking columns, a table without a key, a before-image without the
    whole key) and every stage that needs whole rows (transforms, a filter on an absent column)
    refuses it too (`partial_image_refusal`). `primary_key`
    names the key columns (empty when the table has none). `position` is the
    position after the transaction that holds the change; for a change of a
    transaction delivered in pieces it is the position after the change itself
    (`Position.row` = its 1-based ordinal among the transaction's row changes),
    so that every change of a log has its own, ordered position.
    """

    op: Op
    schema: str
    table: str
    primary_key: tuple[str, ...]
    before: Mapping[str, Any] | None
    after: Mapping[str, Any] | None
    position: Position | None = None
    commit_time: float | None = None
    #: The source table a routed change came from (set by Extract, None before it): the key to its
    #: route in the pipeline's `setl.routing.RoutingPlan`. Not part of equality.
    source: TableName | None = attrs.field(default=None, eq=False, repr=False)
    #: Set on a sequence's state row (MariaDB writes the full state, an insert, when NEXTVAL takes
    #: a new cache block or SETVAL runs), None on a table's row: the statement that creates the
    #: sequence (``SHOW CREATE SEQUENCE`` on the source, names mapped by Extract), or "" when the
    #: source could not show it. A target that applies sequences writes the state as a whole and
    #: creates the sequence from this first when it has none. Not part of equality.
    sequence: str | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)

    @property
    def partial(self) -> bool:
        """Whether an image lacks some of the table's columns (a `PartialImage`)."""
        return type(self.after) is PartialImage or type(self.before) is PartialImage

    @property
    def image(self) -> Mapping[str, Any]:
        """The image that identifies the row now: after, or before for deletes."""
        return self.after if self.after is not None else self.before  # type: ignore[return-value]

    @property
    def key(self) -> tuple[Any, ...]:
        """Primary-key values of the current image (the whole row if no key)."""
        image = self.image
        if self.primary_key:
            return tuple(image[c] for c in self.primary_key)
        return tuple(sorted(image.items()))

    @property
    def old_key(self) -> tuple[Any, ...] | None:
        """Primary-key values of the before image, when there is one."""
        if self.before is None:
            return None
        if self.primary_key:
            return tuple(self.before[c] for c in self.primary_key)
        return tuple(sorted(self.before.items()))

    @property
    def qualified_table(self) -> str:
        """``schema.table``, unquoted: for messages and per-table keys."""
        return f"{self.schema}.{self.table}"


@attrs.frozen
class DdlChange:
    """A DDL statement. A DDL is always its own batch, ordered with the rows around it.

    `snapshot` marks the ``TRUNCATE TABLE`` a snapshot emits before copying a table
    (`setl.snapshot`): targets apply it whatever ``pipeline.ddl`` says, since the copy that
    follows replaces what the target held. `copy_end` marks no statement (`statement` is empty)
    but the end of a table's copy, handed on right after its last chunk when the target declares
    `setl.stages.load.LoadCapabilities.copy_end`: an SQL target that copied into a staging table
    (a re-copy of a table holding rows) switches the table to the copied rows there; any other
    target ignores it, and a replay of it is harmless. `source` is the source table of a routed DDL (set by
    Extract, as for `RowChange.source`), so that the table a snapshot empties can be created first.
    `sql_mode` is the source session's ``sql_mode`` the statement ran with (names, comma-joined),
    when the source tells it: a MySQL target runs the statement under it, so that an ALTER the
    source ran non-strict (cutting existing values) is not refused by a strict target session.
    `refused` says why the table's ``schema_changes`` policy refuses the statement (decided once,
    where Extract routes it: `setl.ddl.policy`): every target raises `refusal` at it, applying
    nothing of it. `logged_rows` marks no DDL but a row change logged as a statement (`statement`
    is its text, `refused` why), handed on in its place by a source under ``on_table_error:
    quarantine`` (docs/quarantine.md): every target raises `refusal` at it too, and Extract routes
    it to its table's target as it is.
    """

    schema: str
    table: str | None
    statement: str
    position: Position | None = None
    snapshot: bool = attrs.field(default=False, kw_only=True)
    copy_end: bool = attrs.field(default=False, kw_only=True)
    sql_mode: str | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)
    source: TableName | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)
    refused: str | None = attrs.field(default=None, kw_only=True)
    logged_rows: bool = attrs.field(default=False, kw_only=True)
    #: the statement's one model (`setl.ddl.Statement`), parsed where the change is made (the
    #: source) and read by every later stage; its text is `statement` (checked), so a change made
    #: with another statement must bring that statement's model: `with_ddl`
    ddl: DdlStatement = attrs.field(
        default=attrs.Factory(lambda self: parse_ddl(self.statement), takes_self=True), kw_only=True, eq=False,
        repr=False)

    @ddl.validator
    def _same_statement(self, _: Any, value: DdlStatement) -> None:
        if value.text != self.statement:
            raise ValueError(f"a DDL change's model is of another statement: {value.text!r}, not {self.statement!r}")

    @property
    def qualified_table(self) -> str:
        """``schema.table``, or the schema alone for a schema-level statement."""
        return f"{self.schema}.{self.table}" if self.table else self.schema

    def with_ddl(self, model: DdlStatement, **changes: Any) -> "DdlChange":
        """This change with `model` as its statement (the routing's rewrite of it), and `changes`."""
        return attrs.evolve(self, statement=model.text, ddl=model, **changes)

    def refusal(self, pipeline: str, batch: int, position: Position | None) -> TableRefused:
        """The error a target raises at a statement its table's policy refuses (`refused`): one
        line naming the table, the position, the policy and the statement, and what to do."""
        source = f" (source {self.source})" if self.source is not None else ""
        if self.logged_rows:
            copy = self.source or self.qualified_table
            return TableRefused(
                f"{STATEMENT_LOGGED} (the session ran with binlog_format STATEMENT or MIXED){source}: "
                f"{' '.join(self.statement.split())[:200]}; {self.refused}. Its table stops here (quarantined, its "
                "later changes kept) and only a copy brings it back: SET GLOBAL binlog_format=ROW (and in the writing "
                f"sessions), then `setl snapshot --table {copy}` (a replay of what is kept is refused); "
                "docs/quarantine.md", pipeline=pipeline or None, stage="load", table=self.qualified_table, batch=batch,
                position=position)
        return TableRefused(
            f"{SCHEMA_REFUSED}{source}: {self.refused}; not applied: {' '.join(self.statement.split())}; "
            "the target is left as it was before it. To take it, set a schema_changes policy that applies it on "
            "the table's rule (or pipeline.schema_changes) and resume; docs/schema-changes.md",
            pipeline=pipeline or None, stage="load", table=self.qualified_table, batch=batch, position=position)

    @classmethod
    def end_of_copy(cls, table: TableName, position: Position | None) -> "DdlChange":
        """The marker a snapshot hands on once `table`'s copy is all handed on (`copy_end`)."""
        return cls(table.schema, table.table, "", position, copy_end=True)

    @classmethod
    def rows_logged_as_statement(cls, schema: str, table: str, statement: str, position: Position | None
                                 ) -> "DdlChange":
        """The marker a source hands on in the place of a row change to `schema`.`table` logged as
        `statement` (`logged_rows`): setl has no row images for it."""
        return cls(schema, table, statement, position, logged_rows=True, refused=STATEMENT_UNKNOWN)


Change = RowChange | DdlChange

#: How every error of a statement refused by its table's ``schema_changes`` policy begins (after
#: its context): what `setl verify` knows a stopped table by.
SCHEMA_REFUSED = "schema change refused"
#: How every error of a row change logged as a statement begins (after its context), and the cause a
#: quarantine of its table records: what a replay knows a table only a copy brings back by.
STATEMENT_LOGGED = "a row change logged as a statement"
#: Why setl cannot apply such a change (`DdlChange.refused` of its marker).
STATEMENT_UNKNOWN = "setl has no row images for it, so what it changed on the source is unknown"


@attrs.frozen
class Transaction:
    """What a source hands to Select: the changes of one transaction and where it ends.

    `complete` is False for a piece of a transaction too large to hold at once;
    its `end` is then a checkpoint inside the transaction (`Position.row` > 0):
    the transaction's start plus the row changes handed on so far, from which
    a source can resume without re-reading those changes.
    `nbytes` is the size the source read for it, for the batch byte limit.
    """

    changes: tuple[Change, ...]
    end: Position
    complete: bool = True
    nbytes: int = 0

    @property
    def is_ddl(self) -> bool:
        """Whether the transaction holds a DDL statement (Select cuts a batch around it)."""
        for change in self.changes:  # a loop, not any(<generator>): it runs for every transaction
            if isinstance(change, DdlChange):
                return True
        return False


@attrs.frozen
class Quarantined:
    """One quarantined target table (docs/quarantine.md): why, from which position on, and what is
    kept for it on the target."""

    table: str  # the target table, schema.table
    cause: str
    first: Position  # the position of its first change not applied (kept from there on)
    changes: int  # changes kept
    nbytes: int  # their size as kept

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "state": "quarantined", "cause": self.cause, "first_position": str(self.first),
                "changes": self.changes, "bytes": self.nbytes}


@attrs.frozen
class Batch:
    """A run of whole transactions that moves through Extract, Transform and Load together.

    `id` counts acknowledged batches of the pipeline: after a rollback the batch
    that replaces a failed one gets the same id and a higher `epoch`. `start` is
    the acknowledged position the batch was read from; `end` is the position to
    acknowledge once the batch is applied, and where Select continues reading:
    the end of its last transaction, or a checkpoint inside a transaction
    delivered in pieces (`Position.row` > 0) when the batch ends with a piece.
    """

    pipeline: str
    id: int
    epoch: int
    start: Position
    end: Position
    changes: tuple[Change, ...]

    def __len__(self) -> int:
        return len(self.changes)

    def replace(self, changes: tuple[Change, ...]) -> "Batch":
        """The same batch with other changes (what Extract and Transform return)."""
        return attrs.evolve(self, changes=tuple(changes))

    @property
    def tables(self) -> tuple[str, ...]:
        """The qualified tables the batch touches, in first-touch order."""
        seen: dict[str, None] = {}
        for change in self.changes:
            seen.setdefault(change.qualified_table, None)
        return tuple(seen)

    def describe(self) -> str:
        """One line for logs: id, epoch, size and position range."""
        return f"batch {self.id} (epoch {self.epoch}, {len(self.changes)} changes, {self.start} -> {self.end})"


@attrs.frozen
class Ack:
    """A persisted acknowledgement: the pipeline has applied everything before `position`."""

    pipeline: str
    batch_id: int
    epoch: int
    position: Position
    time: float


@attrs.frozen
class ColumnSchema:
    """One column of a source table as the source declares it: name, the source's type as written
    (MySQL's ``COLUMN_TYPE`` in lower case except quoted members, e.g. ``int(10) unsigned``,
    ``decimal(12,2)``, ``enum('A','b')``) and nullability; and what target schema creation
    (`setl.schema`) needs besides:

    * `default`: the DEFAULT as SQL text the source would accept (``0``, ``'abc'``,
      ``current_timestamp()``), None when the column has none or its default is NULL;
    * `charset`, `collation`: of a character column, None otherwise;
    * `generated`: the expression of a generated (computed) column, None for a stored one;
    * `json`: a JSON document column (MySQL's JSON, or MariaDB's LONGTEXT checked by JSON_VALID);
    * `invisible`: left out of ``SELECT *`` and of an INSERT without a column list (MariaDB's
      ``INVISIBLE``, MySQL 8's ``INVISIBLE``).
    """

    name: str
    type: str
    nullable: bool = True
    default: str | None = None
    charset: str | None = None
    collation: str | None = None
    generated: str | None = None
    json: bool = False
    invisible: bool = False

    @property
    def base(self) -> str:
        """The type's name without arguments or attributes: ``int``, ``varchar``, ``enum``."""
        return self.type.split("(")[0].split()[0].lower() if self.type else ""

    @property
    def unsigned(self) -> bool:
        """Whether the column's type is UNSIGNED."""
        return " unsigned" in self.type.lower()

    @property
    def precision(self) -> tuple[int, ...]:
        """The type's numeric arguments: ``(12, 2)`` for ``decimal(12,2)``, ``(255,)`` for
        ``varchar(255)``, ``()`` without (or for ENUM and SET members)."""
        if self.base in ("enum", "set") or "(" not in self.type:
            return ()
        inside = self.type.split("(", 1)[1].split(")", 1)[0]
        return tuple(int(part) for part in inside.split(",") if part.strip().isdigit())


@attrs.frozen
class TableSchema:
    """A source table's columns before any row arrives (`setl.stages.select.Select.describe`):
    the columns in table order and the primary-key columns in key order."""

    table: TableName
    columns: tuple[ColumnSchema, ...]
    primary_key: tuple[str, ...] = ()
    partitioned: bool = False  # PARTITION BY on the source (its CREATE_OPTIONS say "partitioned")

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in table order."""
        return tuple(column.name for column in self.columns)
