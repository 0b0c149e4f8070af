#!/usr/bin/env python3
"""Start, stop and inspect long-lived dev servers (MariaDB, PostgreSQL, ZooKeeper) in fixed dirs.

    python tools/devservers.py start mariadb --dir var/dev/mariadb-src --port 3307
    python tools/devservers.py start postgres --port 5433
    python tools/devservers.py status
    python tools/devservers.py stop --dir var/dev/mariadb-src
    python tools/devservers.py stop            # every server under var/dev (p1's demo servers too)

Servers run detached: they outlive this command and are found again through the ``server.json``
in their directory (kind, port, pid). Data is kept across stop and start; delete the directory to
start afresh. MariaDB's root password is empty unless --password is given (pass it again on later
starts); PostgreSQL's superuser is ``postgres`` with trust auth on 127.0.0.1.
Exit codes: 0 ok, 1 a server failed to start or stop (or, for status, is not running), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from setl.testing.servers import (
    SERVER_CLASSES,
    MariaDBServer,
    Server,
    ServerError,
    open_server,
)

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "var" / "dev"  # the demo's p1 servers live here too


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"devservers: --option expects KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def _found(args: argparse.Namespace) -> list[Path]:
    """The server dirs a stop or status command is about."""
    if args.dir:
        return [Path(d) for d in args.dir]
    root = Path(args.root)
    dirs = sorted(p.parent for p in root.glob("*/server.json"))
    if args.kind:
        dirs = [d for d in dirs if _kind(d) == args.kind]
    return dirs


def _kind(path: Path) -> str | None:
    try:
        return json.loads((path / "server.json").read_text()).get("kind")
    except (OSError, ValueError):
        return None


def _describe(server: Server) -> str:
    state = f"running  pid {server.pid}" if server.running else "stopped"
    return f"{server.kind:<10} {server.host}:{server.port:<6} {state:<16} {server.base_dir}"


def cmd_start(args: argparse.Namespace) -> int:
    path = Path(args.dir or Path(args.root) / args.kind).absolute()
    path.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, object] = {"port": args.port, "startup_timeout": args.timeout}
    if args.option:
        kwargs["options"] = _options(args.option)
    if args.kind == "mariadb":
        kwargs.update(server_id=args.server_id, password=args.password or "")
    elif args.password:
        raise SystemExit("devservers: --password applies to mariadb only")
    server = SERVER_CLASSES[args.kind](path, **kwargs).detach()
    if server.running:
        print(f"already running: {_describe(server)}")
        return 0
    try:
        server.start()
    except ServerError as exc:
        print(f"devservers: {exc}", file=sys.stderr)
        return 1
    print(f"started: {_describe(server)}")
    print(f"log: {server.log_path}")
    if isinstance(server, MariaDBServer):
        print(f"connect: mariadb -h {server.host} -P {server.port} -u root")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    status = 0
    dirs = _found(args)
    if not dirs:
        print("no servers found")
    for path in dirs:
        try:
            server = open_server(path).detach()
            if not server.running:
                print(f"not running: {_describe(server)}")
                continue
            server.kill() if args.kill else server.stop(timeout=args.timeout)
            print(f"{'killed' if args.kill else 'stopped'}: {_describe(server)}")
        except ServerError as exc:
            print(f"devservers: {path}: {exc}", file=sys.stderr)
            status = 1
    return status


def cmd_status(args: argparse.Namespace) -> int:
    dirs = _found(args)
    if not dirs:
        print("no servers found")
        return 1
    status = 0
    for path in dirs:
        try:
            server = open_server(path).detach()
        except ServerError as exc:
            print(f"devservers: {exc}", file=sys.stderr)
            status = 1
            continue
        print(_describe(server))
        if not server.running:
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devservers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(DEFAULT_ROOT),
                        help="where servers live by default (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True)

    start = commands.add_parser("start", help="start a server (detached) and wait until it answers")
    start.add_argument("kind", choices=sorted(SERVER_CLASSES))
    start.add_argument("--dir", help="the server's directory (default: ROOT/KIND)")
    start.add_argument("--port", type=int, help="port on 127.0.0.1 (default: the last one used, or a free one)")
    start.add_argument("--server-id", type=int, default=1, help="MariaDB server_id (default: 1)")
    start.add_argument("--password", help="MariaDB root password (default: empty)")
    start.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="a server setting (my.cnf, postgresql.conf or zoo.cfg); repeatable")
    start.add_argument("--timeout", type=float, default=60.0, help="startup timeout in seconds")
    start.set_defaults(func=cmd_start)

    for name, func, text in (("stop", cmd_stop, "stop servers cleanly"),
                             ("status", cmd_status, "show servers and whether they run")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("kind", nargs="?", choices=sorted(SERVER_CLASSES),
                         help="only servers of this kind (default: all under ROOT)")
        sub.add_argument("--dir", action="append", help="a server directory; repeatable")
        sub.set_defaults(func=func)
        if name == "stop":
            sub.add_argument("--kill", action="store_true", help="SIGKILL instead of a clean stop")
            sub.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
