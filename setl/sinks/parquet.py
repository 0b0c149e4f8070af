"""A directory of Parquet files as the target: the change log of every table, one file per batch.

Layout: ``PATH/SCHEMA.TABLE/[COL=VALUE/...]part-LOG-OFFSET[_ROW]-bBATCH-eEPOCH.parquet``
(`table_directory`: ``%``, ``.``, ``/``, ``\\`` and control characters in SCHEMA and TABLE are
%XX-quoted, so ``s``.``a.b`` and ``s.a``.``b`` get directories of their own), where
``LOG-OFFSET`` is the batch's *start* position (the log name URL-quoted, the
offset zero-padded to 20 digits; ``_ROW``, zero-padded to 10 digits, only for a
batch that starts inside a transaction delivered in pieces), ``BATCH`` the batch's id (20 digits)
and ``EPOCH`` the epoch of the attempt that wrote it (10 digits), and ``COL=VALUE`` are hive
partitions of the ``partition_by`` columns (``__HIVE_DEFAULT_PARTITION__`` for NULL). The start
position alone does not tell batches apart: a snapshot's chunks are handed on where the stream
is, so several batches (and the streamed batch after them) can start at one position. The batch
id does: two batches never share a name. One directory belongs to one pipeline (recorded in
``PATH/.setl-pipeline``).

Each row is one change, in these columns:

* the table's columns: the after image, or the before image for a delete;
* ``_setl_op`` (string): ``insert``, ``update``, ``delete``, ``read`` (a row
  an initial snapshot copied, as Debezium's ``r``) or ``truncate`` (a ``TRUNCATE
  TABLE``: the one a snapshot hands on before copying a table, or the source's;
  its image columns are NULL, and with ``partition_by`` it is in the NULL partition);
* ``_setl_batch`` (int64): the id of the batch that wrote the row;
* ``_setl_position`` (string): the source position after the change's
  transaction, as text (``LOG:OFFSET``, with its GTID when it has one;
  ``LOG:OFFSET+ROW`` for a change of a transaction delivered in pieces);
* ``_setl_log`` (string) and ``_setl_offset`` (int64): that position's log file
  and offset, the order of transactions (binlog file names are zero-padded, so
  they sort as text);
* ``_setl_row`` (int64): that position's row: 0, or for a change of a
  transaction delivered in pieces (whose changes all have the transaction's
  start offset) its 1-based ordinal in the transaction;
* ``_setl_seq`` (int64): the change's index in its batch (the order within it);
* ``_setl_before_<column>`` for each primary-key column (for every column when
  the table has no primary key): on ``update`` rows the before image's value,
  NULL on other rows, so an update that changes the key says which row it replaces.

Applying the log: read every file (``pyarrow.parquet.read_table(PATH/SCHEMA.TABLE,
partitioning="hive")``), order rows by (``_setl_log``, ``_setl_offset``,
``_setl_row``, ``_setl_batch``, ``_setl_seq``), and for each
row: ``insert`` or ``read``: put the image under its key (a read replaces the
row the key holds; a source stamps reads with positions in stream order like
any change, so they sort where they came); ``update``: remove the row under the
``_setl_before_*`` key, then put the image under its key; ``delete``: remove the
row under its key; ``truncate``: remove every row (a re-copy's rows follow it).
``_setl_batch`` orders rows of one position written by different batches: a
snapshot's TRUNCATE and chunks sit at the position of the binlog transaction
before them, whose changes have that position too.

Replays: every start and every rollback reads again from the acknowledged
position in a new epoch (epochs only grow: the meta store hands them out), with
the batch id after the acknowledged one, and loads batches in id order. So a
file whose batch id is at least the loading batch's and whose epoch is older
was written by an attempt that was never acknowledged, and its changes are read
again in this epoch. Before writing its files, the first batch an epoch loads
removes exactly those files, in every table directory (a differently cut
earlier attempt may have written tables this one does not touch); files of
lower batch ids (acknowledged) and of the current epoch are never removed. The
same attempt loaded twice writes the same names and replaces its own files.
Files named before batch ids and epochs were part of the name
(``part-LOG-OFFSET[_ROW].parquet``) count as acknowledged and are never
removed. Each file is written to a hidden temp file that is fsynced and renamed
into place, so a reader never sees half a file. After a crash (kill -9 at any
point) the directory holds the acknowledged batches' files, intact, plus
possibly files of the unacknowledged attempt, which the replay's first load
removes; the position is acked only after all of a batch's files are written,
so the files of batches up to the acked position are exact. A temp file a crash
left behind is removed the next time the target is opened. The sweep sees the
files indexed at `open` and those this process wrote: a file a deposed leader
would write after the new leader's first load is not among them.

Spatial columns (`setl.values.Geometry`) are written as binary holding the OGC WKB of each value
(readable by GeoPandas, DuckDB's ``ST_GeomFromWKB``, ...); the SRID is not kept.

Writers (``writer:`` in the target config): ``arrow`` (the default) writes each
file with pyarrow in the node's process; ``spark`` gives the same Arrow table
to Spark's Parquet writer on the node's SparkSession (started on the first
write), ``coalesce(1)`` into a hidden directory beside the file, and renames
its one part file into place. Layout, names, partitions (still split by setl),
replays and columns are the same, and the files stay readable with plain
pyarrow. What Spark cannot hold differs: decimals wider than 38 digits are
written as text, durations (MySQL ``TIME``) as int64 microseconds. Timestamps
are INT64 microseconds (never INT96); naive ones stay naive. The Spark writer
needs the target path at the same place on the driver and the executors
(``local[*]``, or a shared mount).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import pyarrow as pa
import pyarrow.parquet as pq

from setl.config import SparkConfig
from setl.errors import LoadError, RefusedLoadError, SetlError
from setl.model import Batch, DdlChange, Op, Position, RowChange, partial_image_refusal
from setl.routing import flat_name
from setl.sinks.invalid_dates import InvalidDatePolicy
from setl.spark import brief, find_java, from_arrow, get_session
from setl.stages.load import Load, LoadCapabilities
from setl.transforms.frames import GEOMETRY, PARQUET_MAX_PRECISION, SPARK_MAX_PRECISION, TableTypes, column_array


@attrs.frozen
class ParquetTargetConfig:
    """A pipeline's ``target:`` for ``type: parquet`` (docs/config-reference.md)."""

    type: Literal["parquet"]
    path: str  # the folder holding one dataset per table (relative to the conf directory)
    partition_by: tuple[str, ...] = ()  # columns the datasets are partitioned by (hive layout)
    writer: Literal["arrow", "spark"] = "arrow"  # arrow (pyarrow in the node) or Spark's Parquet writer
    #: what to write for a zero or partial date (`setl.sinks.invalid_dates`): refuse or null
    invalid_dates: Literal["refuse", "null"] = "refuse"


log = logging.getLogger(__name__)

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
BEFORE_PREFIX = "_setl_before_"
#: ``_setl_op`` of a TRUNCATE TABLE (the snapshot's before a copy, or the source's): the table is empty after it
TRUNCATE = "truncate"
OWNER_FILE = ".setl-pipeline"
WRITERS = ("arrow", "spark")
#: Spark SQL settings of the writer's own session: timestamps as INT64 micros, as pyarrow writes them.
SPARK_WRITER_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
_FILE = re.compile(r"^part-(?P<log>.+)-(?P<offset>\d{20})(?:_(?P<row>\d{10}))?"
                   r"(?:-b(?P<batch>\d{20})-e(?P<epoch>\d{10}))?\.parquet$")
#: What an interrupted write leaves: a hidden temp file, or the Spark writer's staging directory beside it.
_LEFTOVER = re.compile(r"^\.part-.+\.parquet\.[0-9a-f]{32}\.(?:tmp|spark)$")


def file_name(start: Position, batch: int, epoch: int) -> str:
    """The file name of a batch's output: its start position (sortable by offset and row), then its
    batch id and epoch, so no two batches (a copy's chunks at one position, the stream after them)
    and no two attempts of one batch share a name."""
    row = f"_{start.row:010d}" if start.row else ""
    return (f"part-{urllib.parse.quote(start.log, safe='.-_')}-{start.offset:020d}{row}"
            f"-b{batch:020d}-e{epoch:010d}.parquet")


def table_directory(schema: str, table: str) -> str:
    """The directory name of a target table: ``SCHEMA.TABLE``, each part %XX-quoted where it holds
    ``%``, ``.``, ``/``, ``\\`` or a control character (`setl.routing.flat_name`)."""
    return flat_name(schema, table)


#: A file's place: its batch's start (log, offset, row), then the batch id and epoch (0 and 0 for a
#: file named before ids and epochs were part of the name: never removed by a replay).
FileKey = tuple[str, int, int, int, int]


def _key_of(name: str) -> FileKey | None:
    match = _FILE.match(name)
    if match is None:
        return None
    return (urllib.parse.unquote(match.group("log")), int(match.group("offset")), int(match.group("row") or 0),
            int(match.group("batch") or 0), int(match.group("epoch") or 0))


def _partition_segment(column: str, value: Any) -> str:
    text = NULL_PARTITION if value is None else (value.isoformat() if hasattr(value, "isoformat") else str(value))
    return f"{column}={urllib.parse.quote(text, safe='')}"


class ParquetLoad(Load):
    """Writes each batch's row changes per target table as Parquet files (see the module docstring).

    `writer` is ``arrow`` or ``spark``. For ``spark``, `session` returns the
    SparkSession (by default `setl.spark.get_session(spark)`); it is called on
    the first write, and the writer uses a child session of it
    (``newSession()``, same JVM) carrying `SPARK_WRITER_CONF`, so the shared
    session's settings stay as they are.
    """

    # Not per_table: the replay sweep (`_sweep`) relies on batches loading in id order.
    capabilities = LoadCapabilities(creates_tables=True)

    def __init__(
        self,
        path: str | Path,
        *,
        partition_by: Sequence[str] = (),
        pipeline: str = "",
        fsync: bool = True,
        writer: str = "arrow",
        spark: SparkConfig | None = None,
        session: Callable[[], Any] | None = None,
        invalid_dates: str = "refuse",
    ) -> None:
        if writer not in WRITERS:
            raise ValueError(f"writer must be one of {', '.join(WRITERS)}, got {writer!r}")
        self.root = Path(path)
        self.partition_by = tuple(partition_by)
        self.pipeline = pipeline
        self.fsync = fsync
        self.writer = writer
        self.spark = spark
        self._session_factory = session
        self._spark_session: Any = None
        self._spark_lock = threading.Lock()
        # Spark holds decimals of up to 38 digits; wider ones go as text (the codec of frames.py)
        self._max_precision = SPARK_MAX_PRECISION if writer == "spark" else PARQUET_MAX_PRECISION
        self._opened = False
        self._found: bool | None = None  # the directory held this pipeline's output at the first open
        self._marked = False  # this process wrote the directory's owner marker
        self._files: dict[Path, FileKey] = {}  # every file under root, with its place
        self._swept: tuple[int, int] | None = None  # (epoch, batch id) of the last replay sweep (`_sweep`)
        self._lock = threading.Lock()  # guards the file index `_files`
        self._schemas: dict[str, dict[str, pa.DataType]] = {}
        self._invalid_dates = InvalidDatePolicy(invalid_dates, pipeline=pipeline, target="Parquet")

    @classmethod
    def from_config(cls, config: ParquetTargetConfig, *, pipeline: str = "",
                    spark: SparkConfig | None = None) -> "ParquetLoad":
        if config.writer == "spark":
            try:
                find_java()  # Spark itself starts with the first write
            except SetlError as exc:
                exc.with_context(pipeline=pipeline or None, stage="load")  # the same exception, named
                raise
        return cls(config.path, partition_by=config.partition_by, pipeline=pipeline, writer=config.writer,
                   spark=spark, invalid_dates=config.invalid_dates)

    def open(self) -> None:
        """Create the root, index the files already there and remove half-written ones (one directory walk).

        A write interrupted by a crash leaves its hidden temp file (or the Spark
        writer's staging directory) behind; the directory belongs to this
        pipeline alone, so at open they can only be leftovers.
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LoadError(f"cannot create {self.root}: {exc.strerror}", pipeline=self.pipeline or None) from exc
        self._claim()
        self._files, self._swept = {}, None
        for folder, dirs, names in os.walk(self.root):
            for name in [d for d in dirs if _LEFTOVER.match(d)]:
                log.info("pipeline=%s stage=load removing %s, left by an interrupted write", self.pipeline,
                         Path(folder) / name)
                shutil.rmtree(Path(folder) / name, ignore_errors=True)
                dirs.remove(name)
            for name in names:
                if _LEFTOVER.match(name):
                    log.info("pipeline=%s stage=load removing %s, left by an interrupted write", self.pipeline,
                             Path(folder) / name)
                    (Path(folder) / name).unlink(missing_ok=True)
                    continue
                key = _key_of(name)
                if key is not None:
                    self._files[Path(folder) / name] = key
        self._opened = True

    def _claim(self) -> None:
        # Replays delete files by position, so two pipelines must never share a directory.
        if not self.pipeline:
            return
        marker = self.root / OWNER_FILE
        try:
            owner = marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            marker.write_text(self.pipeline + "\n", encoding="utf-8")
            self._marked = True
            if self._found is None:
                self._found = False
            return
        if self._found is None:
            self._found = True
        if owner != self.pipeline:
            raise LoadError(f"{self.root} holds the output of pipeline {owner!r}; give each pipeline its own path",
                            pipeline=self.pipeline, stage="load")

    def committed(self) -> Position | None:
        return None

    def holds_output(self) -> bool:
        """Whether the directory held this pipeline's output (its owner marker) when first opened,
        or, not opened yet, holds it now (`setl.pipeline.identity`: a changed path, or files gone)."""
        if self._found is not None or not self.pipeline:  # no pipeline name: nothing is claimed or judged
            return self._found is not False
        return (self.root / OWNER_FILE).is_file()

    def own(self) -> None:
        """An accepted start: the directory is the pipeline's output from now on (`holds_output`),
        its marker kept."""
        self._found = True
        self._marked = False

    def disown(self) -> None:
        """A refused start: remove the owner marker this process wrote, so the directory is left as
        it was found (the next start sees it still holds nothing of the pipeline)."""
        if self._marked:
            (self.root / OWNER_FILE).unlink(missing_ok=True)
            self._marked = False

    def close(self) -> None:
        self._opened = False

    def load(self, batch: Batch) -> None:
        if not self._opened:
            self.open()
        batch = self._invalid_dates.apply(batch)
        tables: dict[tuple[str, str], list[tuple[int, RowChange | DdlChange]]] = {}
        for seq, change in enumerate(batch.changes):
            if isinstance(change, DdlChange) and change.copy_end:
                continue  # a copy's end: every row of the copy is written already
            if isinstance(change, DdlChange) and change.ddl.kind == "truncate_table" and change.table is not None:
                # a snapshot's (the copy that follows replaces the table) or the source's: a truncate row
                tables.setdefault((change.schema, change.table), []).append((seq, change))
                continue
            if isinstance(change, DdlChange):
                _skip_ddl(self.pipeline or batch.pipeline, batch, change)
                continue
            if change.partial:  # a change log row holds whole images: an absent column would read as NULL
                raise RefusedLoadError(
                    partial_image_refusal(f"a partial {change.op.value}", str(change.source or change.qualified_table),
                                          "the Parquet change log holds whole row images"),
                    pipeline=self.pipeline or batch.pipeline, stage="load", table=change.qualified_table,
                    batch=batch.id, position=change.position or batch.end)
            tables.setdefault((change.schema, change.table), []).append((seq, change))
        try:
            self._sweep(batch)
        except OSError as exc:
            raise LoadError(f"removing a file of an unacknowledged earlier attempt failed: {exc}",
                            pipeline=self.pipeline or batch.pipeline, stage="load", batch=batch.id,
                            position=batch.start) from exc
        for (schema, table), changes in tables.items():
            name = table_directory(schema, table)
            try:
                self._write_table(batch, name, changes)
            except SetlError as exc:  # a LoadError, or Spark failing to start for writer: spark
                exc.with_context(pipeline=self.pipeline or batch.pipeline, stage="load", table=name,
                                 batch=batch.id, position=batch.start)
                raise
            except (OSError, pa.ArrowException) as exc:
                raise LoadError(f"writing Parquet failed: {type(exc).__name__}: {exc}",
                                pipeline=self.pipeline or batch.pipeline, stage="load", table=name,
                                batch=batch.id, position=batch.start) from exc

    # --- writing ----------------------------------------------------------------------------

    def _write_table(self, batch: Batch, name: str, changes: list[tuple[int, RowChange | DdlChange]]) -> list[Path]:
        # a truncate row (a DDL is a batch of its own) has no image: NULL partition values, no columns
        truncate = isinstance(changes[0][1], DdlChange)
        row_changes = [(seq, c) for seq, c in changes if isinstance(c, RowChange)]
        images = ([dict.fromkeys(self.partition_by) for _ in changes] if truncate else
                  [change.after if change.op is not Op.DELETE else change.before for _, change in row_changes])
        missing = [c for c in self.partition_by if not c.startswith("_setl_")
                   and any(c not in image for image in images)]  # type: ignore[operator]
        if missing:
            raise LoadError(f"partition column {', '.join(missing)} is not in the table's rows")
        meta = _meta_columns(batch, changes, [TRUNCATE] * len(changes) if truncate else
                             [change.op.value for _, change in row_changes])
        types = TableTypes(max_precision=self._max_precision, widen_decimals=True)
        table, codecs = types.table(images, extra=meta)  # type: ignore[arg-type]
        for column, codec in codecs.items():
            if codec == GEOMETRY:
                at = table.column_names.index(column)
                table = table.set_column(at, column, _wkb(table.column(at)))
        if not truncate:
            for column, array in _before_key(row_changes, types):
                table = table.append_column(column, array)
        table = self._conform(name, table)
        if truncate:  # every column the table's files have, all NULL: a reader may take its schema from this file
            known = self._schemas[name]
            for column in [c for c in known if c not in table.column_names and c not in self.partition_by]:
                table = table.append_column(column, pa.nulls(table.num_rows, known[column]))
        directory = self.root / name
        if not self.partition_by:
            return [self._write_file(directory, table, batch)]
        groups: dict[tuple[Any, ...], list[int]] = {}
        columns = [table.column(c).to_pylist() for c in self.partition_by]
        for row in range(table.num_rows):
            groups.setdefault(tuple(col[row] for col in columns), []).append(row)
        data = table.drop_columns(list(self.partition_by))
        paths = []
        for values, rows in groups.items():
            folder = directory.joinpath(*(_partition_segment(c, v) for c, v in zip(self.partition_by, values)))
            paths.append(self._write_file(folder, data.take(pa.array(rows, pa.int64())), batch))
        return paths

    def _conform(self, name: str, table: pa.Table) -> pa.Table:
        """Keep one type per column across the table's files, so the directory reads as one dataset.

        A column's type is the one earlier files gave it; a batch whose values
        are all NULL (Arrow type ``null``) or that lacks the column takes it. A
        column that gets its first type, or that a table gains (``ADD COLUMN``),
        is added to the earlier files that hold it as ``null`` or not at all
        (`_backfill`), as is whatever a crash left undone on the first write
        after `open`. A change of type no lossless cast covers is a `LoadError`:
        a dataset holds one type per column.
        """
        known = self._schemas.get(name)
        first = known is None
        if known is None:
            known = self._schemas[name] = self._schema_on_disk(name)
        columns, learned = [], first
        for field, column in zip(table.schema, table.columns):
            want = known.get(field.name)
            if want is not None and want != field.type:
                try:
                    cast = column.cast(want)
                    lossless = pa.types.is_null(field.type) or cast.cast(field.type).equals(column)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    lossless = False
                if not lossless:
                    raise LoadError(f"column {field.name} changes type from {want} to {field.type}; the table's "
                                    f"Parquet files hold one type per column (write the table to a new path)")
                column = cast
            elif want is None and not pa.types.is_null(field.type):
                known[field.name] = field.type
                learned = True
            columns.append(column)
        if learned:
            self._backfill(name, known)
        return pa.Table.from_arrays(columns, names=table.column_names)

    def _table_files(self, name: str) -> list[Path]:
        """The table's files, oldest start first."""
        directory = self.root / name
        with self._lock:
            found = [(key, path) for path, key in self._files.items() if directory in path.parents]
        return [path for _, path in sorted(found)]

    def _schema_on_disk(self, name: str) -> dict[str, pa.DataType]:
        """Each column's type in the table's files (the newest file's, where they differ); ``null`` ones left out."""
        known: dict[str, pa.DataType] = {}
        for path in self._table_files(name):
            try:
                schema = pq.read_schema(path)
            except (OSError, pa.ArrowException):
                continue
            known.update((f.name, f.type) for f in schema if not pa.types.is_null(f.type))
        return known

    def _backfill(self, name: str, known: dict[str, pa.DataType]) -> None:
        """Rewrite the table's files that hold a `known` column as ``null`` or lack it, adding it typed (all NULL).

        Only NULLs are added, so a file's rows stay what they were; a plain
        `pyarrow.dataset` reader, which takes the schema of one file, then
        sees every column with its one type. The rewritten file is pyarrow's,
        without the Spark writer's schema metadata (Spark reads it like its own).
        """
        wanted = {c: t for c, t in known.items() if c not in self.partition_by}
        for path in self._table_files(name):
            try:
                schema = pq.read_schema(path)
            except FileNotFoundError:
                continue
            have = {f.name: f.type for f in schema}
            missing = [c for c, t in wanted.items() if c not in have or (pa.types.is_null(have[c]) and t != have[c])]
            if not missing:
                continue
            data = pq.ParquetFile(path).read()
            # the Spark writer's own copy of the schema would still give the old type to Spark readers
            data = data.replace_schema_metadata({k: v for k, v in (data.schema.metadata or {}).items()
                                                 if not k.startswith(b"org.apache.spark.")})
            for column in missing:
                if column in have:
                    i = data.schema.get_field_index(column)
                    data = data.set_column(i, column, data.column(i).cast(wanted[column]))
                else:
                    data = data.append_column(column, pa.nulls(data.num_rows, wanted[column]))
            log.info("pipeline=%s stage=load table=%s adding typed column %s to %s", self.pipeline, name,
                     ", ".join(missing), path)
            self._replace_whole(path, functools.partial(self._write_arrow, data))

    def _write_file(self, folder: Path, table: pa.Table, batch: Batch) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        start = batch.start
        final = folder / file_name(start, batch.id, batch.epoch)
        write = self._write_spark if self.writer == "spark" else self._write_arrow
        self._replace_whole(final, functools.partial(write, table))
        with self._lock:
            self._files[final] = (start.log, start.offset, start.row, batch.id, batch.epoch)
        return final

    def _replace_whole(self, path: Path, write: Callable[[Path], None]) -> None:
        """Put a file at `path` whole or not at all: `write` fills a hidden temp file beside it, which then
        replaces `path` (a reader or a crash sees the old file or the new one, never part of one)."""
        temp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        try:
            write(temp)
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if self.fsync:
            _fsync(path.parent)

    def _write_arrow(self, table: pa.Table, temp: Path) -> None:
        with open(temp, "wb") as fh:
            pq.write_table(table, fh, compression="snappy")
            if self.fsync:
                fh.flush()
                os.fsync(fh.fileno())

    def _write_spark(self, table: pa.Table, temp: Path) -> None:
        """Spark writes one part file into a hidden directory beside `temp`; it becomes `temp`."""
        session = self._spark()  # a Spark that cannot start raises its own SparkStartError (exit code 2)
        staging = temp.with_suffix(".spark")
        try:
            try:
                frame = from_arrow(session, table)
                frame.coalesce(1).write.mode("overwrite").option("compression", "snappy").parquet(str(staging))
            except Exception as exc:  # py4j and pyspark errors share no base class
                raise LoadError(f"Spark could not write Parquet: {brief(exc)}") from exc
            parts = sorted(staging.glob("part-*.parquet"))
            if len(parts) != 1:
                raise LoadError(f"Spark wrote {len(parts)} part files instead of one into {staging}")
            os.replace(parts[0], temp)
            if self.fsync:
                _fsync(temp)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _spark(self) -> Any:
        with self._spark_lock:
            if self._spark_session is None:
                if self._session_factory is not None:
                    parent = self._session_factory()
                else:
                    parent = get_session(self.spark)
                session = parent.newSession()
                for key, value in SPARK_WRITER_CONF.items():
                    session.conf.set(key, value)
                self._spark_session = session
            return self._spark_session

    # --- replays ----------------------------------------------------------------------------

    def _sweep(self, batch: Batch) -> None:
        """Delete every file of an earlier epoch whose batch id is `batch`'s or later, before its files are written.

        Epochs only grow (each start and each rollback takes a new one from the
        meta store), and a new epoch reads again from the ack with the next
        batch id after the acked one, loading batches in id order: such a file
        was written by an attempt never acknowledged, whose changes this epoch
        reads again. Files of an earlier batch id (acknowledged, or replaced by
        an earlier sweep) and of this epoch are never touched. After an epoch's
        first sweep nothing older is left to find, so later batches skip it.
        """
        swept = self._swept
        if swept is not None and swept[0] == batch.epoch and swept[1] <= batch.id:
            return
        with self._lock:
            stale = [(key, path) for path, key in self._files.items()
                     if key[3] >= batch.id and 0 < key[4] < batch.epoch]
        for key, path in sorted(stale):
            log.info("pipeline=%s stage=load batch=%d epoch=%d removing %s, written by batch %d of epoch %d and "
                     "never acknowledged", self.pipeline, batch.id, batch.epoch, path, key[3], key[4])
            path.unlink(missing_ok=True)
            with self._lock:
                self._files.pop(path, None)
        if stale and self.fsync:
            for folder in {path.parent for _, path in stale}:
                _fsync(folder)
        self._swept = (batch.epoch, batch.id)


def _skip_ddl(pipeline: str, batch: Batch, change: DdlChange) -> None:
    """A DDL the Parquet target does not apply (its files take each batch's columns as they come):
    logged; one its table's ``schema_changes`` policy refuses raises `TableRefused`, as on every target."""
    if change.refused is not None:
        raise change.refusal(pipeline, batch.id, change.position or batch.end)
    log.info("pipeline=%s stage=load batch=%d parquet target skips DDL on %s: %s", pipeline, batch.id,
             change.qualified_table, change.statement)


def _meta_columns(batch: Batch, changes: list[tuple[int, RowChange | DdlChange]],
                  ops: list[str]) -> dict[str, pa.Array]:
    """The ``_setl_*`` columns of `changes` (a truncate without a position takes its batch's end)."""
    positions = [change.position or (batch.end if isinstance(change, DdlChange) else None) for _, change in changes]
    return {
        "_setl_op": pa.array(ops, pa.string()),
        "_setl_batch": pa.array([batch.id] * len(changes), pa.int64()),
        "_setl_position": pa.array([str(p) if p else None for p in positions], pa.string()),
        "_setl_log": pa.array([p.log if p else None for p in positions], pa.string()),
        "_setl_offset": pa.array([p.offset if p else None for p in positions], pa.int64()),
        "_setl_row": pa.array([p.row if p else None for p in positions], pa.int64()),
        "_setl_seq": pa.array([seq for seq, _ in changes], pa.int64()),
    }


def _before_key(changes: list[tuple[int, RowChange]], types: TableTypes) -> list[tuple[str, pa.Array]]:
    """The ``_setl_before_*`` columns: the before image's key on update rows, typed like the key columns."""
    first = changes[0][1]
    if first.primary_key:
        columns: Iterable[str] = first.primary_key
    else:
        columns = dict.fromkeys(c for _, change in changes for c in (change.before or change.after or {}))
    update = Op.UPDATE
    out = []
    for column in columns:
        values = [change.before.get(column) if change.op is update and change.before is not None else None
                  for _, change in changes]
        array, kind = column_array(values, known=types.get(column), max_precision=types.max_precision,
                                   widen_decimals=True)
        if kind is not None and kind.codec == GEOMETRY:
            array = _wkb(array)
        out.append((BEFORE_PREFIX + column, array))
    return out


def _wkb(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A spatial column (`setl.values.Geometry.data`: SRID, then WKB) as its WKB."""
    return pa.array([None if v is None else v[4:] for v in column.to_pylist()], pa.binary())


def _fsync(path: Path) -> None:
    """fsync a file or a directory (a directory's entries: a rename in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_table(root: str | Path, table: str) -> pa.Table:
    """Read one target table's files back as one Arrow table (hive partitions included)."""
    return pq.read_table(Path(root) / table, partitioning="hive")
