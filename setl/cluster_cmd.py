"""`setl cluster status|drain|move`: the cluster of nodes sharing one ZooKeeper (docs/cluster.md),
read and asked through `setl.ha.cluster`; `setl.cli` hands the ``cluster`` command here."""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from setl.config import load_node
from setl.control import actions
from setl.errors import UsageError


def add_parser(commands: Any) -> None:
    """The ``cluster`` command and its actions, on the CLI's subparsers."""
    cluster = commands.add_parser("cluster", help="the nodes sharing one ZooKeeper and their pipelines (HA)")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)
    status = actions.add_parser("status", help="nodes, their pipelines, weights, capacity, last rebalance")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    drain = actions.add_parser("drain", help="move a node's pipelines away (before maintenance)")
    drain.add_argument("--node", required=True, metavar="ID")
    drain.add_argument("--undo", action="store_true", help="let the node run pipelines again")
    drain.add_argument("--timeout", type=float, default=120.0, metavar="S",
                       help="wait this long for the node to run nothing (0: do not wait)")
    move = actions.add_parser("move", help="move a pipeline to a node (hand-over at a batch boundary)")
    move.add_argument("--pipeline", required=True, metavar="NAME")
    move.add_argument("--to", required=True, metavar="ID")
    move.add_argument("--timeout", type=float, default=120.0, metavar="S",
                      help="wait this long for the node to run it (0: do not wait)")


@contextmanager
def _coordinator(conf: Path) -> Iterator[Any]:
    settings = load_node(conf)
    if settings.meta.store != "zookeeper" or not settings.ha.zookeeper:
        raise UsageError("setl cluster needs HA: meta.store: zookeeper in setl.yaml")
    from setl.ha import Coordinator  # imports kazoo: only when asked for

    coordinator = Coordinator(settings.ha.zookeeper, root=settings.ha.chroot,
                              session_timeout=settings.ha.session_timeout_ms / 1000.0).start()
    try:
        yield coordinator
    finally:
        coordinator.stop()


def cmd_cluster(args: argparse.Namespace, conf: Path) -> int:
    if args.api_node:
        return _through_node(args)
    from setl.ha.cluster import cluster_view as read_view
    from setl.meta.zookeeper import ZooKeeperMetaStore
    from setl.status import dead_runs

    with _coordinator(conf) as co:
        # a node `setl status` reports dead is lost in this view too (the same liveness records)
        meta = ZooKeeperMetaStore(co, owns_session=False)
        cluster_view = functools.partial(read_view, dead=functools.partial(dead_runs, meta))
        if args.action == "status":
            view = cluster_view(co)
            print(json.dumps(view, indent=2, sort_keys=True) if args.json else "\n".join(status_lines(view)))
            return 0

        def progress(event: dict[str, Any]) -> None:
            if "message" in event:
                print(event["message"], flush=True)

        if args.action == "drain":
            result = actions.drain(co, meta, args.node, args.undo, args.timeout, progress)
        else:
            result = actions.move(co, meta, args.pipeline, args.to, args.timeout, progress)
        for line in result.lines[1:] if not (args.action == "drain" and args.undo) else result.lines:
            print(line)
        return 0


def _through_node(args: argparse.Namespace) -> int:
    """`setl --node URL cluster ...`: the node's ``/cluster`` routes, drain and move followed to their end."""
    from setl.control.client import ApiClient, read_token

    client = ApiClient(args.api_node, read_token(args.token_file))
    if args.action == "status":
        view = client.call("GET", "/cluster")
        print(json.dumps(view, indent=2, sort_keys=True) if args.json else "\n".join(status_lines(view)))
        return 0
    if args.action == "drain":
        started = client.call("POST", f"/cluster/nodes/{args.node}/drain",
                              {"undo": args.undo, "timeout_s": args.timeout})
    else:
        started = client.call("POST", f"/cluster/pipelines/{args.pipeline}/move",
                              {"to": args.to, "timeout_s": args.timeout})
    result = client.follow(started, f"cluster {args.action}", lambda message: print(message, flush=True))
    lines = result["message"].splitlines()
    for line in lines[1:] if not (args.action == "drain" and args.undo) else lines:
        print(line)
    return 0


def status_lines(view: dict[str, Any]) -> list[str]:
    """`setl cluster status` as text: one line per node, then one per pipeline."""
    lines = [f"coordinator: {view.get('coordinator') or '-'}   moves so far: {view.get('moves', 0)}"]
    last = view.get("last_rebalance")
    if last:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.get("time", 0)))
        lines.append(f"last rebalance: {when} {last.get('pipeline')} {last.get('from')} -> {last.get('to')} "
                     f"({last.get('reason')})")
    lines.append(f"{'NODE':<16} {'LIVE':<5} {'CAPACITY':<9} {'WEIGHT':<7} PIPELINES")  # LIVE: yes or lost
    for name, node in view["nodes"].items():
        state = "yes" if node["live"] else "lost"
        if node["draining"]:
            state += ",draining"
        capacity = "-" if node["capacity"] is None else str(node["capacity"])
        lines.append(f"{name:<16} {state:<5} {capacity:<9} {node['weight']:<7} {', '.join(node['pipelines']) or '-'}")
    lines.append(f"{'PIPELINE':<24} {'WEIGHT':<7} {'NODE':<16} {'RUNS ON':<16} STANDBY")
    for name, row in view["pipelines"].items():
        node = row["node"] or (f"(lost: {row['lost']})" if row.get("lost") else "(unassigned)")
        if row["moving_from"]:
            node += f" <- {row['moving_from']}"
        lines.append(f"{name:<24} {row['weight']:<7} {node:<16} {row['holder'] or '-':<16} {row['standby'] or '-'}")
    return lines
