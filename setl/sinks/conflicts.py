"""Conflicts of a two-way channel, detected, settled and recorded where a batch is applied (MySQL
target): a row changed on both sides before either change reached the other (docs/conflicts.md).

In the batch's transaction, before its rows are written (`ConflictStep.settle`, one step of
`setl.sinks.sql_load_path`): the target rows of the batch's keys are read locked, in one statement a
chunk of keys, and compared by the target server itself with the state the source had before the
batch (each key's FIRST before-image in the batch; "no row" where the batch first inserts it). A key
whose target row is that state takes the batch's change as usual. One whose row is already the
batch's LAST after-image needs nothing. Any other is a conflict, settled by the table's policy
(`decide`): the batch's version is written, or the target's row kept; either way it is written to the
conflicts table in the same transaction, counted (`counts`) and handed to the listeners (`subscribe`:
the node's alert). Comparisons run in SQL, column by column with ``<=>`` and a binary, no-pad
collation for text, against the same literals setl writes with: a float, a datetime with fractional
seconds, a decimal or NULL compares as the target stores it, and text that differs only in case or
trailing spaces is a difference (a conflict), never "equal" by a case-insensitive collation.

The batch's transaction runs REPEATABLE READ in a conflicts pipeline, so that the locking read also
locks the gap of a key found absent: no other session inserts it between the check and the write.
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from setl.errors import RefusedLoadError
from setl.model import Batch, DdlChange, Op, PartialImage, RowChange
from setl.sinks.merge import TableChanges
from setl.sinks.mysql_sql import quote, to_db

log = logging.getLogger(__name__)

LAST_WRITER_WINS, SITE_WINS, KEEP_TARGET = "last_writer_wins", "site_wins", "keep_target"
POLICIES = (LAST_WRITER_WINS, SITE_WINS, KEEP_TARGET)
#: The decisions: the batch's (the source's) version written, or the target's row kept.
SOURCE_WON, TARGET_WON = "source_won", "target_won"
#: Keys a conflicts statement checks at once (each is one branch of a UNION ALL).
CHUNK_KEYS = 200
#: The conflicts table, in the pipeline's position schema on the target.
TABLE = "setl_conflicts"


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: "No row": the state before a key's first insert in a batch, or after its last delete.
ABSENT: Any = _Marker("ABSENT")
#: Not checked: a snapshot read replaces what the target holds under its key.
ANY: Any = _Marker("ANY")


@attrs.frozen
class TablePolicy:
    """How one table's conflicts are settled: `policy`, its timestamp `column` (last writer wins),
    its winning `site` (site wins)."""

    policy: str
    column: str | None = None
    site: str | None = None


@attrs.frozen
class ConflictPolicy:
    """A pipeline's conflict settings as the load path uses them: `site` is the site its source is,
    `target_site` the other one; `sites` their priorities (the smaller number wins a tie of last
    writer wins); `default` and per target table (``schema.table``) `tables` policies."""

    site: str
    target_site: str | None
    sites: Mapping[str, int]
    default: TablePolicy
    tables: Mapping[str, TablePolicy] = attrs.Factory(dict)

    def of(self, table: str) -> TablePolicy:
        return self.tables.get(table, self.default)

    @classmethod
    def from_config(cls, settings: Any, site: str) -> ConflictPolicy:
        """From a validated ``conflicts:`` block (`setl.config.ConflictSettings`) and the pipeline's `site`."""
        others = [name for name in settings.sites if name != site]
        default = TablePolicy(settings.policy, settings.column, settings.site)
        tables = {name: TablePolicy(t.policy or default.policy, t.column or default.column, t.site or default.site)
                  for name, t in settings.tables.items()}
        return cls(site, others[0] if len(others) == 1 else None, dict(settings.sites), default, tables)


@attrs.frozen
class Conflict:
    """One conflict and its settlement, as recorded."""

    pipeline: str
    table: str
    key: tuple[Any, ...]
    policy: str
    decision: str
    reason: str
    source_site: str
    target_site: str | None
    source_before: Any  # the source's row before the batch (ABSENT: none)
    source_row: Any  # the batch's version (ABSENT: deleted)
    target_row: Any  # the target's row found (ABSENT: none)
    position: str


def decide(policy: TablePolicy, conflict_site: str, target_site: str | None, sites: Mapping[str, int],
           source_row: Any, target_row: Any, newer: int | None) -> tuple[str, str]:
    """(decision, reason) for a conflict. `newer` (last writer wins, both rows present): 1 if the
    source's timestamp is later than the target's, -1 if earlier, 0 if equal (NULL is earlier than
    any time). The same on both sides of a channel: last writer wins ranks (timestamp, site
    priority) and a delete over any update; site wins names one site; keep the target's row keeps
    each side's own (two sides that both keep their own rows stay different: docs/conflicts.md)."""
    if policy.policy == KEEP_TARGET:
        return TARGET_WON, "keep_target"
    if policy.policy == SITE_WINS:
        won = conflict_site == policy.site
        return (SOURCE_WON if won else TARGET_WON), f"site {policy.site} wins"
    if source_row is ABSENT:
        return SOURCE_WON, "a delete wins over an update"
    if target_row is ABSENT:
        return TARGET_WON, "a delete wins over an update"
    if newer is None:
        raise ValueError("last writer wins needs the timestamps compared")
    if newer:
        return (SOURCE_WON if newer > 0 else TARGET_WON), f"{policy.column} is later on the " + (
            "source" if newer > 0 else "target")
    mine, theirs = sites[conflict_site], sites[target_site] if target_site is not None else None
    if theirs is None or mine == theirs:
        raise ValueError("a tie of last writer wins needs two sites of different priorities")
    first = conflict_site if mine < theirs else target_site
    return (SOURCE_WON if mine < theirs else TARGET_WON), f"{policy.column} ties; site {first} has priority"


# -- what the whole process counted (the node's metrics, status and alerts read it)

_lock = threading.Lock()
_counts: Counter[tuple[str, str, str]] = Counter()
_listeners: list[Callable[[Conflict], None]] = []


def counts() -> dict[tuple[str, str, str], int]:
    """(pipeline, table, decision) -> conflicts settled (committed) since the process started."""
    with _lock:
        return dict(_counts)


def subscribe(listener: Callable[[Conflict], None]) -> Callable[[], None]:
    """Call `listener` with every conflict once its batch commits; returns the unsubscribe."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)
    return unsubscribe


def publish(found: Sequence[Conflict]) -> None:
    with _lock:
        for conflict in found:
            _counts[(conflict.pipeline, conflict.table, conflict.decision)] += 1
        listeners = list(_listeners)
    for conflict in found:
        for listener in listeners:
            try:
                listener(conflict)
            except Exception:  # a listener never fails a load
                log.exception("pipeline=%s conflict listener failed", conflict.pipeline)


# -- the batch's first before-images


def first_images(changes: Iterable[Any], pipeline: str) -> dict[tuple[str, str], dict[tuple[Any, ...], Any]]:
    """Per (schema, table), each key's state on the source before the changes the batch applies to
    it: the before-image of the first change of its last unbroken run, `ABSENT` where that change
    inserts it, `ANY` after a snapshot read. A run breaks where a change's before-image is not the
    previous change's after-image: the source applied the other site's version there (setl's own
    write, which the loop-back filter keeps out of the batch), and what came before is superseded.
    A partial image or a table without a primary key is refused: neither can be compared."""
    found: dict[tuple[str, str], dict[tuple[Any, ...], list[Any]]] = {}
    for change in changes:
        if isinstance(change, DdlChange) or not isinstance(change, RowChange):
            continue
        if change.sequence is not None:
            continue  # a sequence's state rows: written whole, never a conflict
        pk = change.primary_key
        if not pk:
            _refuse(change, pipeline, "the table has no primary key, so a conflict cannot be found; add a primary "
                    "key or exclude the table from the conflicts pipeline")
        if type(change.before) is PartialImage or type(change.after) is PartialImage:
            _refuse(change, pipeline, "the change holds a partial row image (binlog_row_image NOBLOB or MINIMAL in "
                    "the writing session), which cannot be compared; set binlog_row_image=FULL on the source")
        keys = found.setdefault((change.schema, change.table), {})
        before, after = change.before, change.after
        steps: list[tuple[tuple[Any, ...], Any, Any]] = []
        if change.op is Op.READ:
            steps.append((tuple(after[c] for c in pk), ANY, after))  # type: ignore[index]
        elif before is None:
            steps.append((tuple(after[c] for c in pk), ABSENT, after))  # type: ignore[index]
        else:
            old = tuple(before[c] for c in pk)
            new = None if after is None else tuple(after[c] for c in pk)
            if new is None or new == old:
                steps.append((old, before, ABSENT if after is None else after))
            else:
                steps.append((old, before, ABSENT))
                steps.append((new, ABSENT, after))
        for key, was, now in steps:
            state = keys.get(key)
            if state is None:
                keys[key] = [was, now]
            else:
                if was is ANY or not _same_image(state[1], was):
                    state[0] = was  # a new run: the source's state now is not what the batch left
                state[1] = now
    return {table: {key: state[0] for key, state in keys.items()} for table, keys in found.items()}


def _refuse(change: RowChange, pipeline: str, cause: str) -> None:
    raise RefusedLoadError(f"conflict detection refuses a {change.op.value} of {change.qualified_table}: {cause}",
                           pipeline=pipeline, stage="load", table=change.qualified_table,
                           position=change.position)


# -- the step


@attrs.define
class _Columns:
    """What the comparison needs of a target table: its columns' comparison expressions."""

    expressions: dict[str, str]  # lower-cased column -> SQL expression compared with a literal
    names: dict[str, str]  # lower-cased column -> its name
    #: lower-cased columns whose value as read back may not tell two stored values apart (FLOAT and
    #: DOUBLE are printed rounded; BIT, SET, ENUM, JSON and spatial values come back in other types)
    inexact: frozenset[str] = frozenset()


class ConflictStep:
    """The conflicts step of one MySQL sink: `begin` each batch's transaction, `settle` each table's
    merged changes before they are written, `after_commit` to publish what was settled."""

    def __init__(self, pipeline: str, policy: ConflictPolicy, schema: str) -> None:
        self.pipeline = pipeline
        self.policy = policy
        self.schema = schema
        self._ready = False
        self._columns: dict[tuple[str, str], _Columns] = {}
        self._pending = threading.local()

    # -- the transaction

    def begin(self, conn: Any) -> None:
        """Before the batch's first statement: make the conflicts table (once), and run the batch's
        transaction REPEATABLE READ (see the module)."""
        with conn.cursor() as cur:
            if not self._ready:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(self.schema)}")
                cur.execute(CONFLICTS_DDL.format(table=f"{quote(self.schema)}.{quote(TABLE)}"))
                conn.commit()
                self._ready = True
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        self._pending.found = []

    def after_commit(self) -> None:
        """The batch committed: count and publish its conflicts."""
        found = getattr(self._pending, "found", [])
        self._pending.found = []
        if found:
            publish(found)

    def forget(self) -> None:
        """After DDL: learn the tables' columns again."""
        self._columns.clear()

    # -- one table

    def settle(self, conn: Any, batch: Batch, table: TableChanges,
               expected: dict[tuple[str, str], dict[tuple[Any, ...], Any]]) -> TableChanges:
        """`table`'s changes without those whose conflict the target's row wins, every conflict
        written to the conflicts table. `expected`: `first_images` of the segment's changes."""
        if not table.primary_key:
            return table  # a sequence's state (keyless rows were refused by `first_images`)
        ident = (table.schema, table.table)
        name = f"{table.schema}.{table.table}"
        policy = self.policy.of(name)
        pk = table.primary_key
        firsts = expected.setdefault(ident, {})
        desired: dict[tuple[Any, ...], Any] = {}
        for image in table.deletes:
            desired[tuple(image[c] for c in pk)] = ABSENT
        for image in table.upserts:
            desired[tuple(image[c] for c in pk)] = image
        # A key the batch leaves as it found it (inserted and deleted again, or changed back) changes
        # nothing on the source: it is not written, lest it undo the target's own change of the row.
        unchanged = {key for key, want in desired.items() if _same_image(firsts.get(key, ANY), want)}
        keys = [key for key in desired if firsts.get(key, ANY) is not ANY and key not in unchanged]
        with conn.cursor() as cur:
            columns = self._table_columns(cur, table.schema, table.table)
            if policy.policy == LAST_WRITER_WINS and (policy.column or "").lower() not in columns.names:
                raise RefusedLoadError(f"conflicts: table {name} has no column {policy.column!r}, the timestamp "
                                       f"last writer wins compares; fix: add it, or set another column or policy "
                                       f"for the table", pipeline=self.pipeline, stage="load", table=name,
                                       position=batch.end)
            found = self._compare(cur, table, columns, policy, keys, firsts, desired)
        kept: set[tuple[Any, ...]] = set(unchanged)
        conflicts: list[Conflict] = []
        for key in keys:
            first, want = firsts[key], desired[key]
            row, same_before, same_after, newer = found.get(key, (ABSENT, first is ABSENT, want is ABSENT, None))
            if same_before or same_after:
                continue
            decision, reason = decide(policy, self.policy.site, self.policy.target_site, self.policy.sites,
                                      want, row, newer)
            if decision == TARGET_WON:
                kept.add(key)
            conflicts.append(Conflict(self.pipeline, name, key, policy.policy, decision, reason, self.policy.site,
                                      self.policy.target_site, first, want, row, str(batch.end)))
        if conflicts:
            self._record(conn, batch, conflicts)
        if not kept:
            return table
        return attrs.evolve(table, deletes=tuple(i for i in table.deletes if tuple(i[c] for c in pk) not in kept),
                            upserts=tuple(i for i in table.upserts if tuple(i[c] for c in pk) not in kept))

    def _table_columns(self, cur: Any, schema: str, table: str) -> _Columns:
        """How each column of the table compares exactly (read once per table, until `forget`)."""
        known = self._columns.get((schema, table))
        if known is not None:
            return known
        cur.execute("SELECT c.column_name, c.data_type, c.character_set_name, c.extra, "
                    "(SELECT MAX(l.collation_name) FROM information_schema.collations l "
                    " WHERE l.collation_name = CONCAT(c.character_set_name, '_nopad_bin')), "
                    "(SELECT MAX(l.collation_name) FROM information_schema.collations l "
                    " WHERE l.collation_name = CONCAT(c.character_set_name, '_bin')) "
                    "FROM information_schema.columns c WHERE c.table_schema = %s AND c.table_name = %s",
                    (schema, table))
        expressions, names, inexact = {}, {}, set()
        for column, data_type, charset, extra, nopad, binary in cur.fetchall():
            if "GENERATED" in str(extra).upper() or str(extra).upper() in ("ROW START", "ROW END"):
                continue  # computed by the server from the others: never written, never compared
            names[column.lower()] = column
            if str(data_type).lower() not in _EXACT_TYPES:
                inexact.add(column.lower())
            expression = quote(column)
            if charset:  # text: exact, case and trailing spaces included (CHAR is read without its padding)
                collation = binary if str(data_type).lower() == "char" else (nopad or binary)
                if collation:
                    expression = f"{expression} COLLATE {collation}"
            expressions[column.lower()] = expression
        found = _Columns(expressions, names, frozenset(inexact))
        if names:
            self._columns[(schema, table)] = found
        return found

    def _compare(self, cur: Any, table: TableChanges, columns: _Columns, policy: TablePolicy,
                 keys: Sequence[tuple[Any, ...]], firsts: Mapping[tuple[Any, ...], Any],
                 desired: Mapping[tuple[Any, ...], Any]) -> dict[tuple[Any, ...], tuple[Any, bool, bool, int | None]]:
        """Key -> (the target's row, whether it is the first before-image, whether it is the batch's
        last after-image, `decide`'s `newer`), for the keys the target has a row of; locked to COMMIT.

        The rows are read locked first, a chunk of keys a statement, and compared here where that
        is exact (`_py_same`: a column type whose value read back is the stored value, equal in
        type and value to the image's); the keys left (a difference, or a value that cannot be
        compared here) are compared by the server (`_server_compare`)."""
        literal = cur.connection.escape
        name = f"{quote(table.schema)}.{quote(table.table)}"
        pk = table.primary_key
        read = list(columns.names.values())
        select = ", ".join(quote(c) for c in read)
        at = [read.index(columns.names[c.lower()]) for c in pk]
        found: dict[tuple[Any, ...], tuple[Any, bool, bool, int | None]] = {}
        suspects: list[tuple[Any, ...]] = []
        for start in range(0, len(keys), CHUNK_KEYS):
            part = keys[start:start + CHUNK_KEYS]
            if len(pk) == 1:
                where = f"{quote(pk[0])} IN ({', '.join(literal(to_db(k[0])) for k in part)})"
            else:
                where = (f"({', '.join(quote(c) for c in pk)}) IN ("
                         + ", ".join("(" + ", ".join(literal(to_db(v)) for v in k) + ")" for k in part) + ")")
            cur.execute(f"SELECT {select} FROM {name} WHERE {where} FOR UPDATE")
            rows = {tuple(row[i] for i in at): dict(zip(read, row)) for row in cur.fetchall()}
            wanted = set(part)
            if any(key not in wanted for key in rows):  # a key the target's collation matches otherwise
                suspects.extend(part)
                continue
            for key in part:
                row = rows.get(key)
                first, want = firsts[key], desired[key]
                if row is None:
                    found[key] = (ABSENT, first is ABSENT, want is ABSENT, None)
                elif _py_same(row, first, columns):
                    found[key] = (row, True, False, None)
                elif _py_same(row, want, columns):
                    found[key] = (row, False, True, None)
                else:
                    suspects.append(key)
        if suspects:
            found.update(self._server_compare(cur, table, columns, policy, suspects, firsts, desired))
        return found

    def _server_compare(self, cur: Any, table: TableChanges, columns: _Columns, policy: TablePolicy,
                        keys: Sequence[tuple[Any, ...]], firsts: Mapping[tuple[Any, ...], Any],
                        desired: Mapping[tuple[Any, ...], Any]) -> dict[tuple[Any, ...],
                                                                          tuple[Any, bool, bool, int | None]]:
        """`_compare` of `keys` by the server: a UNION ALL of one locked single-key SELECT per key,
        each comparing the row with both images column by column (`<=>`, text in a binary no-pad
        collation) and, for last writer wins, the timestamps."""
        literal = cur.connection.escape
        name = f"{quote(table.schema)}.{quote(table.table)}"
        pk = table.primary_key
        read = [c for c in columns.names.values()]
        select = ", ".join(quote(c) for c in read)
        stamp = columns.expressions.get((policy.column or "").lower()) if policy.policy == LAST_WRITER_WINS else None

        def same(image: Any) -> str:
            if image is ABSENT or image is ANY:
                return "0"
            parts = [f"{columns.expressions[c.lower()]} <=> {literal(to_db(v))}" for c, v in image.items()
                     if c.lower() in columns.expressions]
            return "(" + " AND ".join(parts or ["1"]) + ")"

        def newer(image: Any) -> str:
            if stamp is None or image is ABSENT:
                return "NULL"
            value = next((v for c, v in image.items() if c.lower() == (policy.column or "").lower()), None)
            mine = literal(to_db(value))
            return (f"CASE WHEN {stamp} <=> {mine} THEN 0 WHEN {stamp} IS NULL THEN 1 WHEN {mine} IS NULL THEN -1 "
                    f"WHEN {mine} > {stamp} THEN 1 ELSE -1 END")

        found: dict[tuple[Any, ...], tuple[Any, bool, bool, int | None]] = {}
        for start in range(0, len(keys), CHUNK_KEYS):
            part = keys[start:start + CHUNK_KEYS]
            branches = []
            for n, key in enumerate(part):
                where = " AND ".join(f"{quote(c)} = {literal(to_db(v))}" for c, v in zip(pk, key))
                branches.append(f"(SELECT {n}, {same(firsts[key])}, {same(desired[key])}, {newer(desired[key])}, "
                                f"{select} FROM {name} WHERE {where} FOR UPDATE)")
            cur.execute(" UNION ALL ".join(branches))  # no parameters: sent as it is
            for row in cur.fetchall():
                key = part[row[0]]
                found[key] = (dict(zip(read, row[4:])), bool(row[1]), bool(row[2]),
                              None if row[3] is None else int(row[3]))
        return found

    def _record(self, conn: Any, batch: Batch, conflicts: Sequence[Conflict]) -> None:
        """The conflicts, one row each, in the batch's transaction; published after its COMMIT."""
        rows = [(c.pipeline, c.table, _json(list(c.key)), c.source_site, c.target_site, c.policy, c.decision,
                 c.reason, _json(c.source_before), _json(c.source_row), _json(c.target_row), c.position, batch.id)
                for c in conflicts]
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {quote(self.schema)}.{quote(TABLE)} (pipeline, table_name, row_key, "
                            "source_site, target_site, policy, decision, reason, source_before, source_row, "
                            "target_row, position, batch) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            rows)
        for c in conflicts:
            log.warning("pipeline=%s stage=load table=%s position=%s conflict on key %s: %s (%s, %s)", c.pipeline,
                        c.table, c.position, list(c.key), c.decision, c.policy, c.reason)
        self._pending.found = [*getattr(self._pending, "found", []), *conflicts]


CONFLICTS_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  detected_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  pipeline VARCHAR(255) NOT NULL,
  table_name VARCHAR(512) NOT NULL,
  row_key LONGTEXT NOT NULL,
  source_site VARCHAR(255) NULL,
  target_site VARCHAR(255) NULL,
  policy VARCHAR(32) NOT NULL,
  decision VARCHAR(16) NOT NULL,
  reason VARCHAR(255) NOT NULL,
  source_before LONGTEXT NULL,
  source_row LONGTEXT NULL,
  target_row LONGTEXT NULL,
  position VARCHAR(255) NOT NULL,
  batch BIGINT NOT NULL,
  KEY by_table (pipeline, table_name(191))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""


#: Column types whose value PyMySQL reads back is the stored value itself, so that equal Python
#: values of the same type mean equal stored values (text: exactly, case and spaces included).
_EXACT_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "date", "datetime",
                          "time", "year", "char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                          "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
_EXACT_VALUES = (int, str, bytes, decimal.Decimal, datetime.datetime, datetime.date, datetime.timedelta)


def _py_same(row: Mapping[str, Any], image: Any, columns: _Columns) -> bool:
    """Whether the target's `row` is `image`, where that can be told here for sure; False also
    when it cannot (the server then compares). Only the image's columns the table has count."""
    if image is ABSENT or image is ANY:
        return False
    for column, value in image.items():
        lower = column.lower()
        if lower not in columns.names:
            continue
        if lower in columns.inexact:
            return False
        mine = row[columns.names[lower]]
        if value is None or mine is None:
            if value is not mine:
                return False
            continue
        if type(value) is not type(mine) or not isinstance(value, _EXACT_VALUES) or value != mine:
            return False
    return True


def _same_image(first: Any, want: Any) -> bool:
    """Whether a key's state before the batch and after it are the same (both images from the source)."""
    if first is ANY or want is ANY:
        return first is want
    if first is ABSENT or want is ABSENT:
        return first is want
    return dict(first) == dict(want)


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    return str(value)


def _json(image: Any) -> str | None:
    """A row version as JSON (None: no row)."""
    if image is ABSENT or image is ANY:
        return None
    return json.dumps(image, default=_plain, ensure_ascii=False, sort_keys=False)


__all__ = ["ABSENT", "ANY", "Conflict", "ConflictPolicy", "ConflictStep", "TablePolicy", "counts", "decide",
           "first_images", "subscribe"]
