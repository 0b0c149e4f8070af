"""The `setl` command: start pipelines, and inspect or steer them through the meta store.

Exit codes: 0 ok, 2 bad usage or configuration, 1 runtime failure. Errors are
one line on stderr; `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import faulthandler
import functools
import importlib.metadata
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from setl import cluster_cmd, repair_cmd
from setl.config import (
    NodeSettings,
    channel_names,
    channel_pipelines,
    default_conf_dir,
    load_channel,
    load_node,
    load_pipeline,
    pipeline_names,
)
from setl.connectors import for_node, registry
from setl.control import actions
from setl.control.client import REGISTRY, ApiClient, read_token, registered_node
from setl.errors import SetlError, UsageError
from setl.logs import setup as setup_logging
from setl.meta import open_meta_store
from setl.meta.base import MetaStore
from setl.model import Position
from setl.retry import Failure, classify
from setl.scheduler import Outcome
from setl.status import conflicts_line, dead_note, position_text, status_rows, stopped_row, verify_line

log = logging.getLogger("setl")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="setl", description="Change data capture from MySQL/MariaDB binlogs.")
    parser.add_argument("--conf", type=Path, default=None,
                        help="configuration directory (default: $SETL_CONF or ./conf)")
    parser.add_argument("--debug", action="store_true", help="debug logs and tracebacks")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--node", dest="api_node", metavar="URL", default=None,
                        help="act through this node's HTTP control API instead of the meta store (status, pause, "
                             "stop, resume, position, snapshot, verify, repair, reload, switch, cluster; token from "
                             "$SETL_API_TOKEN or --token-file); zk://HOSTS/CHROOT: the node the cluster's registry "
                             "names (the pipeline's holder, else any node serving the API)")
    parser.add_argument("--token-file", type=Path, default=None, metavar="FILE",
                        help="the API token for --node (first line of FILE)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    start = commands.add_parser("start", help="run pipelines until stopped")
    start.add_argument("--pipeline", action="append", default=[], metavar="NAME",
                       help="a pipeline to run (repeatable)")
    start.add_argument("--all", action="store_true", help="run every configured pipeline")
    start.add_argument("--until-caught-up", action="store_true",
                       help="exit 0 once the source's log end, as it stood at start, is acked")

    status = commands.add_parser("status", help="show pipelines, positions and errors")
    status.add_argument("--pipeline", action="append", default=[], metavar="NAME")
    status.add_argument("--channel", action="append", default=[], metavar="NAME",
                        help="a two-way channel's two directions, and its lag each way")
    status.add_argument("--json", action="store_true", help="machine-readable output")

    for verb, text in (("pause", "pause a pipeline (a running node stops it gracefully)"),
                       ("resume", "resume a paused pipeline")):
        sub = commands.add_parser(verb, help=text)
        sub.add_argument("--pipeline", required=True, metavar="NAME")
        if verb == "resume":
            sub.add_argument("--table", metavar="SCHEMA.TABLE",
                             help="replay a quarantined target table's kept changes, then let it follow the "
                                  "stream again (docs/quarantine.md)")
            sub.add_argument("--chunk-rows", type=int, default=1000, metavar="N",
                             help="kept changes applied per replay transaction (default 1000)")

    stop = commands.add_parser("stop", help="pause a pipeline and wait until no process runs it (it stays stopped "
                                            "until `setl resume`)")
    stop.add_argument("--pipeline", required=True, metavar="NAME")
    stop.add_argument("--timeout", type=float, default=60.0, metavar="S",
                      help="seconds to wait for its node to stop it (default 60)")

    position = commands.add_parser("position", help="show or reset a pipeline's position")
    actions = position.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="the acked position and recent acks")
    show.add_argument("--pipeline", required=True, metavar="NAME")
    show.add_argument("--history", type=int, default=5, metavar="N", help="acks to list (default 5)")
    show.add_argument("--json", action="store_true")
    reset = actions.add_parser("reset", help="restart a stopped pipeline from another position")
    reset.add_argument("--pipeline", required=True, metavar="NAME")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="LOG:OFFSET", help="the position to restart after")
    where.add_argument("--start", action="store_true",
                       help="forget the position: restart from the source's configured start")
    reset.add_argument("--force", action="store_true", help="even if the pipeline looks running")

    switch = commands.add_parser("switch", help="hand a pipeline's mainstem to a standby node (HA)")
    switch.add_argument("--pipeline", required=True, metavar="NAME")
    switch.add_argument("--to", metavar="NODE", help="the standby to hand over to (default: any)")
    switch.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the new holder (default 60; 0: do not wait)")

    check = commands.add_parser("check", help="everything a start would find wrong, found without starting")
    chosen = check.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--pipeline", action="append", default=[], metavar="NAME")
    chosen.add_argument("--channel", action="append", default=[], metavar="NAME",
                        help="a two-way channel (conf/channels/NAME.yaml): both sites, then each direction")
    chosen.add_argument("--all", action="store_true", help="every pipeline and channel of the conf directory")
    check.add_argument("--strict", action="store_true", help="warnings count as errors (exit 1)")
    schema = commands.add_parser("schema", help="print (or --apply) the DDL of missing target tables")
    schema.add_argument("--pipeline", required=True, metavar="NAME")
    schema.add_argument("--apply", action="store_true", help="run the DDL on the target")
    snapshot = commands.add_parser("snapshot", help="copy a table again, online, while the pipeline streams "
                                                    "(or at its next start)")
    snapshot.add_argument("--pipeline", required=True, metavar="NAME")
    snapshot.add_argument("--table", required=True, action="append", metavar="SCHEMA.TABLE",
                          help="a source table the pipeline's rules select (repeatable)")

    reload = commands.add_parser("reload", help="apply a pipeline file's new table rules to its running node "
                                                "(tables added are copied online)")
    reload.add_argument("--pipeline", required=True, metavar="NAME")
    reload.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="seconds to wait for the node's answer (default 120)")

    cluster_cmd.add_parser(commands)
    verify = commands.add_parser("verify", help="compare source and target tables, online, chunk by chunk "
                                                "(exit 0 equal, 1 different, 2 error)")
    verified = verify.add_mutually_exclusive_group(required=True)
    verified.add_argument("--pipeline", metavar="NAME")
    verified.add_argument("--channel", metavar="NAME", help="a two-way channel: both sites compared, each direction "
                                                            "in turn (exit 0 when both are equal)")
    verify.add_argument("--table", action="append", default=[], metavar="SCHEMA.TABLE",
                        help="a source table the pipeline's rules select (repeatable; default: all of them)")
    verify.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    verify.add_argument("--attempts", type=int, default=3, metavar="N",
                        help="checks of a difference before it is reported (default 3)")
    verify.add_argument("--max-rows-per-second", type=float, default=0.0, metavar="N",
                        help="read the source at most this fast (default: unbounded)")
    verify.add_argument("--chunk-rows", type=int, default=10_000, metavar="N", help="rows per chunk (default 10000)")
    verify.add_argument("--wait-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the pipeline's acked position to reach a read's (default 60)")
    verify.add_argument("--max-lag", type=float, default=30.0, metavar="S",
                        help="pause before each chunk while the pipeline's lag is above S seconds (default 30; 0: "
                             "never)")
    verify.add_argument("--lag-timeout", type=float, default=600.0, metavar="S",
                        help="give up (exit 2) after pausing for the lag this many seconds in all (default 600)")
    verify.add_argument("--engine", choices=["local", "spark"], default="local",
                        help="where chunks are hashed: here, or as Spark tasks on spark.master (default local)")

    repair_cmd.add_parser(commands)

    plugins = commands.add_parser("plugins", help="installed sources, targets and transforms")
    plugins.add_argument("action", choices=["list"])
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("setl")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _setup_logging(args.debug)
    try:
        conf = args.conf or default_conf_dir()
        if args.api_node and args.command not in API_COMMANDS:
            raise UsageError(f"setl {args.command} does not act through --node yet: run it where the "
                             "configuration directory is (it works on the meta store)")
        if not Path(conf).is_dir() and args.command != "plugins" and not args.api_node:
            raise UsageError(f"configuration directory {conf} does not exist (give --conf DIR or set $SETL_CONF)")
        handler = {
            "start": cmd_start, "status": cmd_status, "pause": cmd_pause, "stop": cmd_stop, "resume": cmd_resume,
            "position": cmd_position, "plugins": cmd_plugins, "switch": cmd_switch, "schema": cmd_schema,
            "snapshot": cmd_snapshot, "check": cmd_check, "cluster": cluster_cmd.cmd_cluster,
            "verify": cmd_verify, "reload": cmd_reload, "repair": cmd_repair,
        }[args.command]
        return handler(args, Path(conf))
    except SetlError as exc:
        if args.debug:
            log.exception("failed")
        print(f"setl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line unless --debug
        if args.debug:
            log.exception("internal error")
        print(f"setl: internal error: {type(exc).__name__}: {exc} (run with --debug for a traceback)",
              file=sys.stderr)
        return 1


#: The commands that act through a node's control API with ``--node URL``.
API_COMMANDS = ("status", "pause", "stop", "resume", "position", "snapshot", "verify", "reload", "switch", "cluster",
                "repair")


def _client(args: argparse.Namespace) -> ApiClient:
    """The client of ``--node``: a node's URL, or the node the cluster's registry names (``zk://``)."""
    url = args.api_node
    if url.startswith(REGISTRY):
        pipeline = getattr(args, "pipeline", None)
        url = registered_node(url, pipeline if isinstance(pipeline, str) else None)
    return ApiClient(url, read_token(args.token_file))


def follow_operation(client: ApiClient, started: dict[str, Any], what: str) -> dict[str, Any]:
    """`ApiClient.follow`, printing the operation's progress messages as they come."""
    return client.follow(started, what, lambda message: print(message, flush=True))


def _print_api(answer: dict[str, Any]) -> int:
    """Print an action's answer from the API (its ``message``); exit 0."""
    print(answer.get("message", ""), flush=True)
    return 0


def _setup_logging(debug: bool) -> None:
    """Before the configuration is read: $SETL_LOG_LEVEL (or INFO), as text; `cmd_start` then applies `log:`."""
    setup_logging(os.environ.get("SETL_LOG_LEVEL", "INFO"), "text", debug=debug)


@contextlib.contextmanager
def _pipeline_meta(conf: Path, name: str, settings: NodeSettings | None = None) -> Iterator[MetaStore]:
    """The node's meta store, once `name` is known to be a pipeline; closed afterwards."""
    meta = open_meta_store(settings or load_node(conf))
    try:
        _known_pipeline(conf, meta, name)
        yield meta
    finally:
        meta.close()


def cmd_start(args: argparse.Namespace, conf: Path) -> int:
    from setl.node import Node, tune_gc
    from setl.observe.catchup import start_bars

    settings = load_node(conf)
    setup_logging(os.environ.get("SETL_LOG_LEVEL", settings.log.level), settings.log.format, debug=args.debug)
    names = pipeline_names(conf) if args.all else list(dict.fromkeys(args.pipeline))
    if not names:
        raise UsageError("give --pipeline NAME (repeatable) or --all")
    configs = [load_pipeline(conf, name, for_node(settings)) for name in names]
    meta = _open_meta_retrying(settings, configs)
    node = Node(settings, configs, meta, reload_config=lambda name: load_pipeline(conf, name, for_node(settings)))
    tune_gc(settings.runtime)  # once everything is loaded and validated

    def on_signal(signum: int, frame: Any) -> None:
        # The main thread runs this between two of its own bytecodes, maybe inside a `with lock:` of
        # the node's that stopping takes too: a handler that took it would wait for itself forever
        # (a node once hung so after SIGTERM, silent until killed). So it only hands the signal on,
        # by a byte in a pipe (no lock), to `_SignalThread`, which stops the node or asks a reload.
        if signum != signal.SIGHUP:
            if node_stopping[0]:  # logging's locks are reentrant: this thread may log inside one
                log.warning("second %s: exiting now; unacked batches will be replayed", signal.Signals(signum).name)
                os._exit(1)
            node_stopping[0] = True
        os.write(signals.write_end, bytes([signum]))

    node_stopping = [False]
    grace = stop_grace(configs)
    signals = _SignalThread(node, grace)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack on stderr
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)  # `setl reload`: new table rules
    # Threads waiting on a server (loads, chunk reads, the binlog) get the GIL back within 0.5 ms
    # of their answer instead of up to 5 ms, so a target is not left idle while Python work runs.
    sys.setswitchinterval(0.0005)
    started = time.monotonic()
    bars = start_bars(node, args.until_caught_up)  # on a terminal only
    try:
        results = node.run(until_caught_up=args.until_caught_up)
    finally:
        meta.close()
        if bars is not None:
            bars.stop()
    if args.until_caught_up:
        _summary(node, results, time.monotonic() - started)
    code = 0
    for result in results:
        if result.outcome is Outcome.PAUSED and result.error is not None and "setl resume" not in str(result.error):
            why = "retrying cannot help" if classify(result.error) is Failure.PERMANENT else "retries exhausted"
            print(f"setl: error: pipeline {result.name} paused, {why}: {result.error}; "
                  f"fix the cause, then `setl resume --pipeline {result.name}`", file=sys.stderr)
            code = max(code, 1)
        elif result.error is not None and node_stopping[0] and classify(result.error) is Failure.TRANSIENT:
            log.info("pipeline=%s stopped while retrying its start: %s", result.name, result.error)
        elif result.error is not None:
            print(f"setl: error: {result.error}", file=sys.stderr)
            code = max(code, getattr(result.error, "exit_code", 1))
        elif args.until_caught_up and result.outcome is not Outcome.CAUGHT_UP and not node_stopping[0]:
            print(f"setl: error: pipeline={result.name}: ended {result.outcome}", file=sys.stderr)
            code = max(code, 1)
        elif result.outcome is Outcome.CAUGHT_UP:
            log.info("pipeline=%s caught up", result.name)
    return code


def stop_grace(configs: list[Any]) -> float:
    """How long a stopping node may take before it exits anyway: the longest drain of its
    pipelines (`pipeline.drain_timeout_ms`) and 30 s to close connections (the systemd unit
    gives 120 s, docs/deploy.md)."""
    return max((config.pipeline.drain_timeout_ms for config in configs), default=30_000) / 1000 + 30


class _SignalThread:
    """What `setl start` does on a signal, off the signal handler (which only writes the signal's
    number to `write_end`): SIGHUP asks the node to reload its pipelines' files; SIGINT or SIGTERM
    starts the grace watchdog (`_out_of_grace`), then stops the node gracefully. A daemon thread,
    waiting on the pipe's read end for as long as the process runs."""

    def __init__(self, node: Any, grace: float) -> None:
        self.node, self.grace = node, grace
        self.watchdog: threading.Timer | None = None  # once stopping: the grace watchdog
        self._read_end, self.write_end = os.pipe()
        thread = threading.Thread(target=self._run, name="setl-signals", daemon=True)
        thread.start()

    def _run(self) -> None:
        while True:
            received = os.read(self._read_end, 1)
            if not received:
                return
            signum = signal.Signals(received[0])
            try:
                self._handle(signum)
            except Exception:  # this thread must live on: the next signal needs it
                log.exception("handling %s failed", signum.name)

    def _handle(self, signum: signal.Signals) -> None:
        if signum is signal.SIGHUP:
            self.node.request_reload()
            return
        log.info("%s received: stopping gracefully within %.0fs (again to force)", signum.name, self.grace)
        # Whatever holds a thread (a server that stopped answering mid-statement), the process ends
        # within its grace: what was not acked is replayed at the next start, as after a kill. Started
        # before the stop, which may itself wait on such a thread.
        self.watchdog = threading.Timer(self.grace, _out_of_grace, args=(self.grace,))
        self.watchdog.daemon = True
        self.watchdog.name = "setl-stop-grace"
        self.watchdog.start()
        self.node.stop()


def _out_of_grace(grace: float) -> None:
    log.error("not stopped within %.0fs of the signal (a server that does not answer?): exiting now; "
              "batches not acked are replayed at the next start", grace)
    logging.shutdown()
    os._exit(1)


def _summary(node: Any, results: list, seconds: float) -> None:
    """`--until-caught-up`'s last words on stdout: per pipeline, how it ended, the changes acked per
    table and the duration."""
    for result in results:
        progress = node.progress[result.name]
        total = sum(progress.tables.values())
        ended = "caught up" if result.outcome is Outcome.CAUGHT_UP else str(result.outcome.value
                                                                             if result.outcome else "failed")
        where = f" at {progress.last.position}" if progress.last is not None else ""
        print(f"{result.name}: {ended}{where} in {seconds:.1f}s: {total:,} changes"
              f" ({total / max(seconds, 1e-3):,.0f}/s) in {len(progress.tables)} table(s)")
        counts: collections.Counter[str] = collections.Counter()
        for (schema, table), n in progress.tables.items():
            counts[f"{schema}.{table}" if table else schema] += n
        width = max((len(t) for t in counts), default=0)
        for table, count in sorted(counts.items()):
            print(f"  {table:<{width}}  {count:>12,}")


def _open_meta_retrying(settings: NodeSettings, configs: list) -> MetaStore:
    """The node's meta store; a transient failure (ZooKeeper away) is retried as the pipelines' retry says."""
    from setl.retry import Backoff, retry_transient

    retry = max((c.pipeline.retry for c in configs), key=lambda r: r.max_elapsed_ms)

    def waiting(error: BaseException, verdict: Any, delay: float) -> None:
        log.warning("cannot open the meta store, %s, next try in %.1fs: %s", verdict.message, delay, error)

    return retry_transient(lambda: open_meta_store(settings), Backoff.from_settings(retry), on_retry=waiting)


def _status_rows(conf: Path, names: list[str]) -> list[dict[str, Any]]:
    settings = load_node(conf)
    configured = pipeline_names(conf)
    if settings.meta.store == "sqlite" and not settings.resolve(settings.meta.path).exists():
        # Nothing ran here yet: report the configured pipelines without creating a meta store.
        for name in names:
            if name not in configured:
                raise UsageError(f"unknown pipeline {name!r} (known: {', '.join(configured) or 'none'})")
        return _invalid_files(conf, settings, [stopped_row(name) for name in names or configured], configured)
    meta = open_meta_store(settings)
    try:
        for name in names:
            _known_pipeline(conf, meta, name)
        rows = status_rows(meta, names or sorted(set(configured) | set(meta.pipelines())))
    finally:
        meta.close()
    return _invalid_files(conf, settings, rows, configured)


def _invalid_files(conf: Path, settings: NodeSettings, rows: list[dict[str, Any]],
                   configured: list[str]) -> list[dict[str, Any]]:
    """A stopped pipeline whose file would not start it shows status ``invalid`` and the file's error
    (`setl start` would refuse it with exit 2), instead of a plain ``stopped``."""
    for row in rows:
        if row["status"] != "stopped" or row["pipeline"] not in configured:
            continue
        try:
            load_pipeline(conf, row["pipeline"], for_node(settings))
        except SetlError as exc:
            row["status"], row["error"] = "invalid", str(exc)
    return rows


def cmd_status(args: argparse.Namespace, conf: Path) -> int:
    if args.api_node:
        client = _client(args)
        rows = [client.call("GET", f"/pipelines/{name}") for name in args.pipeline] if args.pipeline \
            else client.call("GET", "/pipelines")["pipelines"]
    else:
        names = list(args.pipeline)
        for channel in args.channel:
            directions = channel_pipelines(conf, channel)
            if not directions:
                load_channel(conf, channel)  # names what is wrong with the file
            names += [name for name in directions if name not in names]
        rows = _status_rows(conf, names)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no pipelines configured or known")
        return 0
    from rich.console import Console
    from rich.table import Table

    # Fits the terminal (80 columns when not one): a table whose position and status never wrap,
    # then each pipeline's error on one line of its own, cut to the width (the whole text is in
    # `--json`).
    from rich.text import Text

    now = time.time()
    ha = "holder" in rows[0]
    header = ["pipeline", "status", "position", "lag", "rows/s", "acked", *(("holder",) if ha else ())]
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name in header:
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=16 if name == "pipeline" else None,
                         justify="right" if name in ("lag", "rows/s", "acked") else "left")
    notes = []
    for row in rows:
        lag, rate = row["lag_seconds"], row["rows_per_second"]
        style = {"paused": "bold red", "running": "green", "dead": "bold red", "retrying": "yellow",
                 "invalid": "bold red"}.get(
            row["status"], "")
        table.add_row(row["pipeline"], Text(str(row["status"]), style=style), position_text(row["position"]),
                      "-" if lag is None else _seconds(lag), "-" if rate is None else f"{rate:,.0f}",
                      _seconds(now - row["acked_at"]) + " ago" if row["acked_at"] else "-",
                      *((row["holder"] or "-",) if ha else ()))
        note = " ".join(_status_note(row, now).split())
        if note:
            notes.append(Text(f"{row['pipeline']}: {note}", style="red" if row["error"] or row["status"] == "dead"
                              else "yellow"))
    console = Console(highlight=False)
    console.print(table)
    for line in notes:  # whole, wrapped at the terminal's width: the cause is what the operator needs
        console.print(line, overflow="fold")
    for text in _snapshot_lines(rows):
        console.print(Text(text, no_wrap=True, overflow="ellipsis"), no_wrap=True, overflow="ellipsis")
    for channel in args.channel or channel_names(conf):
        for summary in _channel_lines(channel, channel_pipelines(conf, channel), {r["pipeline"]: r for r in rows}):
            console.print(Text(summary), overflow="fold")
    for kept in quarantine_lines(rows):
        console.print(Text(kept, style="red"), overflow="fold")
    for row in rows:
        if row.get("verify"):
            console.print(Text(verify_line(row["pipeline"], row["verify"], now),
                               style="" if row["verify"]["equal"] else "red"), overflow="fold")
        if row.get("conflicts"):
            console.print(Text(conflicts_line(row["pipeline"], row["conflicts"]), style="yellow"), overflow="fold")
    return 0


def _channel_lines(channel: str, directions: list[str], rows: dict[str, dict[str, Any]]) -> list[str]:
    """A line per direction of a two-way channel in `rows`: its way, its status and its lag."""
    lines = []
    for name in directions:
        row = rows.get(name)
        if row is not None:
            lag = row["lag_seconds"]
            way = name.removeprefix(f"{channel}.").replace("-to-", " -> ")
            lines.append(f"channel {channel}: {way} {row['status']}, lag {'-' if lag is None else _seconds(lag)}")
    return lines


def _seconds(value: float) -> str:
    """A duration in the unit that keeps it short: 0.4s, 12s, 5m, 3h."""
    if value < 10:
        return f"{value:.1f}s"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.0f}h"


def cmd_snapshot(args: argparse.Namespace, conf: Path) -> int:
    if args.api_node:
        started = _client(args).call("POST", f"/pipelines/{args.pipeline}/snapshot", {"tables": args.table})
        print(f"{args.pipeline}: snapshot of {', '.join(args.table)} requested: operation {started['id']} on "
              f"{args.api_node} follows the copies")
        return 0
    config, tables = actions.snapshot_config(conf, args.pipeline, args.table)
    with _pipeline_meta(conf, args.pipeline) as meta:
        return _print(actions.request_snapshot(meta, config, tables))


def cmd_repair(args: argparse.Namespace, conf: Path) -> int:
    return repair_cmd.cmd_repair(args, conf, _pipeline_meta)


def cmd_reload(args: argparse.Namespace, conf: Path) -> int:
    """Ask the node running the pipeline, on any host, to re-read its file (`actions.reload`): 0
    applied, unchanged or deferred (paused: applied at `setl resume`), 1 refused (the old rules keep
    running) or no answer. The node reads its own copy of the file: on another host, change the
    file there first."""
    if args.api_node:
        client = _client(args)
        started = client.call("POST", f"/pipelines/{args.pipeline}/reload", {"timeout_s": args.timeout})
        try:
            result = follow_operation(client, started, "reload")
        except SetlError as exc:
            if "reload refused" in exc.message:
                print(f"setl: error: {exc.message}", file=sys.stderr)
                return 1
            raise
        return _print_api({"message": result["message"].splitlines()[-1]})
    config = load_pipeline(conf, args.pipeline, for_node(load_node(conf)))  # a broken file stops here
    with _pipeline_meta(conf, args.pipeline) as meta:
        progress, printed = _progress_printer()
        try:
            return _print(actions.reload(meta, config, args.timeout, progress), printed)
        except SetlError as exc:
            if exc.message.startswith("reload refused"):
                print(f"setl: error: {exc.message}", file=sys.stderr)
                return 1
            raise


def quarantine_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per quarantined table of each pipeline (docs/quarantine.md)."""
    return [f"{row['pipeline']}: {t['table']} quarantined since {t['first_position']}, {t['changes']} changes "
            f"({t['bytes']} bytes) kept: {t['cause']}; fix it, then `setl resume --pipeline {row['pipeline']} "
            f"--table {t['table']}`" for row in rows for t in row.get("quarantined") or []]


def _snapshot_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per table copy of each pipeline that has snapshot progress."""
    lines = []
    for row in rows:
        for table in row.get("snapshot") or []:
            total = max(table["estimate"], table["rows"])
            share = f" ({100 * table['rows'] // total}%)" if total and table["status"] != "done" else ""
            lines.append(f"{row['pipeline']}: snapshot {table['table']} {table['status']} "
                         f"{table['rows']}/{total} rows{share}")
        for table in row.get("snapshot_requested") or []:
            lines.append(f"{row['pipeline']}: snapshot {table} requested")
    return lines


def _status_note(row: dict[str, Any], now: float) -> str:
    """A pipeline's note line: the error, ``retrying since T: CAUSE`` while riding out an outage,
    or when and where a dead one was last seen (kept out of the table, whose columns it would break)."""
    if row["status"] == "dead":
        return f"dead, {dead_note(row, now)}" + (f": {row['error']}" if row.get("error") else "")
    if row.get("retrying"):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["retrying_since"]))
        return f"retrying since {since}: {row['retrying']}"
    return row["error"] or ""


def _known_pipeline(conf: Path, meta: MetaStore, name: str) -> None:
    actions.known_pipeline(conf, meta, name)


def _print(result: actions.ActionResult, printed: Collection[str] = ()) -> int:
    """Print an action's lines (those a progress callback has not printed already); exit 0."""
    for line in result.lines:
        if line not in printed:
            print(line, flush=True)
    return 0


def _progress_printer() -> tuple[Callable[[dict[str, Any]], None], list[str]]:
    """A progress callback for an action that prints each event's message, and what it printed."""
    printed: list[str] = []

    def progress(event: dict[str, Any]) -> None:
        if "message" in event:
            print(event["message"], flush=True)
            printed.append(event["message"])

    return progress, printed


def cmd_pause(args: argparse.Namespace, conf: Path) -> int:
    if args.api_node:
        return _print_api(_client(args).call("POST", f"/pipelines/{args.pipeline}/pause"))
    with _pipeline_meta(conf, args.pipeline) as meta:
        return _print(actions.pause(meta, args.pipeline))


def cmd_stop(args: argparse.Namespace, conf: Path) -> int:
    """Exit 0 once no process runs the pipeline (`actions.stop`); 1 when its node has not stopped it in time."""
    if args.timeout < 0:
        raise UsageError("--timeout must be at least 0")
    if args.api_node:
        client = _client(args)
        started = client.call("POST", f"/pipelines/{args.pipeline}/stop", {"timeout_s": args.timeout})
        return _print_api(follow_operation(client, started, "stop"))
    with _pipeline_meta(conf, args.pipeline) as meta:
        progress, printed = _progress_printer()
        return _print(actions.stop(meta, args.pipeline, args.timeout, progress), printed)


def cmd_resume(args: argparse.Namespace, conf: Path) -> int:
    if args.api_node:
        client = _client(args)
        if args.table:
            if args.chunk_rows < 1:
                raise UsageError("--chunk-rows must be at least 1")
            started = client.call("POST", f"/pipelines/{args.pipeline}/quarantine/{args.table}/replay",
                                  {"chunk_rows": args.chunk_rows})
            print(follow_operation(client, started, f"the replay of {args.table}")["message"].splitlines()[-1],
                  flush=True)
        return _print_api(client.call("POST", f"/pipelines/{args.pipeline}/resume"))
    if args.table:
        if args.chunk_rows < 1:
            raise UsageError("--chunk-rows must be at least 1")
        _replay_table(args.pipeline, args.table, conf, args.chunk_rows)
    with _pipeline_meta(conf, args.pipeline) as meta:
        return _print(actions.resume(meta, args.pipeline))


def _replay_table(pipeline: str, table: str, conf: Path, chunk: int) -> None:
    """`setl resume --table`: `actions.replay_table` on the pipeline's target, its progress logged."""
    node = load_node(conf)
    config = load_pipeline(conf, pipeline, for_node(node))
    with _pipeline_meta(conf, pipeline):
        pass  # a known pipeline

    def progress(event: dict[str, Any]) -> None:
        if "message" in event:
            print(event["message"], flush=True)
        else:
            log.info("pipeline=%s table=%s replay: %d applied, %d left", pipeline, table, event["applied"],
                     event["left"])

    print(actions.replay_table(node, config, table, chunk, progress).lines[-1], flush=True)


def cmd_position(args: argparse.Namespace, conf: Path) -> int:
    if args.api_node:
        client = _client(args)
        if args.action == "show":
            shown = client.call("GET", f"/pipelines/{args.pipeline}/position?history={args.history}")
            _show_position(shown, args.json)
            return 0
        body: dict[str, Any] = {"force": args.force, **({"start": True} if args.start else {"to": args.to})}
        return _print_api(client.call("POST", f"/pipelines/{args.pipeline}/position/reset", body))
    with _pipeline_meta(conf, args.pipeline) as meta:
        if args.action == "show":
            _show_position(actions.position_show(meta, args.pipeline, args.history), args.json)
            return 0
        return _print(actions.position_reset(meta, args.pipeline, to=args.to, start=args.start, force=args.force))


def _show_position(shown: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(shown, indent=2))
        return
    name = shown["pipeline"]
    if shown["position"] is None:
        print(f"{name}: no position yet (starts at the source's configured start)")
        return
    origin = " (set by reset)" if shown["reset"] else ""
    print(f"{name}: {Position.from_dict(shown['position'])}{origin}, batch {shown['batch']}, epoch {shown['epoch']}")
    for a in shown["history"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["time"]))
        print(f"  {when}  batch {a['batch']:>8}  epoch {a['epoch']:>4}  {Position.from_dict(a['position'])}")


def cmd_switch(args: argparse.Namespace, conf: Path) -> int:
    if args.api_node:
        client = _client(args)
        body: dict[str, Any] = {"timeout_s": args.timeout, **({"to": args.to} if args.to else {})}
        started = client.call("POST", f"/pipelines/{args.pipeline}/switch", body)
        result = follow_operation(client, started, "switch")
        for line in result["message"].splitlines()[1:]:  # the first was streamed
            print(line, flush=True)
        return 0
    settings = load_node(conf)
    if settings.meta.store != "zookeeper":
        raise UsageError("setl switch needs HA: meta.store: zookeeper in setl.yaml")
    with _pipeline_meta(conf, args.pipeline, settings) as meta:
        progress, printed = _progress_printer()
        return _print(actions.switch(meta, args.pipeline, args.to, args.timeout, progress), printed)


def cmd_schema(args: argparse.Namespace, conf: Path) -> int:
    """Print the DDL that creates the pipeline's missing target tables (``--apply``: run it). An
    existing table that does not fit, or anything else that stops it, is one line and exit 2."""
    from setl.connectors import build_schema
    from setl.pipeline import build_select, build_transform, table_creator
    from setl.pipeline.checks import check_rules
    from setl.routing import build_plan

    settings = load_node(conf)
    config = load_pipeline(conf, args.pipeline, for_node(settings))
    target = None
    try:
        target = build_schema(config, settings)
        if target is None:
            print(f"-- pipeline {config.name}: target type {config.target.type} needs no DDL "
                  "(it makes its tables from the rows)")
            return 0
        routing = build_plan(settings, config)
        select = build_select(settings, config, routing)
        transform = build_transform(settings, config, routing)
        creator = table_creator(config, routing, select, transform, target)
        described = select.describe()
        for line in check_rules(config, described) if described is not None else ():
            print(f"-- pipeline {config.name}: warning: {line}")
        for planned in creator.planner.tables():
            mapped = target.mapped_names(planned)
            if mapped:
                print(f"-- pipeline {config.name}: target table {planned.table}: names over 63 bytes are "
                      f"mapped (docs/sql-targets.md): {', '.join(mapped)}")
        missing = creator.missing()
        if not missing:
            print(f"-- pipeline {config.name}: every target table exists ({len(creator.planner.tables())} checked)")
            return 0
        for table, statements in missing:
            sources = ", ".join(str(t) for t in table.sources)
            print(f"-- pipeline {config.name}: target table {table.table} (from {sources})")
            for statement in statements:
                print(f"{statement};")
        if args.apply:
            for _table, statements in missing:
                target.execute(statements)
            print(f"-- pipeline {config.name}: created {len(missing)} table(s)")
        return 0
    except SetlError as exc:
        exc.with_context(pipeline=config.name)
        exc.exit_code = 2
        raise
    except Exception as exc:  # a driver's error (the target refused a statement, or is away)
        raise UsageError(f"{type(exc).__name__}: {exc}", pipeline=config.name, stage="schema") from exc
    finally:
        if target is not None:
            target.close()


def cmd_check(args: argparse.Namespace, conf: Path) -> int:
    """One line per finding for each pipeline (`setl.pipeline.preflight`). Exit codes as `setl start`
    gives the same failures: 2 when a failing finding (an error; with --strict, a warning too) is a
    configuration error, 1 when one is any other (a server that cannot be reached), 0 otherwise."""
    from setl.pipeline.channel_checks import check_channel
    from setl.pipeline.preflight import Finding, check_pipeline

    settings = load_node(conf)
    channels = channel_names(conf) if args.all else list(args.channel)
    names = sorted(pipeline_names(conf)) if args.all else list(args.pipeline)
    for channel in args.channel:  # its two directions, checked as any pipeline
        names += [name for name in channel_pipelines(conf, channel) if name not in names]
    if not names and not channels:
        raise UsageError(f"no pipeline in {conf / 'pipelines'} and no channel in {conf / 'channels'}")
    failing = ("error", "warning") if args.strict else ("error",)
    code = 0
    for channel in channels:
        try:
            findings = list(check_channel(load_channel(conf, channel)))
        except SetlError as exc:
            findings = [Finding(f"channel:{channel}", "error", "config", str(exc), exc.exit_code)]
        for finding in findings:
            print(finding.line(), flush=True)
            if finding.level in failing:
                code = max(code, finding.code)
    meta: MetaStore | None = None
    try:  # stored positions: the source's retention and the target's position are judged against them
        if settings.meta.store != "sqlite" or settings.resolve(settings.meta.path).exists():
            meta = open_meta_store(settings)  # a meta store not made yet has acked nothing (none is made)
    except SetlError as exc:
        print(f"warning meta store: cannot open it ({exc}): stored positions are not checked", flush=True)
        meta = None
    try:
        for name in names:
            ack = meta.position(name) if meta is not None else None
            for finding in check_pipeline(settings, functools.partial(load_pipeline, conf, name, for_node(settings)),
                                          name, ack.position if ack is not None else None, meta):
                print(finding.line(), flush=True)
                if finding.level in failing:
                    code = max(code, finding.code)
    finally:
        if meta is not None:
            meta.close()
    return code


def cmd_verify(args: argparse.Namespace, conf: Path) -> int:
    """Compare the pipeline's source and target tables (`setl.verify`): the report on stdout (text or
    `--json`); exit 0 when equal, 1 when a difference persists, 2 when no verdict could be reached.
    `--channel`: both directions of a two-way channel in turn, equal when both are."""
    if args.attempts < 1 or args.chunk_rows < 1 or args.max_rows_per_second < 0 or args.wait_timeout <= 0 \
            or args.max_lag < 0 or args.lag_timeout <= 0:
        raise UsageError("--attempts and --chunk-rows must be at least 1, --max-rows-per-second and --max-lag at "
                         "least 0, --wait-timeout and --lag-timeout above 0")
    if args.api_node:
        return _verify_through(args)
    if args.channel:
        names = channel_pipelines(conf, args.channel)
        if not names:
            load_channel(conf, args.channel)  # names what is wrong with the file
        reports = [_verify_one(args, conf, name) for name in names]
        if args.json:
            print(json.dumps([report.to_dict() for report in reports], indent=2))
        else:
            for name, report in zip(names, reports):
                print(f"-- {name}")
                print(report.text())
        return 0 if all(report.equal for report in reports) else 1
    report = _verify_one(args, conf, args.pipeline)
    print(report.text(args.json))
    return 0 if report.equal else 1


def _verify_one(args: argparse.Namespace, conf: Path, pipeline: str) -> Any:
    """`setl verify` of one pipeline: its report."""
    from setl.verify.run import verify_pipeline

    settings = load_node(conf)
    config = load_pipeline(conf, pipeline, registry())
    tables = actions.parse_tables(args.table)

    def progress(table: str, rows: int, estimate: int, done: bool) -> None:
        share = f" ({min(99, 100 * rows // estimate)}%)" if estimate and not done else ""
        print(f"\r\x1b[2K{table}: {rows:,} rows{share}" + ("\n" if done else ""), end="", file=sys.stderr,
              flush=True)

    pausing: list[str] = []  # the table a pause is under way for

    def paused(table: str, lag: float | None) -> None:
        if lag is None:
            if pausing:
                log.info("pipeline=%s stage=verify table=%s resumed: lag at most %gs", pipeline, table,
                         args.max_lag)
            pausing.clear()
            return
        if sys.stderr.isatty():
            print(f"\r\x1b[2K{table}: paused: lag {lag:.0f}s > {args.max_lag:g}s", end="", file=sys.stderr,
                  flush=True)
        if not pausing:
            log.info("pipeline=%s stage=verify table=%s paused: lag %.0fs > %gs", pipeline, table, lag,
                     args.max_lag)
            pausing.append(table)

    with _pipeline_meta(conf, pipeline, settings) as meta:
        report = verify_pipeline(settings, config, meta, tables, attempts=args.attempts,
                                 max_rows_per_second=args.max_rows_per_second, chunk_rows=args.chunk_rows,
                                 wait_timeout=args.wait_timeout, progress=progress if sys.stderr.isatty() else None,
                                 max_lag=args.max_lag, lag_timeout=args.lag_timeout, paused=paused,
                                 engine=args.engine)
    return report


def _verify_through(args: argparse.Namespace) -> int:
    """`setl --node URL verify`: start the node's verify operation, follow its events, print its report."""
    client = _client(args)
    started = client.call("POST", f"/pipelines/{args.pipeline}/verify", {
        "tables": args.table, "attempts": args.attempts, "chunk_rows": args.chunk_rows,
        "wait_timeout_s": args.wait_timeout, "max_lag_s": args.max_lag})
    print(f"{args.pipeline}: verify is operation {started['id']} on {args.api_node}", file=sys.stderr, flush=True)
    end: dict[str, Any] = {}
    for event in client.events(started["id"]):
        if event.get("event") == "end":
            end = event
    if end.get("state") != "done":
        raise SetlError(f"verify failed on {args.api_node}: {end.get('error') or 'the stream ended early'}",
                        pipeline=args.pipeline, stage="verify")
    report = end["result"]
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "lines"}, indent=2))
    else:
        for line in report["lines"]:
            print(line)
    return 0 if report["equal"] else 1


def cmd_plugins(args: argparse.Namespace, conf: Path) -> int:
    from setl.connectors import format_connector_table
    from setl.plugins import format_plugin_table

    settings = load_node(conf)
    print("SOURCES")
    print(format_connector_table("source", for_node(settings)))
    print("\nTARGETS")
    print(format_connector_table("target", for_node(settings)))
    print("\nTRANSFORMS")
    print(format_plugin_table([str(settings.resolve(d)) for d in settings.plugins.dirs],
                              blocked=settings.plugins.blocked))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
