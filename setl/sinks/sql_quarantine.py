"""Quarantined tables of an SQL target (issue 37, docs/quarantine.md): a table whose change the target
refused is marked with its cause and first position, and its later changes are kept in order, with
their positions, on the target itself, in the batch's transaction (`QuarantineStore`).

Two setl-owned tables sit next to the position table: ``<position_table>_quarantine`` (one row per
quarantined target table: cause, first position, changes kept and their bytes) and
``<position_table>_kept`` (the kept changes, numbered in stream order). A change is kept as the
pickled `setl.model.RowChange` or `DdlChange` it was: its full images, types included, come back
exactly at replay. A row of the kept table holds a *run*: up to `_RUN_ROWS` consecutive row changes
of one batch (about `_RUN_BYTES` at most) in one pickle, numbered up to its ``seq`` and placed at its
first change's position; a DDL is always a row of its own. One row a change cost the target an
InnoDB insert of a wide key and setl a pickle and a hex literal each (the quarantine bench's other
tables ran at 0.73-0.86x of none); a row a run costs about one each a batch.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import attrs

from setl.errors import LoadError
from setl.model import Change, Op, Position, Quarantined, RowChange, TableName

C = TypeVar("C")  # a driver connection


def _backticks(name: str) -> str:
    return "`" + name.replace("`", "``").replace("%", "%%") + "`"


def _double_quotes(name: str) -> str:
    return '"' + name.replace('"', '""').replace("%", "%%") + '"'


#: Per dialect: how an identifier is quoted (for a %s-parameterised statement), the binary column
#: type, what follows CREATE TABLE.
_DIALECTS: dict[str, tuple[Callable[[str], str], str, str]] = {
    "mysql": (_backticks, "LONGBLOB", " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"),
    "postgresql": (_double_quotes, "bytea", ""),
}


_ROW = "row-1"  # the kept form of a RowChange (its fields as a tuple: pickling the attrs object is 5x slower)
_RUN = "run-1"  # the kept form of a run of RowChanges (a list of their fields, in one pickle)
#: row changes in one row of the kept table at most
_RUN_ROWS = 1000
#: a run of a pickle larger than this is cut in two (MariaDB's max_allowed_packet is 16 MiB by default)
_RUN_BYTES = 1 << 20


def _fields(change: RowChange) -> tuple[Any, ...]:
    at, source = change.position, change.source
    return (change.op.value, change.schema, change.table, change.primary_key, change.before, change.after,
            None if at is None else (at.log, at.offset, at.gtid, at.row), change.commit_time,
            None if source is None else (source.schema, source.table), change.sequence)


def _row_change(fields: Sequence[Any]) -> RowChange:
    op, schema, table, key, before, after, at, commit_time, source, sequence = fields
    return RowChange(Op(op), schema, table, tuple(key), before, after,
                     None if at is None else Position(at[0], at[1], at[2], row=at[3]), commit_time,
                     None if source is None else TableName(*source), sequence=sequence)


def encode(change: Change) -> bytes:
    """A change as kept: a RowChange's fields as a tuple, anything else (a DDL) pickled as it is."""
    if type(change) is RowChange:
        return pickle.dumps((_ROW, *_fields(change)), protocol=5)
    return pickle.dumps(change, protocol=5)


def encode_runs(changes: Sequence[Change]) -> list[tuple[int, bytes]]:
    """`changes` (in stream order) as the kept table's rows, each (how many changes, its blob):
    consecutive row changes together, at most `_RUN_ROWS` and about `_RUN_BYTES` a row (a longer
    pickle is cut in two until it fits or holds one change); anything else (a DDL) alone."""
    runs: list[tuple[int, bytes]] = []
    start, count = 0, len(changes)
    while start < count:
        if type(changes[start]) is not RowChange:
            runs.append((1, encode(changes[start])))
            start += 1
            continue
        end = start + 1
        while end < count and end - start < _RUN_ROWS and type(changes[end]) is RowChange:
            end += 1
        runs.extend(_packed(changes[start:end]))
        start = end
    return runs


def _packed(rows: Sequence[Change]) -> list[tuple[int, bytes]]:
    blob = _packed_whole(rows)
    if len(rows) == 1 or len(blob) <= _RUN_BYTES:
        return [(len(rows), blob)]
    half = len(rows) // 2
    return _packed(rows[:half]) + _packed(rows[half:])


def _packed_whole(changes: Sequence[Change]) -> bytes:
    """`changes` (the rest of one run, or one DDL) as one row's blob, however large."""
    if len(changes) == 1:
        return encode(changes[0])
    return pickle.dumps((_RUN, [_fields(change) for change in changes]), protocol=5)  # type: ignore[arg-type]


def decode(blob: bytes) -> Change:
    """The change `encode` kept, the same in every field. A DDL kept by an earlier build, whose class
    had fewer fields, comes back with those fields at their defaults (`_completed`)."""
    value = pickle.loads(blob)
    if type(value) is tuple and value and value[0] == _ROW:
        return _row_change(value[1:])
    return _completed(value)


def decode_run(blob: bytes) -> list[Change]:
    """The changes of one row of the kept table, in order: a run (`encode_runs`), or one change as
    `encode` kept it (by this build or an earlier one, which kept a change a row)."""
    value = pickle.loads(blob)
    if type(value) is tuple and value and value[0] == _RUN:
        return [_row_change(fields) for fields in value[1]]
    if type(value) is tuple and value and value[0] == _ROW:
        return [_row_change(value[1:])]
    return [_completed(value)]


def _completed(value: Any) -> Any:
    """`value`, and the attrs values among its fields, with each field that unpickling left unset (the
    class gained it after `value` was kept: attrs' ``__setstate__`` sets only the fields the state
    holds) set to its default, in field order (a ``takes_self`` factory sees the fields before it).
    A missing field without a default is an error naming it: that change cannot come back exactly."""
    if not attrs.has(type(value)):
        return value
    for field in attrs.fields(type(value)):
        try:
            _completed(getattr(value, field.name))
            continue
        except AttributeError:
            pass
        default = field.default
        if default is attrs.NOTHING:
            raise LoadError(f"a kept change ({type(value).__name__}) lacks field {field.name!r}, which has no "
                            "default: it was kept by an incompatible build of setl; re-copy the table "
                            "(`setl snapshot --table`)", stage="load")
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory(value) if default.takes_self else default.factory()
        object.__setattr__(value, field.name, default)
    return value


@attrs.frozen
class KeptChange:
    """A change kept for a quarantined table, with its number in the table's stream, the number of
    its row of the kept table (`row`: its run's last change's) and, on a row's last change only,
    that row's bytes (`nbytes`, 0 on the others: the sum over whole rows is what they hold)."""

    seq: int
    change: Change
    nbytes: int
    row: int


class QuarantineFull(LoadError):
    """What may be kept for quarantined tables (``pipeline.quarantine.max_rows`` / ``max_bytes``) is
    reached: the pipeline pauses, nothing is dropped."""

    retryable = False


class QuarantineEnded(LoadError):
    """A table this sink knew quarantined is not any more on the target (a replay or a re-copy by
    another process ended it): the batch is loaded again, the quarantined tables read afresh."""

    retryable = False


#: kept rows per INSERT statement (MariaDB; PostgreSQL takes them all in one COPY)
_KEEP_ROWS = 1000
#: a kept INSERT stops adding rows past this size (MariaDB's max_allowed_packet is 16 MiB by default)
_KEEP_BYTES = 1 << 20
#: a larger kept row goes as the driver escapes it, not as a hex literal (twice its size)
_HEX_BYTES = 1 << 16
_NOWHERE = Position("", 0)


class QuarantineStore(Generic[C]):
    """The quarantine and kept tables of one pipeline (see the module). Every method runs in the
    caller's open transaction and neither commits nor rolls back, except `create_tables`.

    `quote` quotes an identifier for the target; `blob` is its binary column type. The SQL is the
    same for MariaDB and PostgreSQL otherwise (``%s`` placeholders in both drivers).
    """

    def __init__(self, *, pipeline: str, schema: str, table: str, dialect: str, max_rows: int,
                 max_bytes: int) -> None:
        """`dialect`: mysql or postgresql; `table`: the position table (the tables are named after it);
        `max_rows`, `max_bytes`: what may be kept in all for one table before the pipeline pauses."""
        self.pipeline = pipeline
        self.dialect = dialect
        self.schema, self.table = schema, table
        #: whether the tables exist (`create_tables`); without them nothing can be quarantined
        self.available = False
        quote, self.blob, self._options = _DIALECTS[dialect]
        self._q = quote
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.marks = f"{quote(schema)}.{quote(table + '_quarantine')}"
        self.kept = f"{quote(schema)}.{quote(table + '_kept')}"
        self.fence = f"{quote(schema)}.{quote(table + '_fence')}"

    @staticmethod
    def supports(dialect: str) -> bool:
        """Whether a target of `dialect` can keep a quarantine."""
        return dialect in _DIALECTS

    def _columns(self) -> str:
        q = self._q
        return f"{q('log')} VARCHAR(512) NOT NULL, {q('offset')} BIGINT NOT NULL, {q('row')} BIGINT NOT NULL,"

    def create_tables(self, conn: Any) -> None:
        """Create both tables where missing (the position schema exists already), each committed; a
        concurrent creator's win is taken. Raises when one is missing and cannot be created (the
        account may not create tables in the position schema): `available` stays False."""
        q = self._q
        for name, table, columns in (
                (self.table + "_quarantine", self.marks,
                 f"{q('pipeline')} VARCHAR(191) NOT NULL, {q('target_table')} VARCHAR(400) NOT NULL,"
                 f" {q('cause')} TEXT NOT NULL, {self._columns()} {q('changes')} BIGINT NOT NULL,"
                 f" {q('nbytes')} BIGINT NOT NULL, PRIMARY KEY ({q('pipeline')}, {q('target_table')})"),
                (self.table + "_kept", self.kept,
                 f"{q('pipeline')} VARCHAR(191) NOT NULL, {q('target_table')} VARCHAR(400) NOT NULL,"
                 f" {q('seq')} BIGINT NOT NULL, {self._columns()} {q('change')} {self.blob} NOT NULL,"
                 f" PRIMARY KEY ({q('pipeline')}, {q('target_table')}, {q('seq')})")):
            if self._exists(conn, name):
                continue
            try:
                with conn.cursor() as cur:
                    cur.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns}){self._options}")
                conn.commit()
            except Exception:
                conn.rollback()
                if not self._exists(conn, name):  # not a concurrent creator's win
                    raise
        self.available = True

    def _exists(self, conn: Any, name: str) -> bool:
        """Whether table `name` of the position schema exists (read only, committed)."""
        with conn.cursor() as cur:
            if self.dialect == "postgresql":
                cur.execute("SELECT to_regclass(%s) IS NOT NULL",
                            (f"{_double_quotes(self.schema)}.{_double_quotes(name)}".replace("%%", "%"),))
            else:
                cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s"
                            " AND TABLE_NAME = %s", (self.schema, name))
            row = cur.fetchone()
        conn.commit()
        return bool(row and row[0])

    def read(self, conn: Any) -> dict[str, Quarantined]:
        """The pipeline's quarantined tables. In a batch's transaction it is read after the fence row
        is held shared: a replay holds that row exclusively (`lock_loads`), so no batch reads a
        quarantine a replay is ending."""
        q = self._q
        with conn.cursor() as cur:
            cur.execute(f"SELECT {q('target_table')}, {q('cause')}, {q('log')}, {q('offset')}, {q('row')},"
                        f" {q('changes')}, {q('nbytes')} FROM {self.marks} WHERE {q('pipeline')} = %s",
                        (self.pipeline,))
            rows = cur.fetchall()
        return {str(r[0]): Quarantined(str(r[0]), str(r[1]), Position(str(r[2]), int(r[3]), row=int(r[4])),
                                       int(r[5]), int(r[6])) for r in rows}

    def mark(self, conn: Any, table: str, cause: str, first: Position) -> None:
        """`table` is quarantined from `first` on, for `cause` (nothing kept yet)."""
        q = self._q
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {self.marks} ({q('pipeline')}, {q('target_table')}, {q('cause')}, {q('log')},"
                        f" {q('offset')}, {q('row')}, {q('changes')}, {q('nbytes')}) VALUES (%s, %s, %s, %s, %s, %s,"
                        f" 0, 0)", (self.pipeline, table, cause[:4000], first.log, first.offset, first.row))

    def last_seqs(self, conn: Any) -> dict[str, int]:
        """The highest number kept per quarantined table of the pipeline (tables with none kept: absent)."""
        q = self._q
        with conn.cursor() as cur:
            cur.execute(f"SELECT {q('target_table')}, MAX({q('seq')}) FROM {self.kept} WHERE {q('pipeline')} = %s"
                        f" GROUP BY {q('target_table')}", (self.pipeline,))
            rows = cur.fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def keep(self, conn: Any, found: Quarantined, changes: Sequence[Change], *,
             context: dict[str, Any], last_seq: int | None = None,
             runs: Sequence[tuple[int, bytes]] | None = None) -> Quarantined:
        """Append `changes` (in stream order) to what is kept for `found`'s table, numbered after
        `last_seq` (None: read from the kept table); the record as it is then, counted from `found`'s.
        `runs`: the changes already `encode_runs`d (ahead, on a worker), else encoded here. The mark's
        counts are raised relative to what the target holds (a replay elsewhere may have lowered
        them), and only within the bound, in one statement; then the runs go in as multi-row
        INSERTs (`_insert_kept`). `QuarantineFull` when the pipeline's bound would be passed,
        `QuarantineEnded` when the table is no longer quarantined on the target (a replay or a
        re-copy ended it since `found` was read); nothing is written then."""
        q = self._q
        if runs is None or sum(count for count, _ in runs) != len(changes):
            runs = encode_runs(changes)
        count, size = len(changes), sum(len(blob) for _, blob in runs)
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {self.marks} SET {q('changes')} = {q('changes')} + %s, {q('nbytes')} = {q('nbytes')}"
                        f" + %s WHERE {q('pipeline')} = %s AND {q('target_table')} = %s AND {q('changes')} + %s <= %s"
                        f" AND {q('nbytes')} + %s <= %s",
                        (count, size, self.pipeline, found.table, count, self.max_rows, size, self.max_bytes))
            if cur.rowcount != 1:
                self._not_kept(cur, found, count, size, context)
            if last_seq is None:
                cur.execute(f"SELECT COALESCE(MAX({q('seq')}), 0) FROM {self.kept} WHERE {q('pipeline')} = %s"
                            f" AND {q('target_table')} = %s", (self.pipeline, found.table))
                row = cur.fetchone()
                last_seq = int(row[0]) if row else 0
            self._insert_kept(cur, found.table, last_seq, changes, runs)
        return attrs.evolve(found, changes=found.changes + count, nbytes=found.nbytes + size)

    def _insert_kept(self, cur: Any, table: str, last_seq: int, changes: Sequence[Change],
                     runs: Sequence[tuple[int, bytes]]) -> None:
        """The kept rows, one a run, each numbered by its last change (from `last_seq` + 1 on) and
        placed at its first change's position. MariaDB: multi-row INSERTs of at most `_KEEP_ROWS` rows
        and about `_KEEP_BYTES` each, the values written into the statement (each distinct string
        escaped once by the driver, a run as a hex literal, or escaped by the driver when large), so
        the driver does not escape 7 parameters per row. PostgreSQL: one ``COPY`` of all of them (no
        statement to parse and no placeholders for the driver to convert)."""
        q = self._q
        columns = (f"({q('pipeline')}, {q('target_table')}, {q('seq')}, {q('log')}, {q('offset')}, {q('row')},"
                   f" {q('change')})")
        rows: list[tuple[int, Position, bytes]] = []  # (seq, position, blob) of each kept row
        first = 0
        for number, blob in runs:
            rows.append((last_seq + first + number, changes[first].position or _NOWHERE, blob))
            first += number
        if self.dialect != "mysql":  # one COPY: a multi-row INSERT's 7000 placeholders cost psycopg more than the rows
            # not a %s-formatted statement: the names' `%%` are `%` again
            with cur.copy(f"COPY {self.kept} {columns} FROM STDIN".replace("%%", "%")) as copy:
                for seq, at, blob in rows:
                    copy.write_row((self.pipeline, table, seq, at.log, at.offset, at.row, blob))
            return

        def literal(value: Any) -> str:  # the driver's escaping, `%` doubled for the statement's formatting
            return str(cur.mogrify("%s", (value,))).replace("%", "%%")

        head = f"INSERT INTO {self.kept} {columns} VALUES "
        fixed = f"({literal(self.pipeline)}, {literal(table)}, "
        logs: dict[str, str] = {}
        start = 0
        while start < len(rows):
            values: list[str] = []
            end, size = start, 0
            while end < len(rows) and end - start < _KEEP_ROWS and (size < _KEEP_BYTES or end == start):
                seq, at, blob = rows[end]
                log = logs.get(at.log)
                if log is None:
                    log = logs[at.log] = literal(at.log)
                value = f"X'{blob.hex()}'" if len(blob) <= _HEX_BYTES else literal(blob)
                values.append(f"{fixed}{seq:d}, {log}, {int(at.offset):d}, {int(at.row):d}, {value})")
                size += len(value)
                end += 1
            cur.execute(head + ", ".join(values), ())  # () formats the statement: `%%` in names becomes `%`
            start = end

    def _not_kept(self, cur: Any, found: Quarantined, count: int, size: int, context: dict[str, Any]) -> None:
        """Why `keep`'s raise of the mark's counts matched no row: the table's quarantine ended
        (`QuarantineEnded`), or the bound would be passed (`QuarantineFull`)."""
        q = self._q
        cur.execute(f"SELECT {q('changes')}, {q('nbytes')} FROM {self.marks} WHERE {q('pipeline')} = %s"
                    f" AND {q('target_table')} = %s", (self.pipeline, found.table))
        row = cur.fetchone()
        if row is None:
            raise QuarantineEnded(f"the quarantine of {found.table} ended on the target meanwhile (a replay or a "
                                  f"re-copy): the batch is loaded again with the quarantined tables read afresh",
                                  **context)
        changes, nbytes = int(row[0]) + count, int(row[1]) + size
        raise QuarantineFull(
            f"quarantined table {found.table} would keep {changes} changes ({nbytes} bytes), above "
            f"pipeline.quarantine max_rows {self.max_rows} / max_bytes {self.max_bytes}: paused, nothing "
            f"dropped; fix the cause ({found.cause}) and run `setl resume --pipeline {self.pipeline} "
            f"--table {found.table}`, or `setl snapshot`, or raise the bound", **context)

    def lock_loads(self, conn: Any) -> int | None:
        """Hold the pipeline's fence row exclusively to COMMIT: no batch of the pipeline commits
        meanwhile (each holds it shared, `setl.sinks.sql_fence`). Its epoch (None: no fence yet)."""
        q = self._q
        with conn.cursor() as cur:
            cur.execute(f"SELECT {q('epoch')} FROM {self.fence} WHERE {q('pipeline')} = %s FOR UPDATE",
                        (self.pipeline,))
            row = cur.fetchone()
        return int(row[0]) if row else None

    def first_kept(self, conn: Any, table: str, limit: int) -> list[KeptChange]:
        """The changes of the first kept rows of `table`, in stream order: whole rows, the first one
        and those numbered below its number + `limit` (so at most `limit` changes and one row's more)."""
        q = self._q
        where = f"{q('pipeline')} = %s AND {q('target_table')} = %s"
        with conn.cursor() as cur:
            cur.execute(f"SELECT {q('seq')}, {q('change')} FROM {self.kept} WHERE {where} AND {q('seq')} < %s +"
                        f" (SELECT MIN({q('seq')}) FROM {self.kept} WHERE {where}) ORDER BY {q('seq')}",
                        (self.pipeline, table, int(limit), self.pipeline, table))
            rows = cur.fetchall()
        kept: list[KeptChange] = []
        for seq, blob in rows:
            changes = decode_run(bytes(blob))
            row, first = int(seq), int(seq) - len(changes) + 1
            kept.extend(KeptChange(first + i, change, len(blob) if first + i == row else 0, row)
                        for i, change in enumerate(changes))
        return kept

    def drop_kept(self, conn: Any, found: Quarantined, kept: Sequence[KeptChange], applied: int) -> Quarantined:
        """Forget the first `applied` of `kept` (whole rows, as `first_kept` read them) for `found`'s
        table: they are applied. A row applied in part keeps the rest of its changes, written again
        under its number at its new first change's position."""
        q = self._q
        done, rest = kept[:applied], kept[applied:]
        freed = sum(k.nbytes for k in done)  # the rows applied whole (a row's bytes are on its last change)
        with conn.cursor() as cur:
            if done and rest and rest[0].row == done[-1].row:  # the run of done's last change goes on in rest
                row = done[-1].row
                left = [k for k in rest if k.row == row]
                blob = _packed_whole([k.change for k in left])
                freed += left[-1].nbytes - len(blob)
                at = left[0].change.position or _NOWHERE
                cur.execute(f"UPDATE {self.kept} SET {q('change')} = %s, {q('log')} = %s, {q('offset')} = %s,"
                            f" {q('row')} = %s WHERE {q('pipeline')} = %s AND {q('target_table')} = %s AND"
                            f" {q('seq')} = %s", (blob, at.log, at.offset, at.row, self.pipeline, found.table, row))
            if done:
                cur.execute(f"DELETE FROM {self.kept} WHERE {q('pipeline')} = %s AND {q('target_table')} = %s AND"
                            f" {q('seq')} <= %s", (self.pipeline, found.table, done[-1].seq))
            left_record = attrs.evolve(found, changes=found.changes - len(done), nbytes=found.nbytes - freed)
            cur.execute(f"UPDATE {self.marks} SET {q('changes')} = %s, {q('nbytes')} = %s WHERE {q('pipeline')} = %s"
                        f" AND {q('target_table')} = %s",
                        (left_record.changes, left_record.nbytes, self.pipeline, found.table))
        return left_record

    def release(self, conn: Any, table: str) -> None:
        """`table` is no longer quarantined; what is kept for it is dropped."""
        q = self._q
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {self.kept} WHERE {q('pipeline')} = %s AND {q('target_table')} = %s",
                        (self.pipeline, table))
            cur.execute(f"DELETE FROM {self.marks} WHERE {q('pipeline')} = %s AND {q('target_table')} = %s",
                        (self.pipeline, table))




class Quarantine(Generic[C]):
    """One sink's quarantine: its store, what this sink knows of the quarantined tables (`known`),
    and the tables refused in a transaction that was rolled back (`refused`), to mark in the next
    one. Safe for the sink's threads (a refusal is recorded by the thread whose transaction failed;
    the set is only read and emptied in a transaction).

    The set is read from the target once per fence epoch (`known`: at the first batch, and after
    any takeover, when another node may have changed it). Only this sink's own batches add to it
    while it holds the fence: each that changes it installs the result after its COMMIT (`settle`,
    `committed`), and a transaction that fails after changing it leaves it unknown, read again at the
    next batch. So a pipeline with no quarantined table sends no quarantine statement per batch.
    While some table is quarantined, each batch reads the marks again (a replay elsewhere lowers
    their counts and ends them); a replay that ends one between that read and the keep is seen by
    `QuarantineStore.keep` (the mark is gone: `QuarantineEnded`, the batch loaded again)."""

    def __init__(self, store: QuarantineStore[C]) -> None:
        self.store = store
        self._refused: dict[str, str] = {}
        self._view: dict[str, Quarantined] = {}
        self._lock = threading.Lock()
        #: the quarantined tables and their last kept numbers as of fence epoch `_epoch`; None: unknown
        self._known: tuple[dict[str, Quarantined], dict[str, int]] | None = None
        self._epoch = 0
        self._settled: tuple[dict[str, Quarantined], dict[str, int]] | None = None
        #: the times the set was read from the target in a batch transaction (tests and benchmarks)
        self.reads = 0

    def known(self, conn: C, epoch: int) -> tuple[dict[str, Quarantined], dict[str, int]]:
        """In a batch transaction holding the fence of `epoch`: the quarantined tables and the last
        number kept for each (see the class). None quarantined as known: no I/O. Some: their marks
        are read again (one statement, after the fence), so a replay elsewhere that ended one or kept
        fewer shows at once; the numbers stay known (a replay drops the first ones only)."""
        with self._lock:
            self._settled = None
            known = self._known if self._known is not None and self._epoch == epoch else None
        if known is not None and not known[0]:
            return {}, {}
        found = self.store.read(conn)
        if known is not None and found.keys() <= known[0].keys():
            seqs = {name: seq for name, seq in known[1].items() if name in found}
        else:
            seqs = self.store.last_seqs(conn)
        with self._lock:
            self.reads += 1
            self._known, self._epoch = (dict(found), dict(seqs)), epoch
        return found, seqs

    def settle(self, found: dict[str, Quarantined], seqs: dict[str, int]) -> None:
        """The open transaction changes the set (or what is kept) to `found`, `seqs`: unknown until
        its COMMIT (`committed`), unknown for good if it fails."""
        with self._lock:
            self._known = None
            self._settled = (dict(found), dict(seqs))

    def committed(self, epoch: int) -> None:
        """The batch transaction that `settle`d (if any) committed, holding the fence of `epoch`."""
        with self._lock:
            if self._settled is not None:
                self._known, self._epoch, self._settled = self._settled, epoch, None

    def forget(self) -> None:
        """Read the set from the target at the next batch (it may have changed elsewhere)."""
        with self._lock:
            self._known = self._settled = None

    def seen(self, found: dict[str, Quarantined]) -> None:
        """What a batch transaction found and kept (the view `view` gives, no I/O)."""
        with self._lock:
            self._view = dict(found)

    def view(self) -> list[Quarantined]:
        """The quarantined tables as the last batch transaction saw them (a replay that ended since
        shows at the next batch)."""
        with self._lock:
            return [self._view[name] for name in sorted(self._view)]

    def refuse(self, table: str, cause: str) -> bool:
        """Quarantine `table` for `cause` in the next transaction; False when it was refused already
        and is still waiting (its refusal is then not one quarantine can answer)."""
        with self._lock:
            if table in self._refused:
                return False
            self._refused[table] = cause
            return True

    def refused(self) -> dict[str, str]:
        with self._lock:
            return dict(self._refused)

    def marked(self, table: str) -> None:
        """`table`'s quarantine is written in the open transaction."""
        with self._lock:
            self._refused.pop(table, None)


__all__ = ["KeptChange", "Quarantine", "Quarantined", "QuarantineEnded", "QuarantineFull", "QuarantineStore"]
