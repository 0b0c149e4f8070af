"""The load path of an SQL target, top to bottom: what one batch (`load_batch`) or one per-table part
(`load_part`) does in its transaction on its connection, each step one function below.

``load_batch``: `begin_conflicts` (a conflicts pipeline only), `hold_fence`; `divert_quarantined`
(the changes of quarantined tables kept, not applied: `setl.sinks.sql_quarantine`); for each segment
(`apply_segments`): its tables' rows (`apply_rows`: `stage`, `settle_conflicts` in a conflicts
pipeline, then `write_table`: patches, deletes, upserts, or a keyless table in order)
or its DDL (`apply_ddl`, or a re-copy's start or end: `apply_staged`); `record_and_commit` (the
position and COMMIT); `after_commit`. ``load_part`` is the same with `fence_part` and
`skip_applied` first. ``replay_kept`` is one transaction of a quarantined table's replay. What
differs between targets is the `SqlDialect` (and its `RowWriter`); retries, the connection and
rollback on failure are `setl.sinks.sql_common.SqlLoad`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs

from setl import failpoints
from setl.errors import LoadError
from setl.model import Batch, Change, DdlChange, Op, Position, RowChange
from setl.routing import flat_name
from setl.sinks.conflicts import ConflictStep, first_images
from setl.sinks.merge import TableChanges
from setl.sinks.sql_dialect import RowWriter, SqlDialect
from setl.sinks.sql_failures import CurrentTable, refuse_replay
from setl.sinks.sql_fence import TargetFence
from setl.sinks.sql_positions import PositionStore
from setl.sinks.sql_quarantine import Quarantine, Quarantined, encode_runs
from setl.sinks.sql_rows import reads_only
from setl.sinks.sql_segments import DdlStep, Segment
from setl.sinks.sql_staging import StagedCopies

log = logging.getLogger(__name__)

C = TypeVar("C")  # a driver connection

#: Per target table of a part: (the pipeline's recorded position, read only when needed; the table's).
TablePositions = dict[str, tuple[Position | None, Position | None]]
#: Cuts a batch into segments (`setl.sinks.sql_segments`, narrowed by the dialect).
PlanSegments = Callable[[Batch], list[Segment]]


@attrs.frozen
class LoadPath(Generic[C]):
    """What the steps work with: one sink's dialect, fence, position store and re-copies, and the
    table each thread is writing (for error messages)."""

    pipeline: str
    dialect: SqlDialect[C]
    fence: TargetFence[C]
    positions: PositionStore[C]
    staged: StagedCopies[C]
    writing: CurrentTable
    #: conflicts detected, settled and recorded (a pipeline with a ``conflicts:`` block); None: none
    conflicts: ConflictStep | None = None
    quarantine: Quarantine[C] | None = None  # None: the target keeps no quarantine (never diverts)


def load_batch(path: LoadPath[C], conn: C, batch: Batch, segments: list[Segment],
               plan: PlanSegments | None = None, planned_without: frozenset[str] = frozenset(),
               encoded: Mapping[str, Sequence[tuple[int, bytes]]] | None = None) -> None:
    """One batch in its transaction: fence, quarantined tables' changes kept, segments, positions and
    COMMIT (see the module). `segments` were cut without the tables `planned_without`; `plan` cuts
    them again when other tables are diverted. `encoded`: per table of `planned_without`, its changes
    in the batch encoded ahead (`SqlLoad.prepare`)."""
    begin_conflicts(path, conn, batch)
    hold_fence(path, conn, batch)
    batch, segments = divert_quarantined(path, conn, batch, segments, plan, planned_without, encoded)
    ddl = any(isinstance(segment, DdlStep) for segment in segments)
    if ddl:  # a batch holding a DDL runs alone: it may start or end a re-copy
        path.staged.forget()
    apply_segments(path, conn, batch, segments)
    record_and_commit(path, conn, batch, (), pipeline=True)
    if path.quarantine is not None:
        path.quarantine.committed(path.fence.epoch)  # what this batch changed of the quarantine is known
    after_commit(path, conn, forget=ddl)


def load_part(path: LoadPath[C], conn: C, batch: Batch, plan: PlanSegments) -> None:
    """One per-table part in its transaction: fence and its tables' positions, the changes they
    hold already dropped, segments (`plan` cuts them), its tables' positions and COMMIT. A part of
    snapshot reads only (a chunk's share) is prepared here, on its loading thread (the scheduler
    prepares whole batches, not parts), so that it takes the dialect's bulk path for chunks (MySQL
    ``LOAD DATA``, PostgreSQL straight ``COPY``) as an ordered load does."""
    # unambiguous with dots in names; in the order the part names them
    names = {ident: flat_name(*ident) for ident in dict.fromkeys((c.schema, c.table or "") for c in batch.changes)}
    begin_conflicts(path, conn, batch)
    tables = fence_part(path, conn, batch, list(names.values()))
    batch = skip_applied(path, batch, names, tables)
    rows = path.dialect.rows
    if reads_only(batch) and rows.prepared.get(batch) is None:  # a one-table chunk batch is prepared by its worker
        rows.prepare(batch, plan)
    try:
        apply_segments(path, conn, batch, plan(batch))
    finally:
        rows.prepared.drop(batch)
    # Never backwards: after a rollback, a replay's first batches end before what parts of the
    # discarded batches after them committed already.
    moved = [table for table, (_, table_at) in tables.items() if table_at is None or batch.end > table_at]
    record_and_commit(path, conn, batch, moved, pipeline=False)
    if path.conflicts is not None:
        path.conflicts.after_commit()


# -- the steps, in the order they run


def begin_conflicts(path: LoadPath[C], conn: C, batch: Batch) -> None:
    """A conflicts pipeline: its tables and the batch's tables' tombstone triggers made once, the
    transaction REPEATABLE READ (`ConflictStep.begin`)."""
    if path.conflicts is not None:
        path.conflicts.begin(conn, batch)


def hold_fence(path: LoadPath[C], conn: C, batch: Batch) -> None:
    """In the open transaction: hold the fence row shared to COMMIT; refuse an older epoch, take
    the fence for a newer one (`TargetFence.check`)."""
    path.fence.check(conn, batch)


def divert_quarantined(path: LoadPath[C], conn: C, batch: Batch, segments: list[Segment],
                       plan: PlanSegments | None, planned_without: frozenset[str] = frozenset(),
                       encoded: Mapping[str, Sequence[tuple[int, bytes]]] | None = None) -> tuple[Batch, list[Segment]]:
    """In the open transaction, after the fence: the changes of each quarantined table (and of each
    table refused in a rolled-back attempt of this batch, marked quarantined here, from its first
    change in the batch) kept in order with their positions (`QuarantineStore.keep`), and `batch`
    without them, its segments cut again by `plan`. A re-copy's start (a snapshot TRUNCATE) of a
    quarantined table ends its quarantine, dropping what was kept: the copy brings the table to
    that point of the stream, and its later changes apply as any table's (its changes before that
    point in the batch are in the copy: dropped with what was kept). `segments` are taken as they are
    when they were cut without exactly the tables diverted (`planned_without`); a table's changes
    `encoded` ahead are kept as they are (a table held is held whole: all its changes in the batch)."""
    quarantine = path.quarantine
    if quarantine is None or not quarantine.store.available:  # no quarantine table: none quarantined
        return batch, replanned(batch, segments, plan, planned_without, frozenset())
    path.writing.table = None  # a failure keeping changes is not the table's own
    found, seqs = quarantine.known(conn, path.fence.epoch)  # no I/O but once per fence epoch
    refused = quarantine.refused()
    if not found and not refused:
        quarantine.seen(found)
        return batch, replanned(batch, segments, plan, planned_without, frozenset())
    held: dict[str, list[Change]] = {}
    rest: list[Change] = []
    released = False
    named = table_names([*found, *refused])
    for change in batch.changes:
        name = named(change)
        if name is not None:
            if isinstance(change, DdlChange) and change.snapshot and name in found:
                quarantine.settle(found, seqs)  # the set changes in this transaction
                quarantine.store.release(conn, name)  # `setl snapshot --table`: copied again from here
                log.warning("pipeline=%s stage=load table=%s position=%s: quarantine ended by a re-copy; %d "
                            "kept changes dropped", path.pipeline, name, change.position or batch.end,
                            found[name].changes)
                del found[name]
                seqs.pop(name, None)
                held.pop(name, None)
                refused.pop(name, None)
                released = True
                rest.append(change)
                continue
            held.setdefault(name, []).append(change)
        else:
            rest.append(change)
    if not held:
        if released:
            quarantine.settle(found, seqs)
        quarantine.seen(found)
        return batch, replanned(batch, segments, plan, planned_without, frozenset())
    quarantine.settle(found, seqs)  # from here the open transaction writes the quarantine
    for name, changes in held.items():
        record = found.get(name)
        if record is None:
            first = changes[0].position or batch.start
            quarantine.store.mark(conn, name, refused[name], first)
            quarantine.marked(name)
            record = Quarantined(name, refused[name], first, 0, 0)
            seqs[name] = 0  # a table quarantined anew has nothing kept (a release drops all)
            log.error("pipeline=%s stage=load table=%s position=%s: quarantined (%s); its changes are kept on "
                      "the target from here, the other tables go on. Fix the cause, then `setl resume "
                      "--pipeline %s --table %s`", path.pipeline, name, first, refused[name], path.pipeline, name)
        found[name] = quarantine.store.keep(
            conn, record, changes, last_seq=seqs.get(name, 0), runs=(encoded or {}).get(name),
            context={"pipeline": path.pipeline, "stage": "load", "table": name, "batch": batch.id,
                     "position": batch.end})
        seqs[name] = seqs.get(name, 0) + len(changes)
        failpoints.hit("quarantine_kept", batch.id, task=name)
    quarantine.settle(found, seqs)
    quarantine.seen(found)
    narrowed = batch.replace(tuple(rest))
    return narrowed, replanned(narrowed, segments, plan, planned_without, frozenset(held))


def replanned(batch: Batch, segments: list[Segment], plan: PlanSegments | None, planned_without: frozenset[str],
              diverted: frozenset[str]) -> list[Segment]:
    """`segments` when they were cut without exactly the tables `diverted`, else `batch` (the batch
    without those tables) cut again by `plan`."""
    if diverted == planned_without:
        return segments
    if plan is None:
        raise AssertionError("a batch with quarantined changes needs its segments cut again")
    return plan(batch)


def table_names(tables: Iterable[str]) -> Callable[[Change], str | None]:
    """A test of a change against the qualified names `tables`: its `qualified_table` when it is one of
    them, else None. A change whose bare table name ends none of them (almost every change of a batch:
    one set lookup) builds no qualified name."""
    wanted = frozenset(tables)
    # every part after a dot of each name: a superset of the bare table names, whatever dots names hold
    ends = frozenset(name[i + 1:] for name in wanted for i, char in enumerate(name) if char == ".")

    def named(change: Change) -> str | None:
        table = change.table
        if not table or table not in ends:
            return None
        name = change.qualified_table
        return name if name in wanted else None
    return named


def split_tables(changes: Sequence[Change], tables: Collection[str]) -> tuple[dict[str, list[Change]], list[Change]]:
    """The changes of `tables` by table, in order, and the others, in order (one pass, `table_names`)."""
    if not tables:
        return {}, list(changes)
    named = table_names(tables)
    held: dict[str, list[Change]] = {}
    rest: list[Change] = []
    for change in changes:
        name = named(change)
        if name is None:
            rest.append(change)
        else:
            held.setdefault(name, []).append(change)
    return held, rest


def divert_ahead(batch: Batch, tables: frozenset[str]
                 ) -> tuple[frozenset[str], dict[str, list[tuple[int, bytes]]], Batch] | None:
    """On a worker, ahead of the load: which of `tables` (quarantined as last seen) `batch` touches,
    their changes encoded as `divert_quarantined` keeps them, and `batch` without them; None when it
    touches none of them."""
    held, rest = split_tables(batch.changes, tables)
    if not held:
        return None
    encoded = {name: encode_runs(changes) for name, changes in held.items()}
    return frozenset(held), encoded, batch.replace(tuple(rest))


def without_tables(batch: Batch, tables: frozenset[str]) -> Batch:
    """`batch` without the changes of `tables` (as `divert_quarantined` leaves them out)."""
    return batch.replace(tuple(split_tables(batch.changes, tables)[1]))


def replay_kept(path: LoadPath[C], conn: C, table: str, chunk: int, number: int, plan: PlanSegments
                ) -> tuple[bool, int, int]:
    """One transaction of `SqlLoad.replay` (`number`, from 0): with the fence row held exclusively
    (no batch commits meanwhile), the first `chunk` changes kept for quarantined `table` applied in
    order (`apply_segments` of them as one batch, cut by `plan`) and dropped; when none is left, the
    quarantine ended. Returns (quarantine ended, changes applied, changes left)."""
    if path.quarantine is None:
        raise LoadError(f"a {path.dialect.name} target keeps no quarantine", pipeline=path.pipeline, stage="load")
    store = path.quarantine.store
    epoch = store.lock_loads(conn) or 0
    found = store.read(conn).get(table)
    if found is None:
        raise LoadError(f"table {table} is not quarantined (nothing to replay)", pipeline=path.pipeline,
                        stage="load", table=table)
    refuse_replay(path.pipeline, found)
    read = store.first_kept(conn, table, chunk)  # whole kept rows: at most one run more than `chunk`
    kept = read[:chunk]
    # A DDL commits on some targets: it goes alone, and never in the transaction that ends the quarantine.
    ddl = next((i for i, k in enumerate(kept) if isinstance(k.change, DdlChange)), None)
    if ddl is not None:
        kept = kept[:max(ddl, 1)]
    if not kept:
        store.release(conn, table)
        failpoints.hit("quarantine_replay", number, task=table)
        path.dialect.commit(conn)
        path.quarantine.forget()
        log.warning("pipeline=%s stage=load table=%s: replay done, quarantine ended; the table follows the "
                    "stream again", path.pipeline, table)
        return True, 0, 0
    changes = tuple(k.change for k in kept)
    end = next((c.position for c in reversed(changes) if c.position is not None), found.first)
    batch = Batch(path.pipeline, 0, epoch, found.first, end, changes)
    path.fence.epoch = max(path.fence.epoch, epoch)  # the replay never takes the fence from the pipeline
    apply_segments(path, conn, batch, plan(batch))
    if not path.dialect.transactional_ddl and ddl is not None:
        store.lock_loads(conn)  # the DDL committed: hold the loads off again for the bookkeeping
    left = store.drop_kept(conn, found, read, len(kept))
    failpoints.hit("quarantine_replay", number, task=table)
    path.dialect.commit(conn)
    path.quarantine.forget()
    return False, len(kept), left.changes


def fence_part(path: LoadPath[C], conn: C, batch: Batch, tables: Sequence[str]) -> TablePositions:
    """`hold_fence` for a part, reading its first table's position with the fence in one round trip
    (`PositionStore.fence_and_table_position`) and the others' apart, locked to COMMIT. A table at
    or before the batch's start holds none of its changes: then the pipeline's position is not read
    (a round trip less per part in the common case)."""
    first = tables[0] if tables else None
    first_at = path.fence.check(conn, batch, first)
    found: TablePositions = {}
    for table in tables:
        path.writing.table = table
        table_at = first_at if table == first else path.positions.table_position_locked(conn, table)
        check = table_at is not None and table_at > batch.start  # may it hold some changes already?
        found[table] = (path.positions.pipeline_position(conn) if check else None, table_at)
    path.writing.table = None
    return found


def skip_applied(path: LoadPath[C], batch: Batch, names: Mapping[tuple[str, str], str],
                 tables: TablePositions) -> Batch:
    """`batch` without the changes its tables hold already (`not_yet_applied`), logged."""
    checked = {table: at for table, at in tables.items() if at[1] is not None and at[1] > batch.start}
    keep = not_yet_applied(batch, names, checked) if checked else batch.changes
    if len(keep) < len(batch.changes):
        log.info("pipeline=%s stage=load batch=%s: %d of %d changes of %s are in the target "
                 "already; skipped", path.pipeline, batch.id, len(batch.changes) - len(keep),
                 len(batch.changes), ", ".join(tables))
    return batch.replace(tuple(keep)) if keep is not batch.changes else batch


def apply_segments(path: LoadPath[C], conn: C, batch: Batch, segments: list[Segment]) -> None:
    """Each segment in batch order: the merged rows of its tables, or one DDL. A conflicts pipeline
    compares the target with each key's state before the segment's changes (`first_images`)."""
    changes = None if path.conflicts is None else path.dialect.narrow(batch).changes
    start = 0  # where the segment's changes start in `changes`
    for n, segment in enumerate(segments):
        if isinstance(segment, list):
            expected = None
            if changes is not None:
                end = next((s.index for s in segments[n + 1:] if isinstance(s, DdlStep)), len(changes))
                expected = first_images(changes[start:end], path.pipeline)
            apply_rows(path, conn, segment, batch, expected)
            continue
        start = segment.index + 1
        if not apply_staged(path, conn, batch, segment):
            apply_ddl(path, conn, batch, segment)
    path.writing.table = None


def apply_rows(path: LoadPath[C], conn: C, tables: list[TableChanges], batch: Batch,
               expected: dict[tuple[str, str], dict[tuple[Any, ...], Any]] | None = None) -> None:
    """Each table's merged changes: aimed at its staging table while it is re-copied (`stage`),
    settled against the target's rows in a conflicts pipeline (`settle_conflicts`), then written
    (`write_table`)."""
    for table in tables:
        path.writing.table = f"{table.schema}.{table.table}"
        staged = stage(path, conn, table)
        if expected is not None and staged is table:  # a table being re-copied takes its copy's rows
            staged = settle_conflicts(path, conn, batch, table, expected)
        write_table(path.dialect.rows, conn, staged)


def settle_conflicts(path: LoadPath[C], conn: C, batch: Batch, table: TableChanges,
                     expected: dict[tuple[str, str], dict[tuple[Any, ...], Any]]) -> TableChanges:
    """`table`'s changes less those the target's row wins, every conflict recorded in the same
    transaction (`ConflictStep.settle`)."""
    assert path.conflicts is not None
    return path.conflicts.settle(conn, batch, table, expected)


def stage(path: LoadPath[C], conn: C, table: TableChanges) -> TableChanges:
    """`table`'s changes, renamed to its staging table while it is being re-copied (`StagedCopies`)."""
    return path.staged.redirect(conn, table)


def write_table(rows: RowWriter[C], conn: C, table: TableChanges) -> None:
    """A keyed table's patches (keys none of its deletes and upserts touch: any order), deletes,
    then upserts; a keyless table's changes in order."""
    if not table.primary_key:
        rows.in_order(conn, table)
        return
    if table.patches:
        rows.patch(conn, table)
    rows.delete(conn, table)
    rows.upsert(conn, table)


def apply_staged(path: LoadPath[C], conn: C, batch: Batch, step: DdlStep) -> bool:
    """A re-copy's start (a snapshot TRUNCATE of a table holding rows) or end (`copy_end`), applied
    (`StagedCopies`); False for any other DDL, and for a TRUNCATE to apply as it is."""
    change = step.change
    path.writing.table = change.qualified_table
    if change.copy_end:
        path.staged.end(conn, batch, change)
    elif not (change.snapshot and step.statement.kind == "truncate_table"
              and path.staged.start(conn, batch, change)):
        return False
    refence_after_ddl(path, conn, batch)
    return True


def apply_ddl(path: LoadPath[C], conn: C, batch: Batch, step: DdlStep) -> None:
    """One table DDL (`SqlDialect.apply_ddl`), the fence taken again where DDL commits, and the
    re-copy of a table it alters dropped (`StagedCopies.altered`)."""
    change = step.change
    path.writing.table = change.qualified_table
    path.dialect.apply_ddl(conn, batch, step)
    if path.conflicts is not None:
        path.conflicts.forget()
        path.conflicts.guard_created(conn, change.schema, change.table or "", str(change.position or batch.end))
    refence_after_ddl(path, conn, batch)
    if path.staged.altered(conn, change, step.statement):
        refence_after_ddl(path, conn, batch)
    log.info("pipeline=%s stage=load batch=%d table=%s position=%s DDL applied: %s", path.pipeline,
             batch.id, change.qualified_table, change.position or batch.end, " ".join(change.statement.split()))


def refence_after_ddl(path: LoadPath[C], conn: C, batch: Batch) -> None:
    """After DDL (a staging table's included): a target whose DDL commits (MySQL) holds the fence
    again in the new transaction."""
    if not path.dialect.transactional_ddl:
        path.fence.check(conn, batch)


def record_and_commit(path: LoadPath[C], conn: C, batch: Batch, tables: Sequence[str], *, pipeline: bool) -> None:
    """The batch's end position for `tables` (a part's) or the pipeline, then COMMIT, in one round
    trip where the dialect can (`PositionStore.record_and_commit`)."""
    path.positions.record_and_commit(conn, batch, tables, pipeline=pipeline)


def after_commit(path: LoadPath[C], conn: C, *, forget: bool) -> None:
    """Drop the staging tables the batch let go where DDL is not transactional; `forget` (a batch
    that held DDL): read the re-copies again at next use."""
    path.staged.after_commit(conn)
    if path.conflicts is not None:
        path.conflicts.after_commit()
    if forget:
        path.staged.forget()


def not_yet_applied(batch: Batch, names: Mapping[tuple[str, str], str],
                    tables: Mapping[str, tuple[Position | None, Position | None]]) -> Sequence[Change]:
    """The changes of a per-table part `batch` its tables do not hold yet. `names` maps each
    (schema, table) of the batch to its target table; `tables` gives the (pipeline position,
    table position) recorded for the target tables to check (the others are kept whole). A row
    change is in already when its position is after the pipeline's recorded position and at or
    before its table's: an earlier part of a discarded batch committed it. A snapshot row (READ)
    is the table's state at its place in the stream: never skipped."""
    keep: list[Change] = []
    for change in batch.changes:
        pipeline_at, table_at = tables.get(names[(change.schema, change.table or "")], (None, None))
        if (table_at is not None and isinstance(change, RowChange) and change.position is not None
                and change.op is not Op.READ and change.position <= table_at
                and (pipeline_at is None or change.position > pipeline_at)):
            continue
        keep.append(change)
    return keep


__all__ = ["LoadPath", "apply_segments", "load_batch", "load_part", "not_yet_applied", "replay_kept",
           "divert_ahead", "split_tables", "table_names", "without_tables"]
