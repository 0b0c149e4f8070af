"""Load and validate `conf/setl.yaml` and `conf/pipelines/NAME.yaml` into frozen attrs classes.

Every error names the file and the key path (``pipelines/p1.yaml: pipeline.batch.max_rows:
expected an integer, got 'ten'``) and exits the CLI with code 2.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union

import attrs
import yaml

from setl.errors import ConfigError, PluginError
from setl.loop_marks import LOOP_GUARDS, mark_name
from setl.model import TableName

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


# --- node -----------------------------------------------------------------------------------


@attrs.frozen
class NodeConfig:
    """This node's identity."""

    id: str = "node-1"  # unique per node: names it in status, leadership and session records
    capacity: int | None = None  # cluster: the most total pipeline weight it runs (docs/cluster.md); not set: no limit


@attrs.frozen
class MetaConfig:
    """Where positions, acks, state and epochs are kept."""

    store: Literal["sqlite", "zookeeper"] = "sqlite"  # zookeeper needs ha.zookeeper (and is what HA uses)
    path: str = "var/setl-meta.db"  # the SQLite file (store: sqlite)


@attrs.frozen
class HaConfig:
    """High availability: nodes sharing a ZooKeeper run each pipeline on one node, the others stand by."""

    zookeeper: str | None = None  # ZooKeeper hosts, HOST:PORT[,HOST:PORT...]; not set: single-node mode
    chroot: str = "/setl"  # every ZooKeeper path of setl is under it
    session_timeout_ms: int = 10000  # 1000 to 600000; ZooKeeper bounds it to 2..20 tickTimes
    standby_delay_ms: int = 3000  # how long a standby waits after the leader goes before it takes over
    #: cluster: how long after a node's registration goes its pipelines without a live standby are
    #: reassigned (docs/cluster.md); not set: session_timeout_ms + 3000
    reassign_after_ms: int | None = None
    #: cluster: how long a newly elected coordinator waits for the expected nodes to join before it
    #: places pipelines or balances them (docs/cluster.md); 0: no wait
    join_grace_ms: int = 3000
    #: cluster: the node ids the start-up grace waits for (it ends early once all are live); not
    #: set: the nodes pinned by a pipeline and those named in the assignments left from before
    expected_nodes: tuple[str, ...] | None = None

    @property
    def reassign_after(self) -> float:
        """`reassign_after_ms` in seconds, its default resolved."""
        ms = self.session_timeout_ms + 3000 if self.reassign_after_ms is None else self.reassign_after_ms
        return ms / 1000.0


@attrs.frozen
class SparkConfig:
    """The node's Spark session, started only when a pipeline has a transform that needs it."""

    master: str = "local[*]"  # Spark master URL
    app_name: str = "setl"  # Spark application name
    conf: dict[str, Any] = attrs.Factory(dict)  # any spark.* setting, e.g. {spark.driver.memory: 2g}


@attrs.frozen
class PluginsConfig:
    """Where to find plugins besides installed packages' entry points, and which to switch off."""

    dirs: tuple[str, ...] = ()  # folders of plugin modules (relative to the conf directory)
    blocked: tuple[str, ...] = ()  # transform, source or target names never loaded (`setl.registry`)


@attrs.frozen
class LogConfig:
    """setl's own log."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"  # the lowest level written (--debug: DEBUG)
    format: Literal["text", "json"] = "text"  # json: one object per line, with pipeline, stage, batch, table, position


@attrs.frozen
class ApiConfig:
    """The HTTP control API (``/api/v1``, docs/http-api.md): off unless `http.api` is set. Its tokens
    are never in a config file: lines ``NAME ROLE TOKEN`` (role viewer or operator) in `tokens_file`
    and/or in the environment variable `tokens_env`."""

    tokens_file: str | None = None  # relative to the conf directory; keep it mode 0600
    tokens_env: str = "SETL_API_TOKENS"  # the same lines (newline or ';' between them)
    audit_log: str = "api-audit.jsonl"  # every state-changing request, one JSON object a line
    #: a request body longer than this is refused (413) before it is read
    max_body_bytes: int = attrs.field(default=65536, validator=attrs.validators.ge(2))
    timeout_s: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))  # a slow client is cut off


@attrs.frozen
class HttpTlsConfig:
    """HTTPS for the node's endpoint: the PEM certificate chain and its private key."""

    cert: str  # PEM certificate chain, relative to the conf directory
    key: str  # PEM private key of `cert`, relative to the conf directory


@attrs.frozen
class HttpConfig:
    """The node's HTTP endpoint: status page, /metrics, /api/status, /healthz (docs/status-page.md),
    and with `api` the control API (docs/http-api.md)."""

    #: HOST:PORT to serve on; not set: no endpoint. Loopback unless you name another address.
    listen: str | None = None
    api: ApiConfig | None = None  # the control API; not set: none (the endpoint stays read-only)
    tls: HttpTlsConfig | None = None  # serve HTTPS; strongly advised with `api` off loopback


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[IPv6]:PORT``) as (host, port); ConfigError naming the key otherwise."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"http.listen: {text!r} is not HOST:PORT (for example 127.0.0.1:9325)")
    return host, int(port)


@attrs.frozen
class RuntimeConfig:
    """The threads a node's pipelines share (`setl.runtime`)."""

    workers: int = attrs.field(default=4, validator=attrs.validators.ge(1))  # shared task threads
    max_workers: int = attrs.field(default=12, validator=attrs.validators.ge(1))  # with those added on overruns
    overrun_threshold_ms: int = attrs.field(default=100, validator=attrs.validators.ge(1))  # a task this long overruns
    max_overruns: int = attrs.field(default=3, validator=attrs.validators.ge(0))  # then a thread of its own
    idle_backoff_ms: int = attrs.field(default=10, validator=attrs.validators.ge(0))  # idle Select polls
    load_slots: int = attrs.field(default=16, validator=attrs.validators.ge(1))  # per_table channels map here
    load_workers: int = attrs.field(default=4, validator=attrs.validators.ge(1))  # threads running load slots
    # Batches cut and not yet acked, across all the node's pipelines (default: 4 x workers); null or 0: no cap.
    max_batches_in_flight: int | None = attrs.field(
        default=attrs.Factory(lambda self: 4 * self.workers, takes_self=True),
        validator=attrs.validators.optional(attrs.validators.ge(0)))
    # `setl start`'s first-generation garbage-collector threshold (see setl.node.tune_gc); 0: Python's own.
    gc_threshold: int = attrs.field(default=500_000, validator=attrs.validators.ge(0))

    def __attrs_post_init__(self) -> None:
        if self.max_workers < self.workers:
            raise ValueError(f"max_workers ({self.max_workers}) must be >= workers ({self.workers})")

    @property
    def batch_cap(self) -> int | None:
        """The node-wide cap on batches in flight, or None when there is none."""
        return self.max_batches_in_flight or None


#: The events an alert can be sent on, besides thresholds (``FIGURE > N``, docs/runbook.md#alerts).
ALERT_EVENTS = ("paused", "leader_changed", "snapshot_done", "caught_up", "rebalanced", "reload_refused",
                "verify_failed", "conflict", "quarantined")
_THRESHOLD = re.compile(r"^\s*([a-z_]+)\s*(>=|>)\s*([0-9]+(?:\.[0-9]+)?)\s*$")


def parse_alert_event(text: str) -> tuple[str, str | None, float | None]:
    """``paused`` -> ("paused", None, None); ``lag_seconds > 30`` -> ("lag_seconds", ">", 30.0).
    ValueError naming what is allowed for anything else."""
    if text in ALERT_EVENTS:
        return text, None, None
    match = _THRESHOLD.match(text)
    if match is None:
        raise ValueError(f"unknown alert event {text!r} (one of {', '.join(ALERT_EVENTS)}, "
                         "or a threshold such as 'lag_seconds > 30')")
    return match.group(1), match.group(2), float(match.group(3))


def _alert_events(instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    for text in value:
        parse_alert_event(text)


@attrs.frozen
class AlertConfig:
    """One webhook and the events it is sent (a JSON POST each; docs/runbook.md#alerts)."""

    webhook: str  # http:// or https:// URL the alerts are POSTed to
    #: events: paused, leader_changed, snapshot_done, caught_up, rebalanced, reload_refused, verify_failed,
    #: conflict, or a threshold on a live figure such as 'lag_seconds > 30' (firing when crossed upwards,
    #: resolved when it falls back)
    events: tuple[str, ...] = attrs.field(default=("paused",), validator=_alert_events)
    pipelines: tuple[str, ...] = ()  # only these pipelines (every pipeline when empty)
    timeout_ms: int = attrs.field(default=5000, validator=attrs.validators.ge(1))  # per POST
    #: a failing POST is retried with backoff for this long, then dropped with a logged error
    max_elapsed_ms: int = attrs.field(default=300_000, validator=attrs.validators.ge(0))

    def __attrs_post_init__(self) -> None:
        if not self.webhook.startswith(("http://", "https://")):
            raise ValueError(f"webhook {self.webhook!r} is not an http:// or https:// URL")


@attrs.frozen
class SourcesConfig:
    """How the node's pipelines read their sources."""

    #: the node's pipelines that read one MySQL or MariaDB server share one binlog stream, read with this
    #: server_id (unique among the server's replicas and readers; docs/performance.md); not set: one stream each
    shared_reader_server_id: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    #: each pipeline's binlog reader (socket, framing, decoding, transaction assembly) runs in a process of
    #: its own, on another core, handing transactions on as columns (docs/performance.md); off: a thread
    reader_process: bool = False

    def __attrs_post_init__(self) -> None:
        if self.reader_process and self.shared_reader_server_id is not None:
            raise ValueError("reader_process does not work with shared_reader_server_id yet: set one of them")


@attrs.frozen
class NodeSettings:
    """`conf/setl.yaml`: one node's identity and shared services."""

    node: NodeConfig = attrs.Factory(NodeConfig)
    meta: MetaConfig = attrs.Factory(MetaConfig)
    ha: HaConfig = attrs.Factory(HaConfig)
    spark: SparkConfig = attrs.Factory(SparkConfig)
    plugins: PluginsConfig = attrs.Factory(PluginsConfig)
    log: LogConfig = attrs.Factory(LogConfig)
    runtime: RuntimeConfig = attrs.Factory(RuntimeConfig)
    sources: SourcesConfig = attrs.Factory(SourcesConfig)
    alerts: tuple[AlertConfig, ...] = ()  # webhooks told of pauses, failovers, snapshots, thresholds
    http: HttpConfig = attrs.Factory(HttpConfig)
    conf_dir: str = attrs.field(default=".", metadata={"internal": True})

    def resolve(self, path: str) -> Path:
        """A path from the config, relative to the config directory."""
        p = Path(path)
        return p if p.is_absolute() else Path(self.conf_dir) / p


# --- sources and targets -------------------------------------------------------------------


@attrs.frozen
class SslConfig:
    """TLS for the connections to a MySQL, MariaDB or PostgreSQL server (docs/tls.md). With `ssl`
    setl refuses a server that offers no TLS; without it the drivers encrypt when the server
    offers TLS but never verify the certificate."""

    #: PEM file of the CA(s) that signed the server's certificate; the system's trusted CAs if not set
    ca: str | None = None
    cert: str | None = None  # PEM client certificate, for a server that asks for one
    key: str | None = None  # PEM private key of `cert` (PostgreSQL: mode 0600)
    #: check the server's certificate chain and that it names `host`; false: encrypt only
    verify: bool = True

    def __attrs_post_init__(self) -> None:
        if self.key and not self.cert:
            raise ValueError("key is set but cert is not: give both, or neither")
        if self.cert and not self.key:
            raise ValueError("cert is set but key is not: give both (a PEM with both: the same file twice)")

    def resolved(self, conf_dir: str | Path) -> "SslConfig":
        """The same settings with file paths relative to `conf_dir` made absolute."""

        def absolute(path: str | None) -> str | None:
            return None if path is None else str((Path(conf_dir) / path).absolute())

        return SslConfig(ca=absolute(self.ca), cert=absolute(self.cert), key=absolute(self.key), verify=self.verify)


class ConnectorConfig(typing.Protocol):
    """A source's or target's config: a frozen attrs class next to its connector's code, tagged by
    `type`, the name its connector is registered under (`setl.connectors`)."""

    @property
    def type(self) -> str: ...


class ConnectorResolver(typing.Protocol):
    """What turns a source's or target's ``type`` name into its config class.

    The connector layer provides it (`setl.connectors.registry()`) and whoever loads a pipeline
    hands it to `load_pipeline`: config is pure data and imports no connector."""

    def names(self, kind: Literal["source", "target"]) -> list[str]:
        """Every type name of `kind`, sorted."""
        ...

    def config_class(self, kind: Literal["source", "target"], name: str) -> type:
        """The config class of connector `name`; a PluginError if it is unknown or broken."""
        ...


# --- tables and pipeline --------------------------------------------------------------------


@attrs.frozen
class ColumnsConfig:
    """Which columns of a table a rule takes: `include` or `exclude`, not both; key columns stay."""

    include: tuple[str, ...] | None = None  # only these columns (and the key)
    exclude: tuple[str, ...] = ()  # every column but these


@attrs.frozen
class TransformStep:
    """One `{use: NAME, ...params}` entry; params are validated by the plugin."""

    use: str  # the transform's name (a built-in or a plugin's, see `setl plugins list`)
    params: dict[str, Any] = attrs.Factory(dict)  # not a key: the entry's other keys are the transform's parameters


#: A table's schema-change policy (docs/schema-changes.md): apply every DDL, keep dropped columns
#: (ignore_drops), apply additions only (additive_only), or stop at any schema change (refuse).
SchemaChanges = Literal["apply", "ignore_drops", "additive_only", "refuse"]


@attrs.frozen
class TableRule:
    """Which source tables a rule takes (`source` regex on ``schema.table``) and how."""

    source: str  # regex matched against the whole SCHEMA.TABLE name; the first matching rule wins
    target: str = "{schema}.{table}"  # target name template (also applied to replicated DDL)
    exclude: bool = False  # true: the matched tables are not replicated
    columns: ColumnsConfig = attrs.Factory(ColumnsConfig)  # which columns are replicated
    rename: dict[str, str] = attrs.Factory(dict)  # source column -> target column
    filter: str | None = None  # Python expression over the row's columns; an update leaving it is a delete
    transforms: tuple[TransformStep, ...] = ()  # applied in order, on Spark
    #: what its replicated DDL may change on the target (docs/schema-changes.md); not set: the
    #: pipeline's ``pipeline.schema_changes``
    schema_changes: SchemaChanges | None = None


@attrs.frozen
class BatchSettings:
    """When Select cuts a batch: at whichever limit comes first. A DDL is always a batch of its own."""

    max_rows: int = 5000  # row changes per batch; a larger transaction comes in pieces of this size
    max_bytes: int = 16 * 1024 * 1024  # approximate bytes of row data per batch
    max_wait_ms: int = 200  # how long a batch may wait for more changes


@attrs.frozen
class LoadSettings:
    """How batches reach the target."""

    #: ordered: one batch at a time, in order; per_table: each target table its own channel (SQL targets)
    mode: Literal["ordered", "per_table"] = "ordered"
    #: ordered mode: a snapshot's chunks (batches of reads only) loaded in order (ordered), or as per-table
    #: parts on the load slots (per_table: chunks of different tables at once; docs/snapshot.md)
    chunks: Literal["ordered", "per_table"] = "ordered"


@attrs.frozen
class RetrySettings:
    """How a pipeline rides out failures (setl/retry.py classifies them).

    A transient failure (connection refused or lost, server restarting, lock wait timeout,
    deadlock) is retried, at startup too, until it has lasted `max_elapsed_ms`; any other
    failure retrying may fix gets `max_attempts`; one it cannot fix pauses at once.
    """

    max_attempts: int = 5  # attempts at a failure that is neither transient nor permanent
    initial_backoff_ms: int = 200  # wait before the first retry; doubles each time
    max_backoff_ms: int = 30000  # the longest wait between retries
    max_elapsed_ms: int = 600_000  # how long transient failures are retried before the pipeline pauses


@attrs.frozen
class DdlTaskSettings:
    """Batch DDL tasks (docs/batch-ddl-tasks.md): off unless `signal_table` (``schema.table`` in
    the source) is set. `task_column`, when a loaded row has it, names the row's task."""

    signal_table: str | None = None  # SCHEMA.TABLE in the source where tasks are signalled
    task_column: str | None = None  # a loaded row's column naming its task


@attrs.frozen
class QuarantineSettings:
    """What may be kept for one quarantined table (docs/quarantine.md): reaching either bound pauses
    the pipeline, nothing is dropped."""

    max_rows: int = 1_000_000  # changes kept for one quarantined table
    max_bytes: int = 1 << 30  # their size as kept (bytes)


@attrs.frozen
class PipelineSettings:
    """How the pipeline runs."""

    parallelism: int = 3  # batches in flight at once (1 to 64)
    batch: BatchSettings = attrs.Factory(BatchSettings)
    load: LoadSettings = attrs.Factory(LoadSettings)
    retry: RetrySettings = attrs.Factory(RetrySettings)
    ddl: Literal["apply", "skip", "fail"] = "apply"  # replicated DDL: apply it, skip it (logged), or pause before it
    #: each table's schema-change policy unless its rule sets one (docs/schema-changes.md); needs ddl: apply
    schema_changes: SchemaChanges = "apply"
    create_tables: bool = True  # create each missing target table from the source's definition (docs/schema.md)
    ddl_tasks: DdlTaskSettings = attrs.Factory(DdlTaskSettings)
    drain_timeout_ms: int = 30000  # on stop, how long batches in flight may take to finish
    weight: int = 1  # cluster: this pipeline's share of a node's work, e.g. its rows/s in thousands (docs/cluster.md)
    nodes: tuple[str, ...] | None = None  # cluster: the node ids it may run on (pinning); not set: any node
    #: a table whose change the target refuses (a value, a privilege): pause the pipeline, or quarantine
    #: the table, keeping its changes on the target while the others go on (docs/quarantine.md)
    on_table_error: Literal["pause", "quarantine"] = "pause"
    quarantine: QuarantineSettings = attrs.Factory(QuarantineSettings)


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``6h``, ``1d`` in seconds; ValueError for anything else."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"expected a duration such as 30s, 15m, 6h or 1d, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _duration(instance: Any, attribute: Any, value: str) -> None:
    if parse_duration(value) <= 0:
        raise ValueError(f"every: must be above 0, got {value!r}")


def _table_names(instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    for text in value:
        try:
            TableName.parse(text)
        except ValueError as exc:
            raise ValueError(f"tables: {exc}") from None


@attrs.frozen
class VerifySchedule:
    """Scheduled checks: `setl verify` run every `every` by the node that holds the pipeline
    (`setl.verify.schedule`, docs/verify.md#scheduled-checks)."""

    every: str = attrs.field(validator=_duration)  # a duration: 30s, 15m, 6h, 1d
    #: the source tables checked, SCHEMA.TABLE (default: every table the rules select)
    tables: tuple[str, ...] = attrs.field(default=(), validator=_table_names)
    #: read the source at most this fast (0: unbounded)
    max_rows_per_second: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))  # checks before a difference counts
    chunk_rows: int = attrs.field(default=10_000, validator=attrs.validators.ge(1))  # rows per compared chunk
    #: how long a check waits for the acked position to reach a read's before it gives up (no verdict)
    wait_timeout: str = attrs.field(default="5m", validator=_duration)
    #: pause before each chunk while the pipeline's lag is above this many seconds (0: never)
    max_lag: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    #: how long a check may pause for the lag in all before it gives up (no verdict)
    lag_timeout: str = attrs.field(default="30m", validator=_duration)
    #: where the chunks are hashed: here (local) or as Spark tasks on the node's spark.master (spark)
    engine: Literal["local", "spark"] = "local"

    @property
    def seconds(self) -> float:
        return parse_duration(self.every)


ConflictPolicyName = Literal["last_writer_wins", "site_wins", "keep_target"]


@attrs.frozen
class TableConflicts:
    """One target table's conflict settlement, over the block's (a key left out: the block's)."""

    policy: ConflictPolicyName | None = None  # last_writer_wins, site_wins or keep_target
    column: str | None = None  # last_writer_wins: the table's timestamp column every write sets
    site: str | None = None  # site_wins: the site whose version always wins


@attrs.frozen
class ConflictSettings:
    """Conflicts of a two-way channel (docs/conflicts.md): a row changed on both sides before
    either change reached the other, detected where a batch is applied (MySQL targets), settled by
    `policy` and recorded in the target's ``setl_conflicts`` table. Not set: no detection, and no
    extra reads."""

    #: last_writer_wins: the later `column` wins, a tie goes to the site of the smaller priority in
    #: `sites`, a delete wins over an update (with `tombstones`: is as late as the row it deleted);
    #: site_wins: `site` always wins; keep_target: the target's row stays
    policy: ConflictPolicyName = "last_writer_wins"
    column: str | None = None  # last_writer_wins: the timestamp column every write sets (e.g. updated_at)
    site: str | None = None  # site_wins: the site whose version always wins
    sites: dict[str, int] = attrs.Factory(dict)  # the channel's two sites and their priorities (1 wins ties over 2)
    tables: dict[str, TableConflicts] = attrs.Factory(dict)  # per target table SCHEMA.TABLE: its own policy
    #: tombstones (docs/conflicts.md): each site's deletes leave the deleted row's version in the deleting
    #: transaction (triggers: TRIGGER, and SUPER or log_bin_trust_function_creators=1), so that a delete
    #: racing an insert or update is ranked alike on both sites. Not set: on unless every table is
    #: keep_target; false (explicit): a delete wins over an update, and an insert racing a delete is found
    #: only by `setl verify --channel`
    tombstones: bool | None = None
    #: days a deleted key's tombstone is kept (docs/conflicts.md): more than the longest lag either way
    tombstone_days: float = 7.0

    def tombstones_on(self) -> bool:
        """Whether deletes leave tombstones: as `tombstones` says, else `tombstones_default`."""
        return self.tombstones if self.tombstones is not None else tombstones_default(
            [self.policy, *(table.policy or self.policy for table in self.tables.values())])


def tombstones_default(policies: Sequence[str | None]) -> bool:
    """``conflicts.tombstones`` not set: on where a table's deletes can race its writes and end the sites
    different without them (last_writer_wins, site_wins); off where every table keeps the target's row
    (keep_target: each site keeps its own anyway, docs/conflicts.md)."""
    return any((policy or "last_writer_wins") != "keep_target" for policy in policies)


def channel_tombstones(conflicts: Any) -> bool | None:
    """A channel's raw ``conflicts:`` block: whether its directions run with tombstones (None: no block)."""
    if not isinstance(conflicts, dict):
        return None
    if isinstance(conflicts.get("tombstones"), bool):
        return bool(conflicts["tombstones"])
    given = conflicts.get("tables")
    tables: dict[Any, Any] = given if isinstance(given, dict) else {}
    default = conflicts.get("policy")
    return tombstones_default([default, *((t.get("policy") if isinstance(t, dict) else None) or default
                                          for t in tables.values())])


@attrs.frozen
class PipelineConfig:
    """`conf/pipelines/NAME.yaml`: one pipeline from a source to a target."""

    name: str = attrs.field(metadata={"internal": True})
    source: ConnectorConfig = attrs.field(metadata={"connector": "source"})
    target: ConnectorConfig = attrs.field(metadata={"connector": "target"})
    tables: tuple[TableRule, ...] = (TableRule(source=r".*"),)  # table rules; unmatched tables are skipped
    pipeline: PipelineSettings = attrs.Factory(PipelineSettings)
    verify: VerifySchedule | None = None  # scheduled consistency checks (off when not set)
    site: str | None = None  # two-way sync: the site this pipeline's source is (a name in conflicts.sites)
    conflicts: ConflictSettings | None = None  # two-way sync: detect, settle and record conflicts (docs/conflicts.md)
    file: str = attrs.field(default="", metadata={"internal": True})
    #: the two-way channel this pipeline is a direction of (`conf/channels/NAME.yaml`), if any
    channel: str | None = attrs.field(default=None, metadata={"internal": True})


# --- loading --------------------------------------------------------------------------------


def expand_env(value: str, where: str) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}``; an unset VAR without default is an error."""

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"environment variable {name} is not set", file=where)

    return _ENV.sub(sub, value)


def _type_name(tp: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if attrs.has(tp):
        return "a mapping"
    return str(tp)


class _Builder:
    """Builds frozen attrs classes from parsed YAML, every error naming the file and key path."""

    def __init__(self, file: str, connectors: ConnectorResolver | None = None) -> None:
        self.file = file
        self.connectors = connectors  # needed only where a source or target config is built

    def fail(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{path or '(top level)'}: {message}", file=self.file)

    def build(self, tp: Any, value: Any, path: str) -> Any:
        if isinstance(value, str):
            value = expand_env(value, f"{self.file}: {path}")
        origin = typing.get_origin(tp)
        if tp is Any:
            return value
        if origin is Literal:
            choices = typing.get_args(tp)
            if value not in choices:
                raise self.fail(path, f"expected one of {', '.join(map(str, choices))}, got {value!r}")
            return value
        if origin in (Union, types.UnionType):
            options = typing.get_args(tp)
            if value is None and type(None) in options:
                return None
            kinds = [o for o in options if o is not type(None)]
            tagged = [o for o in kinds if attrs.has(o) and "type" in attrs.fields_dict(o)]
            if tagged:
                return self.build_tagged(tagged, value, path)
            return self.build(kinds[0], value, path) if len(kinds) == 1 else value
        if origin in (tuple, list):
            if not isinstance(value, list):
                raise self.fail(path, f"expected a list, got {value!r}")
            item_tp = typing.get_args(tp)[0]
            items = [self.build(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                raise self.fail(path, f"expected a mapping, got {value!r}")
            args = typing.get_args(tp)
            val_tp = args[1] if args else Any
            return {str(k): self.build(val_tp, v, f"{path}.{k}") for k, v in value.items()}
        if attrs.has(tp):
            return self.build_attrs(tp, value, path)
        if tp is bool:
            if isinstance(value, bool):
                return value
        elif tp is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
                return int(value)
        elif tp is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif tp is str:
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                return str(value)
        raise self.fail(path, f"expected {_type_name(tp)}, got {value!r}")

    def build_tagged(self, options: list[Any], value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {value!r}")
        kinds = {typing.get_args(attrs.fields_dict(o)["type"].type)[0]: o for o in options}
        kind = value.get("type")
        if kind not in kinds:
            raise self.fail(f"{path}.type", f"expected one of {', '.join(kinds)}, got {kind!r}")
        return self.build_attrs(kinds[kind], value, path)

    def build_connector_config(self, kind: Literal["source", "target"], value: Any, path: str) -> Any:
        """A source's or target's config, in the class its connector (named by `type`) declares."""
        if self.connectors is None:
            raise TypeError("a source or target config needs a ConnectorResolver")
        if isinstance(value, str):
            value = expand_env(value, f"{self.file}: {path}")
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {value!r}")
        connectors = self.connectors
        kind_name = value.get("type")
        if isinstance(kind_name, str):
            kind_name = expand_env(kind_name, f"{self.file}: {path}.type")
        known = connectors.names(kind)
        if kind_name not in known:
            raise self.fail(f"{path}.type", f"expected one of {', '.join(known)}, got {kind_name!r}")
        try:
            config_class = connectors.config_class(kind, kind_name)
        except PluginError as exc:
            exc.with_context(file=self.file)
            raise
        return self.build_attrs(config_class, value, path)

    def build_attrs(self, cls: Any, value: Any, path: str, **extra: Any) -> Any:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {value!r}")
        if not getattr(cls, "__attrs_types_resolved__", False):  # a plugin's config, or a class inside one
            attrs.resolve_types(cls)
        fields = {f.name: f for f in attrs.fields(cls) if not f.metadata.get("internal")}
        params_field = "params" if cls is TransformStep else None
        kwargs: dict[str, Any] = dict(extra)
        params: dict[str, Any] = {}
        for key, raw in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in fields or key == params_field:
                if params_field:
                    params[key] = self.build(Any, raw, sub)
                    continue
                known = ", ".join(sorted(fields))
                raise self.fail(sub, f"unknown key (known keys: {known})")
            connector = fields[key].metadata.get("connector")
            if connector:
                kwargs[key] = self.build_connector_config(connector, raw, sub)
            else:
                kwargs[key] = self.build(fields[key].type, raw, sub)
        if params_field:
            kwargs["params"] = params
        missing = [
            name for name, f in fields.items()
            if f.default is attrs.NOTHING and name not in kwargs
        ]
        if missing:
            raise self.fail(f"{path}.{missing[0]}" if path else missing[0], "required key is missing")
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise self.fail(path, str(exc)) from exc


for _cls in list(globals().values()):
    if isinstance(_cls, type) and attrs.has(_cls) and _cls.__module__ == __name__:
        attrs.resolve_types(_cls, globals())


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"invalid YAML{where}: {problem}", file=str(path)) from exc


def default_conf_dir() -> Path:
    return Path(os.environ.get("SETL_CONF") or "conf")


def load_node(conf_dir: str | Path) -> NodeSettings:
    """Read `setl.yaml` from `conf_dir`; a missing file means all defaults."""
    conf_dir = Path(conf_dir)
    path = conf_dir / "setl.yaml"
    data = _read_yaml(path) if path.exists() else {}
    node = _Builder(str(path)).build_attrs(NodeSettings, data, "", conf_dir=str(conf_dir))
    if node.meta.store == "zookeeper" and not node.ha.zookeeper:
        raise ConfigError("ha.zookeeper: required when meta.store is zookeeper", file=str(path))
    ha = node.ha
    if not 1000 <= ha.session_timeout_ms <= 600_000:
        raise ConfigError(f"ha.session_timeout_ms: must be between 1000 and 600000, got {ha.session_timeout_ms}",
                          file=str(path))
    if ha.standby_delay_ms < 0:
        raise ConfigError("ha.standby_delay_ms: must not be negative", file=str(path))
    if ha.reassign_after_ms is not None and ha.reassign_after_ms < 0:
        raise ConfigError("ha.reassign_after_ms: must not be negative", file=str(path))
    if ha.join_grace_ms < 0:
        raise ConfigError("ha.join_grace_ms: must not be negative", file=str(path))
    if ha.expected_nodes is not None and not all(ha.expected_nodes):
        raise ConfigError("ha.expected_nodes: node ids must not be empty", file=str(path))
    if node.node.capacity is not None and node.node.capacity < 1:
        raise ConfigError(f"node.capacity: must be at least 1, got {node.node.capacity}", file=str(path))
    if node.http.listen is not None:
        try:
            parse_listen(node.http.listen)
        except ConfigError as exc:
            exc.with_context(file=str(path))
            raise
    if not ha.chroot.startswith("/") or (len(ha.chroot) > 1 and ha.chroot.endswith("/")):
        raise ConfigError(f"ha.chroot: {ha.chroot!r} must start with '/' and not end with one", file=str(path))
    return node


def pipeline_names(conf_dir: str | Path) -> list[str]:
    """The pipelines of `conf/pipelines/*.yaml` and the two directions of each `conf/channels/*.yaml`."""
    folder = Path(conf_dir) / "pipelines"
    names = {p.stem for p in folder.glob("*.yaml")} if folder.is_dir() else set()
    for channel in channel_names(conf_dir):
        names.update(channel_pipelines(conf_dir, channel))
    return sorted(names)


# --- two-way channels (docs/bidirectional.md) -----------------------------------------------


@attrs.frozen
class ChannelSite:
    """One of a channel's two MariaDB primaries: read by one direction, written by the other."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"  # needs docs/grants.md's source and target grants, and BINLOG REPLAY (or SUPER)
    password: str = attrs.field(default="", repr=False)  # may be "${ENV_VAR}"; never logged
    #: the server_id setl's writes into this site carry in its binlog (the session's server_id), which the
    #: direction reading this site drops: unused by any server or session of the topology
    setl_server_id: int = 0
    #: the gtid_domain_id of setl's writes into this site (MariaDB): a domain no server uses
    setl_gtid_domain_id: int | None = None
    reader_server_id: int = 1001  # the binlog reader's id on this site (unique among its replicas)
    #: the conflicts policy's tie-break (docs/conflicts.md): the site of the smaller number wins a tie;
    #: given to both directions as `conflicts.sites` unless the channel's `conflicts:` block names them
    priority: int = 0
    start: Any = "earliest"  # where the direction reading this site starts (as a pipeline's source.start)
    ssl: SslConfig | None = None


@attrs.frozen
class ChannelConfig:
    """`conf/channels/NAME.yaml`: two sites written by users at once, kept equal by two pipelines,
    one per direction, which share their table rules, settings, verify and conflict policy."""

    name: str = attrs.field(metadata={"internal": True})
    sites: dict[str, ChannelSite]  # exactly two: site name -> its server
    tables: tuple[TableRule, ...] = (TableRule(source=r".*"),)  # selected on both sites alike
    pipeline: PipelineSettings = attrs.Factory(PipelineSettings)
    verify: VerifySchedule | None = None
    conflicts: dict[str, Any] | None = None  # carried verbatim into both pipelines
    #: how each direction's writes are marked so the other's reader drops them (docs/bidirectional.md):
    #: `server_id` (the loader's session server_id: needs BINLOG REPLAY), `marker` (a row of
    #: setl.setl_channel_mark in every transaction, a comment on every DDL), or `auto`: server_id where
    #: the site's user may set it, else marker
    loop_guard: str = "auto"
    file: str = attrs.field(default="", metadata={"internal": True})
    #: the file's mapping: its tables, pipeline, verify and conflicts go to both pipelines as written
    raw: dict[str, Any] = attrs.field(factory=dict, metadata={"internal": True}, repr=False)

    def directions(self) -> list[tuple[str, str, str]]:
        """(pipeline name, source site, target site) of each direction, in site order."""
        a, b = list(self.sites)
        return [(f"{self.name}.{a}-to-{b}", a, b), (f"{self.name}.{b}-to-{a}", b, a)]


def channel_names(conf_dir: str | Path) -> list[str]:
    folder = Path(conf_dir) / "channels"
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def channel_pipelines(conf_dir: str | Path, channel: str) -> list[str]:
    """The names of `channel`'s two pipelines (read from its file's site names; none if unreadable)."""
    try:
        data = _read_yaml(Path(conf_dir) / "channels" / f"{channel}.yaml")
    except ConfigError:
        return []
    sites = data.get("sites") if isinstance(data, dict) else None
    if not isinstance(sites, dict) or len(sites) != 2:
        return []
    a, b = (str(name) for name in sites)
    return [f"{channel}.{a}-to-{b}", f"{channel}.{b}-to-{a}"]


def load_channel(conf_dir: str | Path, name: str) -> ChannelConfig:
    """Read and validate `channels/NAME.yaml` under `conf_dir`."""
    if not _NAME.match(name):
        raise ConfigError(f"channel name {name!r} must be letters, digits, '_', '.' or '-'")
    path = Path(conf_dir) / "channels" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(channel_names(conf_dir)) or "none"
        raise ConfigError(f"no such channel (configured: {known})", file=str(path))
    data = _read_yaml(path)
    config = _Builder(str(path)).build_attrs(ChannelConfig, data, "", name=name, file=str(path), raw=data)
    if len(config.sites) != 2:
        raise ConfigError(f"sites: a channel has exactly two sites, got {len(config.sites)}", file=str(path))
    for site, spec in config.sites.items():
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_]{0,20}$", site):
            raise ConfigError(f"sites.{site}: a site name is letters, digits or '_' (at most 21)", file=str(path))
        if spec.setl_server_id < 1:
            raise ConfigError(f"sites.{site}.setl_server_id: required: the server_id setl's writes into {site} "
                              "carry, unused by any server of the topology (docs/bidirectional.md)", file=str(path))
    (a, first), (b, second) = config.sites.items()
    if first.setl_server_id == second.setl_server_id:
        raise ConfigError(f"sites.{b}.setl_server_id: {second.setl_server_id} is also {a}'s: each direction "
                          "needs its own", file=str(path))
    if config.loop_guard not in LOOP_GUARDS:
        raise ConfigError(f"loop_guard: {config.loop_guard!r} is not one of {', '.join(LOOP_GUARDS)}", file=str(path))
    if first.setl_gtid_domain_id is not None and first.setl_gtid_domain_id == second.setl_gtid_domain_id:
        raise ConfigError(f"sites.{b}.setl_gtid_domain_id: {second.setl_gtid_domain_id} is also {a}'s: each "
                          "direction needs its own", file=str(path))
    return config


def channel_pipeline_data(channel: ChannelConfig, source: str, target: str) -> dict[str, Any]:
    """The `pipelines/NAME.yaml` mapping of the direction from site `source` to site `target`: it
    reads `source`, dropping the transactions setl wrote there (marked with `source`'s
    setl_server_id), and writes `target` in sessions marked with `target`'s."""
    src, dst = channel.sites[source], channel.sites[target]

    def server(site: ChannelSite) -> dict[str, Any]:
        data: dict[str, Any] = {"type": "mysql", "host": site.host, "port": site.port, "user": site.user,
                                "password": site.password}
        if site.ssl is not None:
            data["ssl"] = attrs.asdict(site.ssl)
        return data

    target_data = {**server(dst), "session_server_id": dst.setl_server_id, "loop_guard": channel.loop_guard,
                   "loop_mark": mark_name(channel.name, source, target)}
    if dst.setl_gtid_domain_id is not None:
        target_data["session_gtid_domain_id"] = dst.setl_gtid_domain_id
    # The reader drops both marks of the other direction's writes, whichever guard its loader chose.
    data: dict[str, Any] = {
        "source": {**server(src), "server_id": src.reader_server_id, "ignore_server_ids": [src.setl_server_id],
                   "ignore_marks": [mark_name(channel.name, target, source)], "start": src.start},
        "target": target_data,
        **{key: channel.raw[key] for key in ("tables", "pipeline", "verify") if key in channel.raw},
        "site": source,
    }
    if isinstance(channel.raw.get("conflicts"), dict):
        data["conflicts"] = {"sites": {name: site.priority for name, site in channel.sites.items()},
                             **channel.raw["conflicts"]}
    return data


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def load_pipeline(conf_dir: str | Path, name: str, connectors: ConnectorResolver) -> PipelineConfig:
    """Read and validate `pipelines/NAME.yaml` under `conf_dir`; `connectors` (the connector
    registry, `setl.connectors.registry()`) names the config class of its source and target."""
    if not _NAME.match(name):
        raise ConfigError(f"pipeline name {name!r} must be letters, digits, '_', '.' or '-'")
    path = Path(conf_dir) / "pipelines" / f"{name}.yaml"
    channel = name.partition(".")[0]
    if not path.exists() and name in channel_pipelines(conf_dir, channel):
        spec = load_channel(conf_dir, channel)
        path = Path(spec.file)
        direction = next(d for d in spec.directions() if d[0] == name)
        data = channel_pipeline_data(spec, direction[1], direction[2])
        config = _Builder(str(path), connectors).build_attrs(PipelineConfig, data, "", name=name, file=str(path),
                                                             channel=channel)
        _check_pipeline(config, str(path))
        return _resolve_ssl(config, Path(conf_dir), str(path))
    if not path.exists():
        known = ", ".join(pipeline_names(conf_dir)) or "none"
        raise ConfigError(f"no such pipeline (configured: {known})", file=str(path), pipeline=name)
    data = _read_yaml(path)
    config = _Builder(str(path), connectors).build_attrs(PipelineConfig, data, "", name=name, file=str(path))
    _check_pipeline(config, str(path))
    _check_conflicts(config, str(path))
    return _resolve_ssl(config, Path(conf_dir), str(path))


def _resolve_ssl(config: PipelineConfig, conf_dir: Path, path: str) -> PipelineConfig:
    """`source.ssl` and `target.ssl` with paths relative to the conf dir, each file checked."""
    changes: dict[str, Any] = {}
    for side in ("source", "target"):
        connector = getattr(config, side)
        ssl = getattr(connector, "ssl", None)
        if not isinstance(ssl, SslConfig):
            continue
        ssl = ssl.resolved(conf_dir)
        for key in ("ca", "cert", "key"):
            file = getattr(ssl, key)
            if file is not None and not os.path.isfile(file):
                raise ConfigError(f"{side}.ssl.{key}: file not found: {file}", file=path)
            if file is not None and not os.access(file, os.R_OK):
                raise ConfigError(f"{side}.ssl.{key}: cannot read {file}", file=path)
        changes[side] = attrs.evolve(connector, ssl=ssl)
    return attrs.evolve(config, **changes) if changes else config


def _check_pipeline(config: PipelineConfig, path: str) -> None:
    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{key}: {message}", file=path)

    settings = config.pipeline
    if not 1 <= settings.parallelism <= 64:
        raise fail("pipeline.parallelism", f"must be between 1 and 64, got {settings.parallelism}")
    if settings.batch.max_rows < 1:
        raise fail("pipeline.batch.max_rows", "must be at least 1")
    if settings.batch.max_wait_ms < 0:
        raise fail("pipeline.batch.max_wait_ms", "must not be negative")
    if settings.retry.max_attempts < 1:
        raise fail("pipeline.retry.max_attempts", "must be at least 1")
    if settings.weight < 1:
        raise fail("pipeline.weight", f"must be at least 1, got {settings.weight}")
    if settings.nodes is not None and (not settings.nodes or not all(settings.nodes)):
        raise fail("pipeline.nodes", "must name at least one node id (or be left out: any node)")
    if settings.retry.max_elapsed_ms < 0:
        raise fail("pipeline.retry.max_elapsed_ms", "must not be negative")
    if settings.quarantine.max_rows < 1 or settings.quarantine.max_bytes < 1:
        raise fail("pipeline.quarantine", "max_rows and max_bytes must be at least 1")
    if settings.on_table_error == "quarantine" and "per_table" in (settings.load.mode, settings.load.chunks):
        raise fail("pipeline.on_table_error", "quarantine needs load.mode ordered and load.chunks ordered "
                   "(per-table parts are not supported yet, docs/quarantine.md)")
    policies = [("pipeline.schema_changes", settings.schema_changes)]
    for i, rule in enumerate(config.tables):
        if rule.schema_changes is not None and rule.exclude:
            raise fail(f"tables[{i}].schema_changes", "an excluded table has no schema changes to decide: "
                       "leave it out, or drop exclude: true")
        if rule.schema_changes is not None:
            policies.append((f"tables[{i}].schema_changes", rule.schema_changes))
        try:
            re.compile(rule.source)
        except re.error as exc:
            raise fail(f"tables[{i}].source", f"invalid regex {rule.source!r}: {exc}") from exc
        if rule.columns.include is not None and rule.columns.exclude:
            raise fail(f"tables[{i}].columns", "give include or exclude, not both")
        if rule.filter is not None:
            try:
                compile(rule.filter, f"tables[{i}].filter", "eval")
            except SyntaxError as exc:
                raise fail(f"tables[{i}].filter", f"invalid expression: {exc.msg}") from exc
        try:
            rule.target.format(schema="s", table="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise fail(f"tables[{i}].target", f"bad name template {rule.target!r}: {exc}") from exc
    for key, policy in policies:
        if policy != "apply" and settings.ddl != "apply":
            raise fail(key, f"{policy} decides which DDL is applied, but pipeline.ddl is {settings.ddl} "
                       "(no DDL is applied): set pipeline.ddl: apply, or leave schema_changes out")
    if config.verify is not None:
        for i, text in enumerate(config.verify.tables):
            index = selecting_rule(config.tables, text)
            if index is None or config.tables[index].exclude:
                why = f"rule tables[{index}] excludes it" if index is not None else "no table rule matches it"
                raise ConfigError(f"not replicated by this pipeline ({why}), so it cannot be checked", file=path,
                                  pipeline=config.name, key=f"verify.tables[{i}]", table=text)


def _check_conflicts(config: PipelineConfig, path: str) -> None:
    """The ``conflicts:`` block against the pipeline's `site`: every policy it names can be decided
    the same way on both sides of the channel."""
    settings = config.conflicts
    if settings is None:
        return

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{key}: {message}", file=path, pipeline=config.name)

    sites = settings.sites
    if config.site is None:
        raise fail("site", "required with conflicts: the site this pipeline's source is (a name in conflicts.sites)")
    if sites and config.site not in sites:
        raise fail("site", f"{config.site!r} is not one of conflicts.sites ({', '.join(sites)})")
    rules = [("conflicts", settings.policy, settings.column, settings.site)]
    for name, table in settings.tables.items():
        schema, dot, rest = name.partition(".")
        if not (dot and schema and rest):
            raise fail(f"conflicts.tables.{name}", "is not SCHEMA.TABLE (the target table)")
        rules.append((f"conflicts.tables.{name}", table.policy or settings.policy, table.column or settings.column,
                      table.site or settings.site))
    for key, policy, column, site in rules:
        if policy == "last_writer_wins":
            if not column:
                raise fail(f"{key}.column", "required by last_writer_wins: the timestamp column every write sets")
            if len(sites) != 2 or len(set(sites.values())) != 2:
                raise fail("conflicts.sites", "last_writer_wins needs the channel's two sites with different "
                           "priorities, to break a tie the same way on both sides (e.g. {a: 1, b: 2})")
        if policy == "site_wins" and (not site or site not in sites):
            raise fail(f"{key}.site", f"site_wins needs the winning site, one of conflicts.sites "
                       f"({', '.join(sites) or 'none given'})")


def selecting_rule(rules: Sequence[TableRule], name: str) -> int | None:
    """The index of the rule that decides source table `name` (SCHEMA.TABLE): the first whose `source`
    regex matches the whole name (the routing plan's order, `setl.routing`); None when none does."""
    return next((i for i, rule in enumerate(rules) if re.fullmatch(rule.source, name)), None)
