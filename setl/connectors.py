"""Sources and targets as plugins: the ``setl.sources`` and ``setl.targets`` entry-point groups.

A connector is a `SourceConnector` or `TargetConnector` declaration: its `type` name (what a
pipeline's ``source.type`` or ``target.type`` says), its config class (a frozen attrs class
with a ``type`` field, validated with the same file and key-path errors as the rest of the
config), how it is built, and what it can do (`SelectCapabilities`, `LoadCapabilities`). An
entry point names the declaration, or a function without arguments that returns one (so a
connector's heavy imports happen only when it is used). The built-in connectors below are
registered through the same entry points in setl's own ``setup.cfg``.

Entry points are loaded by name on first use: a plugin that fails to import or declares
something invalid is reported, naming the plugin and its entry point, when a pipeline uses it
or `setl plugins list` lists it, and does not stop pipelines that use other connectors.
"""

from __future__ import annotations

import builtins
import copy
import functools
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import attrs

from setl.errors import ConfigError, PluginError, RefusedLoadError
from setl.registry import SOURCES, TARGETS, PluginGroup, blocked
from setl.stages.load import Load, LoadCapabilities
from setl.stages.select import Select, SelectCapabilities
from setl.stages.snapshot import SnapshotCapable

if TYPE_CHECKING:
    from setl.config import NodeSettings, PipelineConfig, PipelineSettings
    from setl.ddltask.actions import Actions
    from setl.schema.target import SchemaTarget
    from setl.sinks.conflicts import ConflictPolicy

Kind = Literal["source", "target"]
GROUPS: dict[Kind, str] = {"source": SOURCES, "target": TARGETS}

C = TypeVar("C")


def _default_settings() -> PipelineSettings:
    from setl.config import PipelineSettings

    return PipelineSettings()


def _default_node() -> NodeSettings:
    from setl.config import NodeSettings

    return NodeSettings()


@attrs.frozen
class BuildContext:
    """What a connector's `build` knows besides its own config: the pipeline's `name` (for error
    messages and a target's position rows), its `settings`, the `node`'s, `selects(schema,
    table)`: whether the pipeline's table rules replicate a source table, and `sequences`: whether
    the pipeline's target applies a sequence's state rows (`LoadCapabilities.sequences`), so a
    source hands them on."""

    name: str
    settings: PipelineSettings = attrs.field(factory=_default_settings)
    node: NodeSettings = attrs.field(factory=_default_node)
    selects: Callable[[str, str], bool] = attrs.field(default=lambda schema, table: True, eq=False)
    sequences: bool = False
    #: whether a binlog source hands on a row change logged as a statement as a marker that
    #: quarantines its table (``on_table_error: quarantine`` and a target that keeps a quarantine)
    statement_markers: bool = False
    #: the pipeline's ``conflicts:`` block and ``site`` as its target applies them (None: no detection)
    conflicts: ConflictPolicy | None = None

    @classmethod
    def of(cls, pipeline: PipelineConfig, node: NodeSettings) -> BuildContext:
        conflicts = None
        if pipeline.conflicts is not None and pipeline.site is not None:
            from setl.sinks.conflicts import ConflictPolicy

            conflicts = ConflictPolicy.from_config(pipeline.conflicts, pipeline.site)
            rules = tuple((rule.source, not rule.exclude and rule.target == "{schema}.{table}")
                          for rule in pipeline.tables)
            conflicts = attrs.evolve(conflicts, rules=rules, source_dial=_source_dial(pipeline))
        return cls(pipeline.name, pipeline.pipeline, node, conflicts=conflicts)

    def resolve(self, path: str) -> Path:
        """A path from the config, relative to the config directory."""
        return self.node.resolve(path)


def _source_dial(pipeline: PipelineConfig) -> Callable[[], Any] | None:
    """A tombstones pipeline's way to its source server (a MySQL source), where the load asks whether a
    delete it applies left its tombstone there, and makes the triggers of a table created while the
    channel runs (`setl.sinks.conflicts`); None otherwise. What it writes there (the triggers' DDL) is
    marked as the channel's loop guard marks the other direction's writes, so that this pipeline's own
    reader drops it: the session's server_id, or (loop_guard marker, or auto where the user may not
    set it) the other direction's mark row and comment (`setl.sinks.mysql_loop_guard`)."""
    source: Any = pipeline.source
    if pipeline.conflicts is None or not pipeline.conflicts.tombstones_on() or source.type != "mysql":
        return None
    guard = getattr(pipeline.target, "loop_guard", "server_id")
    marks = tuple(getattr(source, "ignore_marks", ()) or ())

    def dial() -> Any:
        import pymysql

        from setl.dial import mysql_connection
        from setl.sinks.mysql_loop_guard import MarkedConnection, start_marking
        from setl.tls import mysql_context

        context = mysql_context(source.ssl, where="source.ssl", pipeline=pipeline.name) if source.ssl else None
        options = dict(host=source.host, port=source.port, user=source.user, password=source.password,
                       connect_timeout=10.0, read_timeout=60.0, autocommit=True, charset="utf8mb4", ssl=context)

        def marked() -> Any:
            conn = mysql_connection(cls=MarkedConnection, **options)
            try:
                start_marking(conn, marks[0])
            except BaseException:
                conn.close()
                raise
            return conn

        if guard == "marker" and marks:
            return marked()
        conn = mysql_connection(**options)
        if source.ignore_server_ids:  # what setl writes there (triggers) is setl's, dropped by this pipeline
            try:
                with conn.cursor() as cur:
                    cur.execute("SET SESSION server_id = %s", (source.ignore_server_ids[0],))
            except pymysql.err.OperationalError as exc:
                conn.close()
                if guard == "auto" and marks and exc.args and exc.args[0] == 1227:
                    return marked()
                raise RefusedLoadError(
                    f"conflicts.tombstones: user {source.user!r} may not set its session's server_id on the source "
                    f"{source.host}:{source.port} ({exc.args[-1] if exc.args else exc}), which marks the tombstone "
                    "triggers setl makes there under loop_guard server_id. Fix: GRANT BINLOG REPLAY, BINLOG ADMIN "
                    "ON *.* to it, or set the channel's loop_guard: auto (docs/conflicts.md)",
                    pipeline=pipeline.name, stage="load") from exc
        return conn
    return dial


@attrs.frozen
class SourceConnector(Generic[C]):
    """A source: ``build(config, context)`` returns a `Select` that has not been opened yet."""

    type: str
    config: builtins.type[C]
    build: Callable[[C, BuildContext], Select] = attrs.field(eq=False)
    capabilities: SelectCapabilities = attrs.field(factory=SelectCapabilities)
    help: str = ""
    origin: str = ""

    kind: Kind = attrs.field(default="source", init=False)

    def create(self, config: C, context: BuildContext) -> Select:
        """The Select `build` returns, carrying the declared capabilities; a PluginError naming the
        plugin when `build` returns something else than a `Select` (a wrapper, None), or a Select
        that does not implement a capability it declares (``snapshots``: `SnapshotCapable`;
        ``reports_head``: its own `head()`)."""
        select = self.build(config, context)
        if not isinstance(select, Select):
            raise _not_a(self, "Select", select)
        if self.capabilities.snapshots and not isinstance(select, SnapshotCapable):
            raise PluginError(f"source type {self.type!r} declares the snapshots capability, but the "
                              f"{type(select).__name__} it builds has no snapshot_access() (setl.stages.snapshot."
                              "SnapshotCapable)", plugin=self.type)
        if self.capabilities.reports_head:
            _require(self, select, Select, "reports_head", "head")
        select.capabilities = self.capabilities
        return select


def _not_a(connector: SourceConnector[Any] | TargetConnector[Any], expected: str, got: object) -> PluginError:
    return PluginError(f"{connector.kind} type {connector.type!r}: its build returned {type(got).__qualname__} "
                       f"{got!r:.80}, not a setl.stages.{expected.lower()}.{expected}", plugin=connector.type)


def _require(connector: SourceConnector[Any] | TargetConnector[Any], built: object, base: type, capability: str,
             *methods: str) -> None:
    """A PluginError naming the connector when the class it built keeps `base`'s placeholder for one
    of the `methods` a declared `capability` needs: the engine would call it and get nothing."""
    missing = [m for m in methods if getattr(type(built), m) is getattr(base, m)]
    if missing:
        raise PluginError(f"{connector.kind} type {connector.type!r} declares the {capability} capability, but "
                          f"the {type(built).__name__} it builds does not implement {', '.join(missing)}()",
                          plugin=connector.type)


@attrs.frozen
class TargetConnector(Generic[C]):
    """A target: ``build(config, context)`` returns a `Load` that has not been opened yet.

    The built Load's `capabilities` are the declared ones. `ddl_task_actions`, when the target
    can run batch DDL tasks' pre-write actions (docs/batch-ddl-tasks.md), builds them:
    ``ddl_task_actions(config, pipeline=NAME)``. `schema`, when the target can create tables
    from the source's definitions (``pipeline.create_tables``, ``setl schema``: docs/schema.md),
    builds its `setl.schema.SchemaTarget`: ``schema(config, context)``; a target without it (Parquet,
    whose datasets take their columns from the rows) gets no DDL.
    """

    type: str
    config: builtins.type[C]
    build: Callable[[C, BuildContext], Load] = attrs.field(eq=False)
    capabilities: LoadCapabilities = attrs.field(factory=LoadCapabilities)
    ddl_task_actions: Callable[..., Actions] | None = attrs.field(default=None, eq=False)
    schema: Callable[[C, BuildContext], SchemaTarget] | None = attrs.field(default=None, eq=False)
    help: str = ""
    origin: str = ""

    kind: Kind = attrs.field(default="target", init=False)

    def create(self, config: C, context: BuildContext) -> Load:
        """The Load `build` returns, carrying the declared capabilities; a PluginError naming the
        plugin when `build` returns something else than a `Load`, or a Load that does not
        implement a capability it declares (``per_table``: `load_part` and `mark_loaded`;
        ``stores_position``: `committed`)."""
        load = self.build(config, context)
        if not isinstance(load, Load):
            raise _not_a(self, "Load", load)
        if self.capabilities.per_table:
            _require(self, load, Load, "per_table", "load_part", "mark_loaded")
        if self.capabilities.stores_position:
            _require(self, load, Load, "stores_position", "committed")
        load.capabilities = self.capabilities
        return load


Connector = SourceConnector[Any] | TargetConnector[Any]


def validate(kind: Kind, name: str, obj: Any) -> Connector:
    """The declaration an entry point named `name` of `kind` points at, checked; a TypeError or
    ValueError saying what is wrong ("is not ...") otherwise."""
    expected = SourceConnector if kind == "source" else TargetConnector
    if not isinstance(obj, (SourceConnector, TargetConnector)) and callable(obj):
        obj = obj()
    if not isinstance(obj, expected):
        raise TypeError(f"is not a setl.connectors.{expected.__name__} (nor a function returning one): {obj!r}")
    if obj.type != name:
        raise ValueError(f"is not registered under its type: it declares type {obj.type!r}")
    if not (isinstance(obj.config, type) and attrs.has(obj.config)):
        raise TypeError(f"is not usable: its config {obj.config!r} is not an attrs class")
    attrs.resolve_types(obj.config)
    fields = attrs.fields_dict(obj.config)
    if "type" not in fields:
        raise ValueError(f"is not usable: its config {obj.config.__qualname__} has no 'type' field")
    if not callable(obj.build):
        raise TypeError(f"is not usable: its build {obj.build!r} is not callable")
    if isinstance(obj, TargetConnector) and obj.schema is not None and not callable(obj.schema):
        raise TypeError(f"is not usable: its schema {obj.schema!r} is not callable")
    capabilities = SelectCapabilities if kind == "source" else LoadCapabilities
    if not isinstance(obj.capabilities, capabilities):
        raise TypeError(f"is not usable: its capabilities are not a {capabilities.__name__}")
    return obj


class ConnectorRegistry:
    """Sources and targets by type name, loaded from their entry points on first use
    (`setl.registry.PluginGroup`: a clash, a broken plugin and a blocked one are reported as
    for transforms).

    `blocked` names plugins ``plugins.blocked`` of ``setl.yaml`` switches off: `get` refuses them
    without importing them. `blocking(names)` is a view of the same registry with other blocked
    names (what the node's settings block), sharing what is loaded.
    """

    def __init__(self, blocked: Iterable[str] = ()) -> None:
        self.blocked = frozenset(blocked)
        self._lock = threading.Lock()
        self._groups: dict[Kind, PluginGroup] = {
            kind: PluginGroup(group, f"{kind} type", functools.partial(validate, kind))
            for kind, group in GROUPS.items()}
        self._registered: dict[tuple[Kind, str], Connector] = {}

    def blocking(self, names: Iterable[str]) -> ConnectorRegistry:
        """This registry with `names` blocked (the loaded connectors are shared)."""
        view = copy.copy(self)
        view.blocked = frozenset(names)
        return view

    def register(self, connector: Connector, origin: str = "") -> Connector:
        """Add a declaration directly (tests, embedding); it replaces one of the same type."""
        connector = validate(connector.kind, connector.type, connector)
        connector = attrs.evolve(connector, origin=origin or connector.origin or "registered directly")
        with self._lock:
            self._registered[(connector.kind, connector.type)] = connector
        return connector

    def names(self, kind: Kind) -> list[str]:
        """Every type name of `kind`, loaded or not, blocked or not, sorted."""
        with self._lock:
            registered = {n for k, n in self._registered if k == kind}
        return sorted(set(self._groups[kind].names()) | registered)

    def get(self, kind: Kind, name: str) -> Connector:
        """The connector `name` of `kind`; a PluginError if it is unknown, blocked, broken or
        provided twice."""
        group = self._groups[kind]
        if name in self.blocked:
            raise blocked(group.what, name)
        with self._lock:
            found = self._registered.get((kind, name))
        if found is not None:
            return found
        loaded = group.load(name)
        if loaded is None:
            known = ", ".join(n for n in self.names(kind) if n not in self.blocked)
            raise PluginError(f"unknown {kind} type {name!r} (known: {known or 'none'})", plugin=name)
        if isinstance(loaded, PluginError):
            raise loaded
        connector, origin = loaded
        return attrs.evolve(connector, origin=origin)

    def config_class(self, kind: Kind, name: str) -> type:
        """The config class connector `name` of `kind` declares (`setl.config.ConnectorResolver`):
        what a pipeline file's ``source`` or ``target`` mapping is built into."""
        return self.get(kind, name).config

    def source(self, name: str) -> SourceConnector[Any]:
        connector = self.get("source", name)
        assert isinstance(connector, SourceConnector)
        return connector

    def target(self, name: str) -> TargetConnector[Any]:
        connector = self.get("target", name)
        assert isinstance(connector, TargetConnector)
        return connector

    def listing(self, kind: Kind) -> list[Connector | PluginError]:
        """Every connector of `kind` loaded (for `setl plugins list`): broken ones as their error."""
        result: list[Connector | PluginError] = []
        for name in self.names(kind):
            try:
                result.append(self.get(kind, name))
            except PluginError as exc:
                result.append(exc)
        return result


def format_connector_table(kind: Kind, connectors: ConnectorRegistry | None = None) -> str:
    """The sources or targets part of ``setl plugins list``: type, origin, what it is and can
    do, and its config keys; a broken plugin as its error."""
    listing = (connectors or registry()).listing(kind)
    if not listing:
        return f"no {kind}s found"
    names = [c.type if not isinstance(c, PluginError) else str(c.context.get("plugin", "?")) for c in listing]
    width = max(len("TYPE"), *(len(n) for n in names))
    lines = [f"{'TYPE':<{width}}  ORIGIN"]
    for name, connector in zip(names, listing):
        if isinstance(connector, PluginError):
            state = "BLOCKED" if name in (connectors or registry()).blocked else "BROKEN"
            lines.append(f"{name:<{width}}  {state}: {connector}")
            continue
        lines.append(f"{name:<{width}}  {connector.origin}")
        if connector.help:
            lines.append(f"{'':<{width}}    {connector.help}")
        can = [f.name for f in attrs.fields(type(connector.capabilities)) if getattr(connector.capabilities, f.name)]
        if isinstance(connector, TargetConnector) and connector.ddl_task_actions is not None:
            can.append("ddl_task_actions")
        if isinstance(connector, TargetConnector) and connector.schema is not None:
            can.append("schema")
        lines.append(f"{'':<{width}}    capabilities: {', '.join(can) or 'none'}")
        keys = [f"{f.name}" + ("" if f.default is attrs.NOTHING else f" = {f.default!r}")
                for f in attrs.fields(connector.config) if f.name != "type"]
        lines.append(f"{'':<{width}}    keys: {', '.join(keys) or 'none'}")
    return "\n".join(lines)


_registry: ConnectorRegistry | None = None
_registry_lock = threading.Lock()


def registry() -> ConnectorRegistry:
    """The process's connector registry (entry points are read once, on first use)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = ConnectorRegistry()
        return _registry


def for_node(node: NodeSettings) -> ConnectorRegistry:
    """The process's registry with the plugins the node's ``plugins.blocked`` names blocked: what
    loads a pipeline (`setl.config.load_pipeline`) and builds its connectors."""
    return registry().blocking(node.plugins.blocked)


def build_select(config: PipelineConfig, node: NodeSettings,
                 selects: Callable[[str, str], bool] | None = None, sequences: bool = False,
                 statement_markers: bool = False) -> Select:
    """The pipeline's source, built by its connector (not opened); `selects(schema, table)` tells
    which source tables the pipeline's rules replicate (all, when not given); `sequences`, whether
    the pipeline's target applies sequence state rows (`BuildContext.sequences`); `statement_markers`,
    whether a row change logged as a statement quarantines its table (`BuildContext.statement_markers`)."""
    context = attrs.evolve(BuildContext.of(config, node), sequences=sequences, statement_markers=statement_markers)
    if selects is not None:
        context = attrs.evolve(context, selects=selects)
    return for_node(node).source(config.source.type).create(config.source, context)


def build_load(config: PipelineConfig, node: NodeSettings) -> Load:
    """The pipeline's target, built by its connector (not opened), carrying its declared capabilities.
    A ``conflicts:`` block needs a target that detects conflicts (type mysql)."""
    if config.conflicts is not None and config.target.type != "mysql":
        raise ConfigError(f"conflicts: detected on a mysql target only, not {config.target.type}",
                          pipeline=config.name, file=config.file or None)
    return for_node(node).target(config.target.type).create(config.target, BuildContext.of(config, node))


def build_schema(config: PipelineConfig, node: NodeSettings) -> SchemaTarget | None:
    """The pipeline's target as a `setl.schema.SchemaTarget` (not connected), or None when its
    connector creates no tables (``TargetConnector.schema``)."""
    connector = for_node(node).target(config.target.type)
    if connector.schema is None:
        return None
    return connector.schema(config.target, BuildContext.of(config, node))


def creates_tables(config: PipelineConfig, node: NodeSettings) -> bool:
    """Whether the pipeline's target makes a table the first time a batch touches it
    (`LoadCapabilities.creates_tables`): what a target whose connector has no ``schema`` must
    declare, or the target tables have to exist before the pipeline starts."""
    return for_node(node).target(config.target.type).capabilities.creates_tables


#: What `setl check` warns and a start logs for a target that neither creates tables nor lets setl create them.
NO_TABLES = ("target type {type} creates no tables and setl cannot create them for it (its connector declares "
             "neither a schema nor creates_tables): the target tables must exist before the pipeline starts")


# --- the built-in connectors (registered in setl's setup.cfg) -------------------------------


def file_source() -> SourceConnector[Any]:
    from setl.sources.file import FileSource, FileSourceConfig

    def build(config: FileSourceConfig, context: BuildContext) -> Select:
        return FileSource(context.resolve(config.path), start=config.start, follow=config.follow,
                          pipeline=context.name)

    return SourceConnector("file", FileSourceConfig, build, SelectCapabilities(reports_head=True),
                           help="a JSON-lines file of transactions (demo and tests)")


def _reads(context: BuildContext) -> Callable[[str, str], bool]:
    """Which source tables' rows a binlog reader hands on: those the rules select, and the batch
    DDL tasks' signal table (`setl.ddltask.select` reads its rows; the rules need not route it)."""
    selects, signal = context.selects, context.settings.ddl_tasks.signal_table
    if not signal or "." not in signal:
        return selects
    schema, _, table = signal.rpartition(".")
    return lambda s, t: (s, t) == (schema, table) or selects(s, t)


def mysql_source() -> SourceConnector[Any]:
    from setl.sources.mysql_binlog import MysqlBinlogSource, MysqlSourceConfig

    def build(config: MysqlSourceConfig, context: BuildContext) -> Select:
        # A transaction larger than a batch comes in batch-sized pieces, each acknowledged (LOG:OFFSET+ROW).
        shared = context.node.sources.shared_reader_server_id
        reads = _reads(context)
        if shared is not None:  # one binlog stream for all of the node's pipelines on this server
            from setl.sources.shared_binlog import SharedBinlogSource

            return SharedBinlogSource.from_config(config, pipeline=context.name, shared_server_id=shared,
                                                  max_rows_in_memory=context.settings.batch.max_rows,
                                                  selects=context.selects, reads=reads, sequences=context.sequences,
                                                  statement_markers=context.statement_markers)
        return MysqlBinlogSource.from_config(config, pipeline=context.name,
                                             max_rows_in_memory=context.settings.batch.max_rows,
                                             selects=context.selects, reads=reads, sequences=context.sequences,
                                             reader_process=context.node.sources.reader_process,
                                             statement_markers=context.statement_markers)

    return SourceConnector("mysql", MysqlSourceConfig, build, SelectCapabilities(reports_head=True, snapshots=True),
                           help="a MySQL or MariaDB server's binary log")


def sqlite_target() -> TargetConnector[Any]:
    from setl.sinks.sqlite import SqliteLoad, SqliteTargetConfig

    def build(config: SqliteTargetConfig, context: BuildContext) -> Load:
        return SqliteLoad(context.resolve(config.path), pipeline=context.name)

    def schema(config: SqliteTargetConfig, context: BuildContext) -> SchemaTarget:
        import sqlite3

        from setl.schema.sqlite import SqliteSchema

        path = context.resolve(config.path)

        def connect() -> sqlite3.Connection:
            path.parent.mkdir(parents=True, exist_ok=True)
            return sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)

        return SqliteSchema(connect, pipeline=context.name)

    return TargetConnector("sqlite", SqliteTargetConfig, build, SqliteLoad.capabilities, schema=schema,
                           help="an SQLite database file (the embedded demo target)")


def quarantine_options(settings: Any) -> dict[str, Any]:
    """An SQL sink's options for the pipeline's ``on_table_error`` and ``quarantine`` bounds."""
    return {"on_table_error": settings.on_table_error, "quarantine_max_rows": settings.quarantine.max_rows,
            "quarantine_max_bytes": settings.quarantine.max_bytes}


def mysql_target() -> TargetConnector[Any]:
    from setl.ddltask.actions import MysqlActions
    from setl.sinks.mysql import MysqlLoad, MysqlTargetConfig

    def build(config: MysqlTargetConfig, context: BuildContext) -> Load:
        return MysqlLoad.from_config(config, pipeline=context.name, ddl=context.settings.ddl,
                                     conflicts=context.conflicts, **quarantine_options(context.settings))

    def schema(config: MysqlTargetConfig, context: BuildContext) -> SchemaTarget:
        from setl.schema.mysql import MysqlSchema

        # The sink's own connect (TLS, timeouts), on a connection of the schema's own.
        return MysqlSchema(MysqlLoad.from_config(config, pipeline=context.name).sql.connect, pipeline=context.name)

    return TargetConnector("mysql", MysqlTargetConfig, build, MysqlLoad.capabilities,
                           ddl_task_actions=MysqlActions, schema=schema, help="a MySQL or MariaDB server")


def postgresql_target() -> TargetConnector[Any]:
    from setl.sinks.postgresql import PostgresqlLoad, PostgresqlTargetConfig

    def build(config: PostgresqlTargetConfig, context: BuildContext) -> Load:
        return PostgresqlLoad.from_config(config, pipeline=context.name, ddl=context.settings.ddl,
                                     **quarantine_options(context.settings))

    def schema(config: PostgresqlTargetConfig, context: BuildContext) -> SchemaTarget:
        from setl.schema.postgresql import PostgresqlSchema

        return PostgresqlSchema(PostgresqlLoad.from_config(config, pipeline=context.name).sql.connect,
                                pipeline=context.name, spatial=config.spatial, partitions=config.partitions)

    return TargetConnector("postgresql", PostgresqlTargetConfig, build, PostgresqlLoad.capabilities, schema=schema,
                           help="a PostgreSQL server")


def parquet_target() -> TargetConnector[Any]:
    from setl.sinks.parquet import ParquetLoad, ParquetTargetConfig

    def build(config: ParquetTargetConfig, context: BuildContext) -> Load:
        return ParquetLoad.from_config(config, pipeline=context.name, spark=context.node.spark)

    return TargetConnector("parquet", ParquetTargetConfig, build, ParquetLoad.capabilities,
                           help="Parquet files, one dataset per table")
