"""`setl repair`: copy the keys a verify report found different again, through the pipeline (the
running node serves the requests, or the next `setl start`), then verify the repaired tables
(`setl.control.repair`, the API's too, docs/verify.md); `setl.cli` hands the ``repair`` command here."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from setl.config import load_node, load_pipeline
from setl.connectors import for_node
from setl.control import repair
from setl.errors import UsageError
from setl.model import TableName


def add_parser(commands: Any) -> None:
    repair = commands.add_parser("repair", help="copy the rows verify finds different again, through the "
                                                "pipeline, then verify (exit 0 equal, 1 not, 2 error)")
    repair.add_argument("--pipeline", required=True, metavar="NAME")
    repair.add_argument("--table", action="append", default=[], metavar="SCHEMA.TABLE",
                        help="repair only this source table (repeatable; default: every table that differs)")
    repair.add_argument("--from-report", type=Path, metavar="FILE",
                        help="the differences of a `setl verify --json` report (default: run verify first)")
    repair.add_argument("--json", action="store_true", help="the final verify report as JSON on stdout")
    repair.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds to wait for the running node to serve the repair (default 300)")
    repair.add_argument("--wait-timeout", type=float, default=60.0, metavar="S",
                        help="verify's wait for the acked position to reach a read's (default 60)")


def cmd_repair(args: argparse.Namespace, conf: Path, pipeline_meta: Any) -> int:
    """Exit 0 once the repaired tables verify equal (or nothing differs); 1 when they do not, or when
    the pipeline is not running (the requests wait for its next start, and nothing is verified yet);
    2 on bad usage or no verdict. `pipeline_meta(conf, name, settings)` opens the meta store once
    the pipeline is known (the CLI's). The work is `setl.control.repair.repair`, as the API's."""
    from setl.verify.repair import load_report

    if args.timeout <= 0 or args.wait_timeout <= 0:
        raise UsageError("--timeout and --wait-timeout must be above 0")
    if args.api_node:
        return _through_node(args)
    settings = load_node(conf)
    config = load_pipeline(conf, args.pipeline, for_node(settings))
    repair.check(config)
    try:
        only = [TableName.parse(text) for text in args.table]
    except ValueError as exc:
        raise UsageError(f"--table {exc}") from None
    report = load_report(args.from_report, config.name) if args.from_report is not None else None

    def progress(event: dict[str, Any]) -> None:
        print(event["message"], file=sys.stderr if event.get("note") else sys.stdout, flush=True)

    with pipeline_meta(conf, config.name, settings) as meta:
        result = repair.repair(settings, config, meta, only, report=report, timeout=args.timeout,
                               wait_timeout=args.wait_timeout, progress=progress)
    return _finish(result.data, result.lines, args.json)


def _through_node(args: argparse.Namespace) -> int:
    """`setl --node URL repair`: the node's repair operation, followed to its end."""
    from setl.control.client import ApiClient, read_token
    from setl.verify.repair import load_report

    client = ApiClient(args.api_node, read_token(args.token_file))
    body: dict[str, Any] = {"tables": args.table, "timeout_s": args.timeout, "wait_timeout_s": args.wait_timeout}
    if args.from_report is not None:
        body["report"] = load_report(args.from_report, args.pipeline)
    started = client.call("POST", f"/pipelines/{args.pipeline}/repair", body)
    result = client.follow(started, "repair", lambda message: print(message, flush=True))
    return _finish(result, tuple(result["message"].splitlines()), args.json)


def _finish(data: dict[str, Any], lines: tuple[str, ...], as_json: bool) -> int:
    state = data["state"]
    if state == "verified":
        print(json.dumps(data["report"], indent=2) if as_json else "\n".join(lines))
        return 0 if data["equal"] else 1
    print("\n".join(lines), flush=True)
    return 0 if state == "nothing" else 1

