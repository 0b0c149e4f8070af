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
import hashlib
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import pymysql

from setl.errors import RefusedLoadError
from setl.model import Batch, DdlChange, Op, PartialImage, Position, RowChange
from setl.sinks.merge import TableChanges
from setl.sinks.mysql_sql import quote, to_db

log = logging.getLogger(__name__)

LAST_WRITER_WINS, SITE_WINS, KEEP_TARGET = "last_writer_wins", "site_wins", "keep_target"
POLICIES = (LAST_WRITER_WINS, SITE_WINS, KEEP_TARGET)
#: The decisions: the batch's (the source's) version written, or the target's row kept.
SOURCE_WON, TARGET_WON = "source_won", "target_won"
#: The start of the reason of a conflict recorded but not settled exactly (docs/conflicts.md).
UNSETTLED = "unsettled"
#: Keys a conflicts statement checks at once (each is one branch of a UNION ALL).
CHUNK_KEYS = 200
#: The conflicts table, in the pipeline's position schema on the target.
TABLE = "setl_conflicts"
#: The tombstones table (same schema): a deleted key's last version, the site that deleted it.
TOMBSTONES = "setl_tombstones"
#: The delete arrivals table (same schema, on the losing site of a site-wins table): where in this
#: site's binlog the winner's last delete of a key was applied (docs/conflicts.md, "Settling it exactly").
ARRIVALS = "setl_delete_arrivals"


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
    #: how long a deleted key's tombstone is kept (pruned after; docs/conflicts.md)
    tombstone_seconds: float = 7 * 86400.0
    #: tombstones on (``conflicts.tombstones``): triggers, tombstones written and read, a delete ranked
    #: by the row it deleted; off: none of it, a delete wins over an update (docs/conflicts.md)
    tombstones: bool = False
    #: the pipeline's table rules as (regex on SCHEMA.TABLE, whether a table it takes first keeps its
    #: name): the target tables whose tombstone triggers the load makes when it opens (`guard_all`)
    rules: tuple[tuple[str, bool], ...] = attrs.field(default=(), eq=False)
    #: tombstones on: a new connection to the pipeline's source site, where a delete the load applies over
    #: the target's own write must have left its tombstone (`ConflictStep.settle`); None: not asked
    source_dial: Callable[[], Any] | None = attrs.field(default=None, eq=False)
    #: where the source site keeps the table and its tombstones, when not as the target does (None: as in
    #: a channel, same names on both sites); a test playing both sites on one server, a schema each, sets it
    source_schema: str | None = None

    def of(self, table: str) -> TablePolicy:
        return self.tables.get(table, self.default)

    @classmethod
    def from_config(cls, settings: Any, site: str) -> ConflictPolicy:
        """From a validated ``conflicts:`` block (`setl.config.ConflictSettings`) and the pipeline's `site`."""
        others = [name for name in settings.sites if name != site]
        default = TablePolicy(settings.policy, settings.column, settings.site)
        tables = {name: TablePolicy(t.policy or default.policy, t.column or default.column, t.site or default.site)
                  for name, t in settings.tables.items()}
        return cls(site, others[0] if len(others) == 1 else None, dict(settings.sites), default, tables,
                   float(settings.tombstone_days) * 86400.0, bool(settings.tombstones_on()))


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
    """(decision, reason) for a conflict. `newer` (last writer wins): 1 if the source's version is
    later than the target's, -1 if earlier, 0 if equal (NULL is earlier than any time), None when
    one side has no version to compare. A delete's version is the row it deleted (its timestamp);
    a key's tombstone (`TOMBSTONES`) is the target's delete. The same on both sides of a channel:
    last writer wins ranks (timestamp, site priority); site wins names one site; keep the target's
    row keeps each side's own (two sides that both keep their own rows stay different:
    docs/conflicts.md). Without a version to compare (a delete that left no tombstone), a delete
    wins."""
    if policy.policy == KEEP_TARGET:
        return TARGET_WON, "keep_target"
    if policy.policy == SITE_WINS:
        won = conflict_site == policy.site
        return (SOURCE_WON if won else TARGET_WON), f"site {policy.site} wins"
    if newer is None:
        if source_row is ABSENT:
            return SOURCE_WON, "a delete wins over an update"
        if target_row is ABSENT:
            return TARGET_WON, "a delete wins over an update"
        raise ValueError("last writer wins needs the timestamps compared")
    what = "the deleted row's " if source_row is ABSENT or target_row is ABSENT else ""
    if newer:
        return (SOURCE_WON if newer > 0 else TARGET_WON), f"{what}{policy.column} is later on the " + (
            "source" if newer > 0 else "target")
    mine, theirs = sites[conflict_site], sites[target_site] if target_site is not None else None
    if theirs is None or mine == theirs:
        raise ValueError("a tie of last writer wins needs two sites of different priorities")
    first = conflict_site if mine < theirs else target_site
    return (SOURCE_WON if mine < theirs else TARGET_WON), f"{what}{policy.column} ties; site {first} has priority"


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
    #: lower-cased column -> (data type, column type), as information_schema gives them
    types: dict[str, tuple[str, str]] = attrs.Factory(dict)
    #: lower-cased columns whose value as read back may not tell two stored values apart (FLOAT and
    #: DOUBLE are printed rounded; BIT, SET, ENUM, JSON and spatial values come back in other types)
    inexact: frozenset[str] = frozenset()


class Tombstones:
    """The tombstones of one target (`TOMBSTONES` in the pipeline's position schema): a deleted key's
    last version (the deleted row's timestamp), the site that deleted it and, for a user's delete, the
    site's binlog GTID position at it (`deleted_gtid`: `origins`), written in the deleting transaction
    (by the triggers `triggers` makes for users' deletes, by the loader, `bury`, for the deletes it
    applies), read when a write meets no row (`find`), pruned by age with `Arrivals`' (`prune`)."""

    def __init__(self, pipeline: str, schema: str) -> None:
        self.pipeline = pipeline
        self.table = f"{quote(schema)}.{quote(TOMBSTONES)}"
        self.arrivals = f"{quote(schema)}.{quote(ARRIVALS)}"
        self._pruned = 0.0  # when tombstones were last pruned (monotonic)
        self._source: Any = None  # the connection to the source site (`left_on_source`), once asked
        self._lock = threading.Lock()

    def triggers(self, cur: Any, policy: ConflictPolicy, columns: _Columns, schema: str, table: str,
                 pk: Sequence[str], position: str | None) -> None:
        """The triggers of `schema.table` that write a tombstone for each delete of a row by a user of
        the site (a DELETE, and an UPDATE that changes the key), made where missing or changed."""
        name = f"{schema}.{table}"
        site = policy.target_site or ""
        table_policy = policy.of(name)
        column = columns.names.get((table_policy.column or "").lower(), "x")
        stamp = _stamp_text(columns, table_policy, "OLD." + quote(column))
        key = f"JSON_ARRAY({', '.join('OLD.' + quote(c) for c in pk)})"
        named, site = cur.connection.escape(name), cur.connection.escape(site)
        # deleted_gtid: the site's binlog GTID position before this delete (after every earlier one), which
        # names this delete to the other site's record of its arrival (`_names_current`)
        insert = (f"INSERT INTO {self.table} (key_md5, table_name, row_key, stamp, site, deleted_gtid) SELECT "
                  f"MD5(CONCAT({named}, ' ', {key})), {named}, {key}, {stamp}, {site}, @@GLOBAL.gtid_binlog_pos "
                  "FROM DUAL WHERE @setl_origin IS NULL "
                  "ON DUPLICATE KEY UPDATE row_key = VALUES(row_key), stamp = VALUES(stamp), "
                  "site = VALUES(site), deleted_at = CURRENT_TIMESTAMP(6), deleted_gtid = VALUES(deleted_gtid)")
        moved = " OR ".join(f"NOT (OLD.{quote(c)} <=> NEW.{quote(c)})" for c in pk)
        target = f"{quote(schema)}.{quote(table)}"
        bodies = {_trigger(table, "d"): ("DELETE", insert),
                  _trigger(table, "u"): ("UPDATE", f"BEGIN IF {moved} THEN {insert}; END IF; END")}
        cur.execute("SELECT trigger_name, action_statement FROM information_schema.triggers WHERE "
                    "event_object_schema = %s AND event_object_table = %s", (schema, table))
        made = dict(cur.fetchall())
        try:
            for trigger, (event, body) in bodies.items():
                if made.get(trigger) != body:  # made, or made again after a change (DDL, policy)
                    cur.execute(f"CREATE OR REPLACE TRIGGER {quote(schema)}.{quote(trigger)} AFTER {event} ON "
                                f"{target} FOR EACH ROW {body}")
        except Exception as exc:  # a missing privilege: one line with the fix
            raise RefusedLoadError(
                f"conflicts: cannot make the tombstone triggers of {name} ({exc}); a deleted row must leave a "
                "tombstone on its site for a delete racing an insert to settle the same on both sides; fix: "
                "GRANT TRIGGER on the tables (and SUPER, or SET GLOBAL log_bin_trust_function_creators=1, where "
                "the binlog is on), or set conflicts.tombstones: false, accepting that an insert racing a delete "
                "of its key is then found only by setl verify --channel (docs/conflicts.md)",
                pipeline=self.pipeline, stage="load", table=name,
                position=position) from exc

    def prune(self, conn: Any, keep: float) -> None:
        """Drop the tombstones older than `keep` seconds, now and then."""
        now = time.monotonic()
        with self._lock:
            if now - self._pruned < min(3600.0, keep / 2):
                return
            self._pruned = now
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {self.table} WHERE deleted_at < NOW(6) - INTERVAL %s MICROSECOND",
                        (int(keep * 1e6),))
            if cur.rowcount:
                log.info("pipeline=%s stage=load pruned %d tombstones older than %ss", self.pipeline,
                         cur.rowcount, keep)
            cur.execute(f"DELETE FROM {self.arrivals} WHERE arrived_at < NOW(6) - INTERVAL %s MICROSECOND",
                        (int(keep * 1e6),))
        conn.commit()

    def find(self, cur: Any, name: str, pk: Sequence[str], columns: _Columns, policy: TablePolicy,
             keys: Sequence[tuple[Any, ...]], versions: Mapping[tuple[Any, ...], Any]
             ) -> dict[tuple[Any, ...], tuple[str, int | None]]:
        """Key -> (the site that deleted it, `decide`'s `newer` of the batch's version against the
        deleted row's: None where not last writer wins), for the `keys` the target holds a tombstone
        of. Most keys have none: their hashes are worked out and looked up a chunk at a time, and
        only the keys found are compared."""
        found: dict[tuple[Any, ...], tuple[str, int | None]] = {}
        literal = cur.connection.escape
        for start in range(0, len(keys), CHUNK_KEYS):
            part = keys[start:start + CHUNK_KEYS]
            keyed = _keyed(cur, name, pk, columns, part)
            # A locking read, as the rows' (`_compare`): it sees the latest committed tombstone. A plain
            # read would see the transaction's snapshot, taken at its first plain read (another table's
            # lookup, earlier in the batch), before a user's delete that committed since, whose row
            # the locking read already finds gone: "no row and no tombstone", a false stop.
            cur.execute(f"SELECT k.n, k.h, t.site FROM ({keyed}) k JOIN {self.table} t "
                        "ON t.key_md5 = CONVERT(k.h USING ascii) LOCK IN SHARE MODE")
            hashes, graves = {}, {}
            for n, digest, site in cur.fetchall():
                hashes[digest] = part[n]
                graves[part[n]] = site
            compared = [key for key in graves if policy.policy == LAST_WRITER_WINS and versions.get(key) is not None]
            for key in graves:
                found[key] = (graves[key], None)
            if not compared:
                continue
            branches = []
            theirs = _stamp_value(columns, policy, "t.stamp")
            for n, key in enumerate(compared):
                value = next((v for c, v in versions[key].items() if c.lower() == (policy.column or "").lower()), None)
                mine = _stamp_value(columns, policy, _stamp_text(columns, policy, literal(to_db(value))))
                compare = (f"CASE WHEN {mine} <=> {theirs} THEN 0 WHEN {theirs} IS NULL THEN 1 WHEN {mine} IS NULL "
                           f"THEN -1 WHEN {mine} > {theirs} THEN 1 ELSE -1 END")
                branches.append(f"(SELECT {n}, {compare} FROM {self.table} t WHERE t.key_md5 = "
                                f"{literal(next(h for h, k in hashes.items() if k == key))} LOCK IN SHARE MODE)")
            cur.execute(" UNION ALL ".join(branches))
            for n, newer in cur.fetchall():
                key = compared[n]
                found[key] = (found[key][0], None if newer is None else int(newer))
        return found

    def bury(self, conn: Any, site: str, name: str, pk: Sequence[str], columns: _Columns, policy: TablePolicy,
             deletes: Sequence[tuple[tuple[Any, ...], Any]]) -> None:
        """A tombstone for each of the batch's deletes (the deleted row's version, the source's site),
        in the batch's transaction."""
        with conn.cursor() as cur:
            literal = cur.connection.escape
            rows = []
            for key, image in deletes:
                value = None if image is None else next(
                    (v for c, v in image.items() if c.lower() == (policy.column or "").lower()), None)
                stamp = _stamp_text(columns, policy, literal(to_db(value)))
                rows.append(f"({_key_md5(cur, name, pk, columns, key)}, {literal(name)}, "
                            f"{_key_json(cur, pk, columns, key)}, {stamp}, {literal(site)})")
            for start in range(0, len(rows), 5 * CHUNK_KEYS):  # deleted_gtid NULL: a delete of the other site
                cur.execute(f"INSERT INTO {self.table} (key_md5, table_name, row_key, stamp, site) VALUES "
                            + ", ".join(rows[start:start + 5 * CHUNK_KEYS])
                            + " ON DUPLICATE KEY UPDATE row_key = VALUES(row_key), stamp = VALUES(stamp), "
                            "site = VALUES(site), deleted_at = CURRENT_TIMESTAMP(6), deleted_gtid = NULL")


    def ask_source(self, policy: ConflictPolicy, name: str, ask: Callable[[Any, Tombstones, str], Any]) -> Any:
        """`ask`(cursor, the source's `Tombstones`, the table's name there) on the source site, over the
        connection kept for it (made again once if it broke); None where the table asked for is missing
        there (error 1146). A transaction left open by an earlier question is ended first, so that the
        read sees the latest committed rows."""
        assert policy.source_dial is not None
        graves = Tombstones(self.pipeline, policy.source_schema) if policy.source_schema else self
        named = f"{policy.source_schema}.{name.partition('.')[2]}" if policy.source_schema else name
        for attempt in (1, 2):
            try:
                if self._source is None:
                    self._source = policy.source_dial()
                self._source.commit()
                with self._source.cursor() as cur:
                    return ask(cur, graves, named)
            except (pymysql.MySQLError, OSError) as exc:
                source, self._source = self._source, None
                if source is not None:
                    try:
                        source.close()
                    except (pymysql.MySQLError, OSError):
                        pass  # gone already: a new one is made
                if exc.args and exc.args[0] == 1146:
                    return None
                if attempt == 2:
                    raise
        return None

    def origins(self, cur: Any, name: str, pk: Sequence[str], columns: _Columns, keys: Sequence[tuple[Any, ...]]
                ) -> dict[tuple[Any, ...], str | None]:
        """Key -> its tombstone's `deleted_gtid` (None: written by the loader or an older setl), read locked."""
        found: dict[tuple[Any, ...], str | None] = {}
        for start in range(0, len(keys), CHUNK_KEYS):
            part = keys[start:start + CHUNK_KEYS]
            keyed = _keyed(cur, name, pk, columns, part)
            cur.execute(f"SELECT k.n, t.deleted_gtid FROM ({keyed}) k JOIN {self.table} t "
                        "ON t.key_md5 = CONVERT(k.h USING ascii) LOCK IN SHARE MODE")
            for n, gtid in cur.fetchall():
                found[part[n]] = gtid
        return found

    def left_on_source(self, policy: ConflictPolicy, batch: Batch, name: str, pk: Sequence[str], columns: _Columns,
                       table_policy: TablePolicy, keys: Sequence[tuple[Any, ...]],
                       versions: Mapping[tuple[Any, ...], Any]) -> None:
        """Stop unless each of the source's deletes in `keys`, which win over the target's own write of
        the key, left its tombstone on the source site. The other direction carries that write to the
        source, where it meets no row: only the source's tombstone of the delete lets it rank the two
        as here. A delete made before setl's triggers existed on the source's table (a table created
        while the channel runs, before the other direction applied its DDL or its first rows) left
        none: there the write would be applied while here the delete wins, and the sites would end
        different. `policy` is the pipeline's."""
        if policy.source_dial is None:
            raise RefusedLoadError(
                f"conflicts: tombstones need the source site {policy.site} to be asked whether its delete of "
                f"key {list(keys[0])} left a tombstone, and this pipeline's source is not a MySQL server; fix: "
                "set conflicts.tombstones: false, or run the pipeline as a channel direction",
                pipeline=self.pipeline, stage="load", table=name, position=batch.end)
        def ask(cur: Any, graves: Tombstones, named: str) -> dict[tuple[Any, ...], tuple[str, int | None]]:
            return graves.find(cur, named, pk, columns, table_policy, keys, versions)

        found = self.ask_source(policy, name, ask) or {}  # None: no tombstones table there, no triggers yet
        for key in keys:
            grave = found.get(key)
            newer = None if grave is None else grave[1]
            if (grave is not None and grave[0] == policy.site
                    and (table_policy.policy != LAST_WRITER_WINS or (newer is not None and newer <= 0))):
                continue
            here, there = policy.site, policy.target_site or "target"
            # The source's tombstone of the key is another site's: a delete there that raced this one and
            # reached the source first replaced it (docs/conflicts.md, "Settling it exactly").
            cause = (f"left no tombstone on {here} (made before setl's triggers existed on the table there, "
                     f"e.g. a table created while the channel runs, or older than conflicts.tombstone_days)"
                     if grave is None or grave[0] == policy.site else
                     f"its tombstone on {here} was replaced by site {grave[0]}'s delete of the key, which raced it "
                     f"and reached {here} first")
            raise RefusedLoadError(
                f"conflicts: a delete of key {list(key)} on site {here} wins over site {there}'s own write of the "
                f"key, but {cause}: the write "
                f"cannot be ranked against it on {here}, so the sites could end different; fix: on site {there}, "
                f"delete the key by hand (the delete's outcome) or write it again stamped later than the delete "
                f"(the write's), then resume (docs/conflicts.md)",
                pipeline=self.pipeline, stage="load", table=name, position=batch.end)


class Arrivals:
    """Site wins with tombstones: when the winning site's deletes reached the losing site, so that an
    insert of the losing site meeting the winner's tombstone is ranked exactly (docs/conflicts.md,
    "Settling it exactly"). On the losing site, the loader of the winner's changes records each delete
    it applies (`arrived`) with where that site's binlog stood once the batch held its keys' locks
    (`binlog_end`); on the winning site, the loader of the loser's changes asks for that record
    (`on_source`) and `rank`s the insert by it."""

    def __init__(self, pipeline: str, schema: str, tombstones: Tombstones) -> None:
        self.pipeline = pipeline
        self.table = f"{quote(schema)}.{quote(ARRIVALS)}"
        self.tombstones = tombstones

    def binlog_end(self, cur: Any, policy: ConflictPolicy, batch: Batch, name: str) -> Position:
        """Where this site's binlog ends now (``SHOW MASTER STATUS``); refused (no BINLOG MONITOR) or
        empty (binlog off): stop, one line with the fix."""
        try:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        except pymysql.MySQLError as exc:
            cause: str = f"it was refused ({exc})"
        else:
            if row and row[0]:
                return Position(str(row[0]), int(row[1]))
            cause = "the binlog is off there"
        raise RefusedLoadError(
            f"conflicts: site_wins with tombstones records where site {policy.site}'s deletes reach site "
            f"{policy.target_site or 'target'} in its binlog (SHOW MASTER STATUS), and {cause}; fix: GRANT "
            f"BINLOG MONITOR ON *.* to the loader's user there (SUPER before MariaDB 10.5) and run it with the binlog "
            f"on (log_bin), or use last_writer_wins for the table (docs/grants.md)",
            pipeline=self.pipeline, stage="load", table=name, position=batch.end)

    def arrived(self, cur: Any, name: str, pk: Sequence[str], columns: _Columns,
                deletes: Sequence[tuple[tuple[Any, ...], Position | None]], at: Position) -> None:
        """Record, in the batch's transaction, that the winning site's delete of each key (its change
        position there: `origin_gtid`, and whether it is a piece of a split transaction) was applied here
        with this site's binlog at `at` (read after the batch locked the keys): an insert of the key by a
        user here ends at or before `at` in this binlog if it raced the delete, after it if not."""
        literal = cur.connection.escape
        rows = [f"({_key_md5(cur, name, pk, columns, key)}, {literal(name)}, {_key_json(cur, pk, columns, key)}, "
                f"{literal(None if origin is None else origin.gtid)}, {int(origin is not None and origin.row > 0)}, "
                f"{literal(at.log)}, {int(at.offset)})" for key, origin in deletes]
        for start in range(0, len(rows), 5 * CHUNK_KEYS):
            cur.execute(f"INSERT INTO {self.table} (key_md5, table_name, row_key, origin_gtid, origin_piece, "
                        "arrived_log, arrived_offset) VALUES " + ", ".join(rows[start:start + 5 * CHUNK_KEYS])
                        + " ON DUPLICATE KEY UPDATE row_key = VALUES(row_key), origin_gtid = VALUES(origin_gtid), "
                        "origin_piece = VALUES(origin_piece), arrived_log = VALUES(arrived_log), "
                        "arrived_offset = VALUES(arrived_offset), arrived_at = CURRENT_TIMESTAMP(6)")

    def on_source(self, policy: ConflictPolicy, name: str, pk: Sequence[str], columns: _Columns,
                  keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[str | None, bool, Position]] | None:
        """Key -> (origin_gtid, origin_piece, where the source's binlog stood) of the source site's record
        of this site's latest delete of the key that reached it (`arrived`); None where the source has no
        such table (an older setl). A plain read: a locking one would wait across the two servers."""

        def ask(cur: Any, graves: Tombstones, named: str) -> dict[tuple[Any, ...], tuple[str | None, bool, Position]]:
            found: dict[tuple[Any, ...], tuple[str | None, bool, Position]] = {}
            for start in range(0, len(keys), CHUNK_KEYS):
                part = keys[start:start + CHUNK_KEYS]
                keyed = _keyed(cur, named, pk, columns, part)
                cur.execute(f"SELECT k.n, r.origin_gtid, r.origin_piece, r.arrived_log, r.arrived_offset FROM "
                            f"({keyed}) k JOIN {graves.arrivals} r ON r.key_md5 = CONVERT(k.h USING ascii)")
                for n, gtid, piece, log_name, offset in cur.fetchall():
                    found[part[n]] = (gtid, bool(piece), Position(str(log_name), int(offset)))
            return found

        return self.tombstones.ask_source(policy, name, ask)

    def record(self, cur: Any, policy: ConflictPolicy, batch: Batch, ident: tuple[str, str], pk: Sequence[str],
               columns: _Columns, keys: Sequence[tuple[Any, ...]]) -> None:
        """On the losing site, after the batch locked `keys` (deleted by the winning site): record each
        delete's arrival with where this site's binlog stands now (`arrived`)."""
        name = f"{ident[0]}.{ident[1]}"
        at = self.binlog_end(cur, policy, batch, name)
        origins = _changed_at(batch, ident, pk)[0]
        self.arrived(cur, name, pk, columns, [(key, origins.get(key)) for key in keys], at)

    def rank(self, conn: Any, policy: ConflictPolicy, batch: Batch, ident: tuple[str, str], pk: Sequence[str],
             columns: _Columns, inserts: Sequence[tuple[tuple[Any, ...], Any, Any, str]],
             creations: _Creations | None = None) -> list[Conflict]:
        """On the winning site: the conflicts of the inserts (key, the source's state before, the insert,
        the tombstone's site) of the losing (source) site that meet the winner's tombstone. The source
        records where in its binlog the winner's latest delete of the key arrived (`arrived`); the insert
        raced that delete iff its position in the source's binlog is at or before it: it lost there and
        loses here (`TARGET_WON`), else it is applied and is no conflict. No record of the delete this
        tombstone holds: it had not arrived when the insert was made, which lost likewise. A tombstone of
        an older setl, an insert without a GTID position, sets that cannot be compared or no record
        table there: applied and recorded `UNSETTLED`, with the cause (docs/conflicts.md). `creations`:
        the keys the batch creates in the table, if the caller asked them already."""
        name = f"{ident[0]}.{ident[1]}"
        made = (creations if creations is not None else _Creations(batch, ident, pk)).positions()
        winner = inserts[0][3]
        here, there = policy.target_site or "target", policy.site
        with conn.cursor() as cur:
            tombs = self.tombstones.origins(cur, name, pk, columns, [key for key, *_ in inserts])
        asked = [key for key, *_ in inserts if tombs.get(key) is not None and _gtid_known(made.get(key))]
        records = (self.on_source(policy, name, pk, columns, asked)
                   if asked and policy.source_dial is not None else None)
        out: list[Conflict] = []

        def unsettled(why: str) -> tuple[str, str]:
            return SOURCE_WON, (f"{UNSETTLED}: site_wins cannot rank an insert against site {winner}'s delete ({why}); "
                                "applied: if it raced the delete, the sites differ (setl verify)")

        for key, first, want, _ in inserts:
            p, x = tombs.get(key), made.get(key)
            record = None if records is None else records.get(key)
            current = None if record is None or p is None else _names_current(record[0], record[1], p)
            if p is None:
                decision, reason = unsettled("its tombstone was written by an older setl")
            elif x is None or not _gtid_known(x):
                decision, reason = unsettled("the insert has no binlog position with a GTID")
            elif policy.source_dial is None:
                decision, reason = unsettled(f"site {there} cannot be asked: the pipeline's source is not MySQL")
            elif records is None:
                decision, reason = unsettled(f"site {there} keeps no record of the deletes that reached it "
                                             f"({ARRIVALS} missing there: an older setl)")
            elif record is not None and current is None:
                decision, reason = unsettled(f"the GTID sets {record[0]!r} and {p!r} cannot be compared")
            elif record is not None and current and x > record[2]:
                continue  # made after the delete reached the loser's site: applied, no conflict
            elif record is not None and current:
                decision, reason = TARGET_WON, (f"site {winner} wins: the insert raced site {winner}'s delete (written "
                                                f"on {there} before the delete arrived there at {record[2]})")
            else:
                decision, reason = TARGET_WON, (f"site {winner} wins: the insert was written on {there} before "
                                                f"site {winner}'s latest delete of the key arrived there "
                                                f"(tombstone on {here})")
            out.append(Conflict(self.pipeline, name, key, policy.of(name).policy, decision, reason, policy.site,
                                policy.target_site, first, want, ABSENT, str(batch.end)))
        return out


class ConflictStep:
    """The conflicts step of one MySQL sink: `begin` each batch's transaction, `settle` each table's
    merged changes before they are written, `after_commit` to publish what was settled."""

    def __init__(self, pipeline: str, policy: ConflictPolicy, schema: str) -> None:
        self.pipeline = pipeline
        self.policy = policy
        self.schema = schema
        self._ready = False
        self._columns: dict[tuple[str, str], _Columns] = {}
        self._guarded: set[tuple[str, str]] = set()  # tables whose delete triggers this process made
        self.tombstones = Tombstones(pipeline, schema)
        self.arrivals = Arrivals(pipeline, schema, self.tombstones)
        self._pending = threading.local()
        if not policy.tombstones and policy.default.policy != KEEP_TARGET:
            log.warning("pipeline=%s stage=load conflicts: runs WITHOUT tombstones (conflicts.tombstones: false): an "
                        "insert racing a delete may leave the sites different (setl verify --channel)", pipeline)

    # -- the transaction

    def begin(self, conn: Any, batch: Batch | None = None) -> None:
        """Before the batch's first statement: make the conflicts and tombstones tables (once), the
        delete triggers of the batch's tables (`guard`, once per table), prune old tombstones now
        and then, and run the batch's transaction REPEATABLE READ (see the module), its deletes
        marked as the source site's (``@setl_origin``: the triggers leave them to the loader)."""
        self._make_tables(conn)
        if not self.policy.tombstones:  # main's conflicts: no triggers, no tombstones
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self._pending.found = []
            return
        with conn.cursor() as cur:
            cur.execute("SET @setl_origin = %s", (self.policy.site,))
        if batch is not None:
            for change in batch.changes:
                if (isinstance(change, RowChange) and change.primary_key and change.sequence is None
                        and (change.schema, change.table) not in self._guarded):
                    self.guard(conn, change.schema, change.table, position=str(batch.end))
        self.tombstones.prune(conn, self.policy.tombstone_seconds)
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        self._pending.found = []

    def _make_tables(self, conn: Any) -> None:
        """The conflicts and tombstones tables, made once."""
        if self._ready:
            return
        with conn.cursor() as cur:
            # DDL only where a table or column is missing: a restart writes nothing into the binlog
            wanted = (TABLE, TOMBSTONES, ARRIVALS) if self.policy.tombstones else (TABLE, TABLE, TABLE)
            cur.execute("SELECT COUNT(DISTINCT table_name) FROM information_schema.tables WHERE table_schema = %s "
                        "AND table_name IN (%s, %s, %s)", (self.schema, *wanted))
            if cur.fetchone()[0] < len(set(wanted)):
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(self.schema)}")
                cur.execute(CONFLICTS_DDL.format(table=f"{quote(self.schema)}.{quote(TABLE)}"))
                if self.policy.tombstones:
                    cur.execute(TOMBSTONES_DDL.format(table=self.tombstones.table))
                    cur.execute(ARRIVALS_DDL.format(table=self.arrivals.table))
            if self.policy.tombstones:
                cur.execute("SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = %s AND table_name = "
                            "%s AND column_name = 'deleted_gtid'", (self.schema, TOMBSTONES))
                if not cur.fetchone()[0]:  # a tombstones table of an older setl
                    cur.execute(TOMBSTONES_GTID_DDL.format(table=self.tombstones.table))
        conn.commit()
        self._ready = True

    def guard(self, conn: Any, schema: str, table: str, position: str | None = None) -> None:
        """Make (or make again) the triggers that write a tombstone for every delete of a row of
        `schema.table` by a user of this site, in the deleting transaction: a DELETE, and an UPDATE
        that changes the primary key (the loader writes its own deletes' tombstones). DDL: it
        commits. Run at the first batch of each table; a channel runs it for its tables at start."""
        self._make_tables(conn)
        with conn.cursor() as cur:
            self._columns.pop((schema, table), None)
            columns = self._table_columns(cur, schema, table)
            cur.execute("SELECT k.column_name FROM information_schema.table_constraints c JOIN "
                        "information_schema.key_column_usage k ON k.constraint_schema = c.constraint_schema "
                        "AND k.constraint_name = c.constraint_name AND k.table_schema = c.table_schema AND "
                        "k.table_name = c.table_name WHERE c.table_schema = %s AND c.table_name = %s AND "
                        "c.constraint_type = 'PRIMARY KEY' ORDER BY k.ordinal_position", (schema, table))
            pk = tuple(row[0] for row in cur.fetchall())
            if not pk:
                return  # keyless: refused by `first_images` at its first change
            self.tombstones.triggers(cur, self.policy, columns, schema, table, pk, position)
        conn.commit()
        self._guarded.add((schema, table))

    def guard_all(self, conn: Any) -> None:
        """`guard` every table of the target the pipeline writes under its own name (its table rules,
        `ConflictPolicy.rules`), so that a user's delete leaves a tombstone from the start, before
        the first batch of the table arrives."""
        if not self.policy.rules or not self.policy.tombstones:
            return
        self._make_tables(conn)
        with conn.cursor() as cur:
            cur.execute("SELECT t.table_schema, t.table_name FROM information_schema.tables t WHERE t.table_type = "
                        "'BASE TABLE' AND t.table_schema NOT IN ('mysql', 'information_schema', "
                        "'performance_schema', 'sys', %s)", (self.schema,))
            tables = [(row[0], row[1]) for row in cur.fetchall()]
        for schema, table in tables:
            name = f"{schema}.{table}"
            rule = next((keeps for regex, keeps in self.policy.rules if re.fullmatch(regex, name)), False)
            if rule and (schema, table) not in self._guarded:
                self.guard(conn, schema, table)

    def guard_created(self, conn: Any, schema: str, table: str, position: str | None) -> None:
        """Tombstones on: right after a DDL the load applied (a CREATE TABLE, an ALTER), the triggers of
        its table, when the pipeline writes it under its own name, on the target (before its users
        write it) and on the source site, whose users' deletes since the CREATE left no tombstone (a
        race with one of them stops the load: `Tombstones.left_on_source`)."""
        name = f"{schema}.{table}"
        if not (self.policy.tombstones and table and any(
                keeps for regex, keeps in self.policy.rules if re.fullmatch(regex, name))):
            return
        sites = [(conn, self)]
        if self.policy.source_dial is not None:  # the source's triggers write its own site's name
            there = attrs.evolve(self.policy, site=self.policy.target_site or "", target_site=self.policy.site)
            sites.append((self.policy.source_dial(), ConflictStep(self.pipeline, there, self.schema)))
        for server, step in sites:
            try:
                with server.cursor() as cur:
                    cur.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s AND "
                                "table_name = %s AND table_type = 'BASE TABLE'", (schema, table))
                    exists = bool(cur.fetchone()[0])
                if exists:
                    step.guard(server, schema, table, position=position)
            finally:
                if server is not conn:
                    server.close()

    def after_commit(self) -> None:
        """The batch committed: count and publish its conflicts."""
        found = getattr(self._pending, "found", [])
        self._pending.found = []
        if found:
            publish(found)

    def forget(self) -> None:
        """After DDL: learn the tables' columns again, and make their triggers again."""
        self._columns.clear()
        self._guarded.clear()

    # -- one table

    def settle(self, conn: Any, batch: Batch, table: TableChanges,
               expected: dict[tuple[str, str], dict[tuple[Any, ...], Any]]) -> TableChanges:
        """`table`'s changes without those whose conflict the target's row (or tombstone) wins, every
        conflict written to the conflicts table, and a tombstone for every delete written.
        `expected`: `first_images` of the segment's changes."""
        if not table.primary_key:
            return table  # a sequence's state (keyless rows were refused by `first_images`)
        ident = (table.schema, table.table)
        name = f"{table.schema}.{table.table}"
        policy = self.policy.of(name)
        pk = table.primary_key
        firsts = expected.setdefault(ident, {})
        desired: dict[tuple[Any, ...], Any] = {}
        deleted: dict[tuple[Any, ...], Any] = {}  # key -> the row a delete removes (its version)
        for image in table.deletes:
            key = tuple(image[c] for c in pk)
            desired[key] = ABSENT
            deleted[key] = image
        for image in table.upserts:
            desired[tuple(image[c] for c in pk)] = image
        tombstones = self.policy.tombstones
        # tombstones on: a delete's version is the row it deleted; off: it has none (a delete wins)
        versions = {key: deleted.get(key) if want is ABSENT else want for key, want in desired.items()} \
            if tombstones else dict(desired)
        # A key the batch changes back to what it found changes nothing on the source: it is not
        # written, lest it undo the target's own change of the row. A key inserted and deleted again
        # is a delete all the same: of a version that may rank after the target's row (last writer
        # wins, site wins), as on the source, where it replaced whatever the target's row races with.
        unchanged = {key for key, want in desired.items() if _same_image(firsts.get(key, ANY), want)
                     and not (want is ABSENT and key in deleted)}
        keys = [key for key in desired if firsts.get(key, ANY) is not ANY and key not in unchanged]
        with conn.cursor() as cur:
            columns = self._table_columns(cur, table.schema, table.table)
            if policy.policy == LAST_WRITER_WINS and (policy.column or "").lower() not in columns.names:
                raise RefusedLoadError(f"conflicts: table {name} has no column {policy.column!r}, the timestamp "
                                       f"last writer wins compares; fix: add it, or set another column or policy "
                                       f"for the table", pipeline=self.pipeline, stage="load", table=name,
                                       position=batch.end)
            found = self._compare(cur, table, columns, policy, keys, firsts, desired, versions)
            absent = [key for key in keys if found.get(key, (ABSENT,))[0] is ABSENT]
            graves = (self.tombstones.find(cur, name, pk, columns, policy, absent, versions)
                      if absent and tombstones else {})
            arriving = [key for key in keys if desired[key] is ABSENT and key in deleted]
            if tombstones and arriving and policy.policy == SITE_WINS and policy.site == self.policy.site:
                # the winner's deletes reach the loser: its binlog's end, every key locked (`arrived`)
                self.arrivals.record(cur, self.policy, batch, ident, pk, columns, arriving)
        kept: set[tuple[Any, ...]] = set(unchanged)
        conflicts: list[Conflict] = []
        buried: list[tuple[Any, ...]] = []  # deletes whose tombstone the loader writes
        inserts: list[tuple[tuple[Any, ...], Any, Any, str]] = []  # site wins: the loser's inserts over a tombstone
        beaten: list[tuple[Any, ...]] = []  # deletes that win over the target's own write of the key
        made = _Creations(batch, ident, pk)  # the keys the batch (re)creates, worked out if asked
        for key in keys:
            first, want = firsts[key], desired[key]
            row, same_before, same_after, newer = found.get(key, (ABSENT, first is ABSENT, want is ABSENT, None))
            reason_tail = ""
            if row is ABSENT:
                grave = graves.get(key)
                if not tombstones:
                    if same_before or same_after:
                        continue  # main's conflicts: an update meeting no row loses to the target's delete
                elif want is ABSENT:
                    # Nothing to delete: the target deleted it too. The later of the two deletes stays its
                    # tombstone (last writer wins); without timestamps, the source's: a write the source
                    # makes after its delete is no conflict here, as on the source. Site wins: the winner's own
                    # tombstone stays (its deleted_gtid ranks the loser's inserts: "Settling it exactly").
                    keep = policy.policy == SITE_WINS and grave and grave[0] == policy.site != self.policy.site
                    if not keep and (grave is None or grave[0] == self.policy.site or policy.policy != LAST_WRITER_WINS
                            or _later(self.policy, grave[1])):
                        buried.append(key)
                    continue
                elif grave is None or grave[0] == self.policy.site:
                    if first is ABSENT:
                        continue  # an insert of a key never deleted here, or deleted by the source before it
                    if policy.policy == LAST_WRITER_WINS:
                        _unranked(self.pipeline, self.policy, batch, name, key)
                    newer = None  # site wins needs no version; keep the target's row keeps its own
                elif (policy.policy == SITE_WINS and self.policy.site != policy.site and first is not ABSENT
                      and key not in made):
                    # An update of the loser meeting the winner's tombstone raced that delete (a key deleted and
                    # written again, in one batch too, is ranked as an insert): the delete wins, as there
                    newer, reason_tail = None, f" (tombstone of site {grave[0]}'s delete)"
                elif policy.policy == SITE_WINS and self.policy.site != policy.site:
                    # an insert of the loser meeting the winner's tombstone: ranked after the loop (`Arrivals.rank`)
                    inserts.append((key, first, want, grave[0]))
                    continue
                else:
                    newer = grave[1]  # a tombstone of the target's own delete: the write raced it
                    reason_tail = f" (tombstone of site {grave[0]}'s delete)"
            elif same_before or same_after:
                if want is ABSENT and same_before and tombstones:
                    buried.append(key)
                continue
            decision, reason = decide(policy, self.policy.site, self.policy.target_site, self.policy.sites,
                                      want, row, newer)
            if decision == TARGET_WON:
                kept.add(key)
            elif want is ABSENT and tombstones:
                buried.append(key)
                if row is not ABSENT:
                    beaten.append(key)
            conflicts.append(Conflict(self.pipeline, name, key, policy.policy, decision, reason + reason_tail,
                                      self.policy.site, self.policy.target_site, first, want, row, str(batch.end)))
        if inserts:
            ranked = self.arrivals.rank(conn, self.policy, batch, ident, pk, columns, inserts, made)
            conflicts.extend(ranked)
            kept.update(c.key for c in ranked if c.decision == TARGET_WON)
        if beaten:
            self.tombstones.left_on_source(self.policy, batch, name, pk, columns, policy, beaten, versions)
        if conflicts:
            self._record(conn, batch, conflicts)
        if buried:
            self.tombstones.bury(conn, self.policy.site, name, pk, columns, policy,
                                 [(key, deleted[key]) for key in buried])
        if not kept:
            return table
        return attrs.evolve(table, deletes=tuple(i for i in table.deletes if tuple(i[c] for c in pk) not in kept),
                            upserts=tuple(i for i in table.upserts if tuple(i[c] for c in pk) not in kept))

    def _table_columns(self, cur: Any, schema: str, table: str) -> _Columns:
        """How each column of the table compares exactly (read once per table, until `forget`)."""
        known = self._columns.get((schema, table))
        if known is not None:
            return known
        cur.execute("SELECT c.column_name, c.data_type, c.character_set_name, c.extra, c.column_type, "
                    "(SELECT MAX(l.collation_name) FROM information_schema.collations l "
                    " WHERE l.collation_name = CONCAT(c.character_set_name, '_nopad_bin')), "
                    "(SELECT MAX(l.collation_name) FROM information_schema.collations l "
                    " WHERE l.collation_name = CONCAT(c.character_set_name, '_bin')) "
                    "FROM information_schema.columns c WHERE c.table_schema = %s AND c.table_name = %s",
                    (schema, table))
        expressions, names, inexact, types = {}, {}, set(), {}
        for column, data_type, charset, extra, column_type, nopad, binary in cur.fetchall():
            types[column.lower()] = (str(data_type).lower(), str(column_type).lower())
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
        found = _Columns(expressions, names, types, frozenset(inexact))
        if names:
            self._columns[(schema, table)] = found
        return found

    def _compare(self, cur: Any, table: TableChanges, columns: _Columns, policy: TablePolicy,
                 keys: Sequence[tuple[Any, ...]], firsts: Mapping[tuple[Any, ...], Any],
                 desired: Mapping[tuple[Any, ...], Any], versions: Mapping[tuple[Any, ...], Any]
                 ) -> dict[tuple[Any, ...], tuple[Any, bool, bool, int | None]]:
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
            found.update(self._server_compare(cur, table, columns, policy, suspects, firsts, desired, versions))
        return found

    def _server_compare(self, cur: Any, table: TableChanges, columns: _Columns, policy: TablePolicy,
                        keys: Sequence[tuple[Any, ...]], firsts: Mapping[tuple[Any, ...], Any],
                        desired: Mapping[tuple[Any, ...], Any], versions: Mapping[tuple[Any, ...], Any]
                        ) -> dict[tuple[Any, ...], tuple[Any, bool, bool, int | None]]:
        """`_compare` of `keys` by the server: a UNION ALL of one locked single-key SELECT per key,
        each comparing the row with both images column by column (`<=>`, text in a binary no-pad
        collation) and, for last writer wins, the timestamps (of the batch's `versions`: a delete's is
        the row it deleted)."""
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
            if stamp is None or image is ABSENT or image is None:
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
                branches.append(f"(SELECT {n}, {same(firsts[key])}, {same(desired[key])}, {newer(versions.get(key))}, "
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


def _unranked(pipeline: str, policy: ConflictPolicy, batch: Batch, name: str, key: tuple[Any, ...]) -> None:
    """Stop: an update meets no row and no tombstone of the target's delete. The delete's version
    (the row it deleted) is nowhere on this site, so last writer wins cannot rank the update
    against it, while the other site ranks them by that version: any choice here may leave the
    sites different (docs/conflicts.md, "What is not settled")."""
    here, there = policy.target_site or "target", policy.site
    raise RefusedLoadError(
        f"conflicts: an update of key {list(key)} from site {there} meets no row and no tombstone of site "
        f"{here}'s delete: the key was deleted on {here} by a delete that left no tombstone (made before "
        f"setl's triggers existed on the table, or older than conflicts.tombstone_days), which last writer "
        f"wins cannot rank against the update; fix: on site {here} write the key as it must end on both "
        f"sites (the update's row; or a row stamped later than it, then delete it), then resume "
        f"(docs/conflicts.md)",
        pipeline=pipeline, stage="load", table=name, position=batch.end)


def _changed_at(batch: Batch, ident: tuple[str, str], pk: Sequence[str]
                ) -> tuple[dict[tuple[Any, ...], Position | None], dict[tuple[Any, ...], Position | None]]:
    """Per key of table `ident` in `batch`: the position of its last delete, and of its last creation
    (an insert, or an update that moves a row to the key)."""
    deletes: dict[tuple[Any, ...], Position | None] = {}
    creations: dict[tuple[Any, ...], Position | None] = {}
    for change in batch.changes:
        if not isinstance(change, RowChange) or (change.schema, change.table) != ident or change.op is Op.READ:
            continue
        before, after = change.before, change.after
        old = None if before is None else tuple(before[c] for c in pk)
        new = None if after is None else tuple(after[c] for c in pk)
        if old is not None and old != new:
            deletes[old] = change.position
        if new is not None and old != new:
            creations[new] = change.position
    return deletes, creations


class _Creations:
    """The keys `batch` creates in table `ident` (an insert, or an update moving a row to the key),
    each with the position of its last creation (`_changed_at`): worked out once, on first use,
    for the batch's settling of the table and its ranking (`Arrivals.rank`) alike.

    A merged change from the row before the batch to one the batch wrote again after deleting it
    is no update of the row the winner's delete met, but an insert made after that delete, to be
    ranked: ``key in creations`` tells which."""

    def __init__(self, batch: Batch, ident: tuple[str, str], pk: Sequence[str]) -> None:
        self._batch, self._ident, self._pk = batch, ident, pk
        self._found: dict[tuple[Any, ...], Position | None] | None = None

    def positions(self) -> dict[tuple[Any, ...], Position | None]:
        """Each key the batch creates in the table, with the position of its last creation."""
        if self._found is None:
            self._found = _changed_at(self._batch, self._ident, self._pk)[1]
        return self._found

    def __contains__(self, key: object) -> bool:
        return key in self.positions()


def _gtid_seqs(text: str | None) -> dict[int, int] | None:
    """A MariaDB GTID list (``domain-server-seq,...``) as domain -> its highest seq; None: not one."""
    if text is None:
        return None
    seqs: dict[int, int] = {}
    for part in filter(None, (g.strip() for g in text.split(","))):
        bits = part.split("-")
        if len(bits) != 3 or not all(b.isdigit() for b in bits):
            return None
        domain, seq = int(bits[0]), int(bits[2])
        seqs[domain] = max(seqs.get(domain, seq), seq)
    return seqs


def _gtid_known(position: Position | None) -> bool:
    return position is not None and _gtid_seqs(position.gtid) is not None


def _names_current(origin: str | None, piece: bool, deleted: str) -> bool | None:
    """Whether a record of the winner's delete whose change position had GTID set `origin` (after its
    transaction; before it where `piece`, a change of a split transaction) is of the delete that left
    the tombstone whose `deleted_gtid` is `deleted` (the binlog's set read inside that delete, so
    before it and after every earlier delete of the key); None: the sets cannot be compared. Per
    domain, as seqs increase in each (gtid_strict_mode)."""
    mine, theirs = _gtid_seqs(origin), _gtid_seqs(deleted)
    if mine is None or theirs is None:
        return None
    if piece:
        return all(mine.get(d, -1) >= seq for d, seq in theirs.items())
    return not all(theirs.get(d, -1) >= seq for d, seq in mine.items())


def _later(policy: ConflictPolicy, newer: int | None) -> bool:
    """Whether the batch's delete ranks after the target's own delete of the key (last writer wins)."""
    if newer is None or newer < 0:
        return False
    if newer > 0:
        return True
    mine = policy.sites.get(policy.site)
    theirs = policy.sites.get(policy.target_site or "")
    return mine is not None and theirs is not None and mine < theirs


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


TOMBSTONES_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  key_md5 CHAR(32) CHARACTER SET ascii NOT NULL PRIMARY KEY,
  table_name VARCHAR(512) NOT NULL,
  row_key LONGTEXT NOT NULL,
  stamp VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  site VARCHAR(255) NOT NULL,
  deleted_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  deleted_gtid VARCHAR(4096) CHARACTER SET ascii NULL,
  KEY by_age (deleted_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

#: `deleted_gtid`, added to a tombstones table an older setl made (only where missing)
TOMBSTONES_GTID_DDL = "ALTER TABLE {table} ADD COLUMN deleted_gtid VARCHAR(4096) CHARACTER SET ascii NULL"

ARRIVALS_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  key_md5 CHAR(32) CHARACTER SET ascii NOT NULL PRIMARY KEY,
  table_name VARCHAR(512) NOT NULL,
  row_key LONGTEXT NOT NULL,
  origin_gtid VARCHAR(4096) CHARACTER SET ascii NULL,
  origin_piece TINYINT(1) NOT NULL,
  arrived_log VARCHAR(512) NOT NULL,
  arrived_offset BIGINT UNSIGNED NOT NULL,
  arrived_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  KEY by_age (arrived_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

_INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})


def _sql_type(columns: _Columns, column: str) -> str | None:
    """The CAST type a value of `column` compares as exactly (None: as text; "timestamp": by its epoch)."""
    data_type, column_type = columns.types.get(column.lower(), ("", ""))
    if data_type in ("datetime", "time"):
        return column_type.upper()
    if data_type == "date":
        return "DATE"
    if data_type == "decimal":
        return column_type.replace("unsigned", "").replace("zerofill", "").strip().upper()
    if data_type in _INTEGERS:
        return "DECIMAL(65,0)"
    if data_type == "year":
        return "SIGNED"
    if data_type in ("float", "double"):
        return "DOUBLE"
    if data_type == "timestamp":
        return "timestamp"
    return None


def _stamp_text(columns: _Columns, policy: TablePolicy, expression: str) -> str:
    """The tombstone's `stamp` for a deleted row whose timestamp column is `expression` (NULL where
    the table's policy compares no timestamps): text the server casts back exactly (`_stamp_value`)."""
    if policy.policy != LAST_WRITER_WINS or (policy.column or "").lower() not in columns.names:
        return "NULL"
    kind = _sql_type(columns, policy.column or "")
    if kind == "timestamp":  # an instant, whatever the session's time zone
        return f"UNIX_TIMESTAMP({expression})"
    if kind is None:
        return f"CAST({expression} AS CHAR)"
    return f"CAST(CAST({expression} AS {kind}) AS CHAR)"


def _stamp_value(columns: _Columns, policy: TablePolicy, text: str) -> str:
    """A tombstone's `stamp` text as a value that compares as the timestamp column does."""
    kind = _sql_type(columns, policy.column or "")
    if kind == "timestamp":
        return f"CAST({text} AS DECIMAL(30,6))"
    if kind is None:
        return f"CAST({text} AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin"
    return f"CAST({text} AS {kind})"


def _key_json(cur: Any, pk: Sequence[str], columns: _Columns, key: Sequence[Any]) -> str:
    """The key as the triggers write it (``JSON_ARRAY`` of the key columns' values, typed as stored)."""
    parts = []
    for column, value in zip(pk, key):
        literal = cur.connection.escape(to_db(value))
        data_type, column_type = columns.types.get(column.lower(), ("", ""))
        if data_type in ("datetime", "time", "date", "decimal"):
            literal = f"CAST({literal} AS {_sql_type(columns, column)})"
        parts.append(literal)
    return f"JSON_ARRAY({', '.join(parts)})"


def _keyed(cur: Any, name: str, pk: Sequence[str], columns: _Columns, part: Sequence[tuple[Any, ...]]) -> str:
    """A derived table of `part`'s keys as (n: the index in `part`, h: the key's `_key_md5`), to join
    with a table of setl's keyed by `key_md5`."""
    return " UNION ALL ".join(f"SELECT {n} AS n, {_key_md5(cur, name, pk, columns, key)} AS h"
                              for n, key in enumerate(part))


def _key_md5(cur: Any, name: str, pk: Sequence[str], columns: _Columns, key: Sequence[Any]) -> str:
    return f"MD5(CONCAT({cur.connection.escape(name)}, ' ', {_key_json(cur, pk, columns, key)}))"


def _trigger(table: str, kind: str) -> str:
    """The name of a table's tombstone trigger (`kind`: d for delete, u for update)."""
    return f"setl_tombstone_{kind}_{hashlib.md5(table.encode()).hexdigest()[:16]}"


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
