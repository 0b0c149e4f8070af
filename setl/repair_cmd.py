"""`setl repair`: copy the keys a verify report found different again, through the pipeline (the
running node serves the requests, or the next `setl start`), then verify the repaired tables
(`setl.verify.repair`, docs/verify.md); `setl.cli` hands the ``repair`` command here."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from setl.config import load_node, load_pipeline
from setl.connectors import for_node, registry
from setl.errors import UsageError
from setl.meta.base import Status
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


def cmd_repair(args: argparse.Namespace, conf: Path, pipeline_meta: Any, refuse_stale_rules: Any) -> int:
    """Exit 0 once the repaired tables verify equal; 1 when they do not, or when the pipeline is
    not running (the requests wait for its next start, and nothing is verified yet); 2 on bad usage
    or no verdict. `pipeline_meta(conf, name, settings)` opens the meta store once the pipeline is
    known (the CLI's); `refuse_stale_rules(meta, config)` is the CLI's check that a running node
    runs the file's rules (as for `setl snapshot`)."""
    from setl.routing import build_plan
    from setl.verify.repair import copies_begun, describe, load_report, plan_repairs, submit, wait_served
    from setl.verify.run import verify_pipeline

    if args.timeout <= 0 or args.wait_timeout <= 0:
        raise UsageError("--timeout and --wait-timeout must be above 0")
    settings = load_node(conf)
    config = load_pipeline(conf, args.pipeline, for_node(settings))
    if not registry().source(config.source.type).capabilities.snapshots:
        raise UsageError(f"source type {config.source.type} cannot read tables again (its connector does not "
                         "declare the snapshots capability); setl repair needs a source that does, such as mysql",
                         pipeline=config.name, stage="repair")
    if config.target.type not in ("mysql", "postgresql"):
        raise UsageError(f"target type {config.target.type} cannot be verified, so not repaired either (MariaDB/MySQL "
                         "and PostgreSQL targets can); `setl snapshot --table` copies a table again",
                         pipeline=config.name, stage="repair")
    try:
        only = [TableName.parse(text) for text in args.table]
    except ValueError as exc:
        raise UsageError(f"--table {exc}") from None
    routes = build_plan(settings, config)

    def whole_reason(table: TableName) -> str | None:
        route = routes.route(table.schema, table.table)
        if route is None:
            raise UsageError(f"pipeline {config.name}: no table rule selects {table}", pipeline=config.name,
                             stage="repair")
        if route.filter is not None:
            return f"its rule tables[{route.rule_index}] has a row filter"
        if config.tables[route.rule_index].transforms:
            return f"its rule tables[{route.rule_index}] has transforms"
        return None

    with pipeline_meta(conf, config.name, settings) as meta:
        if args.from_report is not None:
            report = load_report(args.from_report, config.name)
        else:
            print(f"{config.name}: verifying first", file=sys.stderr, flush=True)
            report = verify_pipeline(settings, config, meta, only, wait_timeout=args.wait_timeout).to_dict()
        plan = plan_repairs(report, whole_reason, only)
        if not plan.tables:
            print(f"{config.name}: nothing to repair: the report lists no difference"
                  + (f" in {', '.join(map(str, only))}" if only else ""))
            return 0
        running = meta.state(config.name).status is Status.RUNNING
        if running:
            refuse_stale_rules(meta, config)
        before = copies_begun(meta, config.name)
        submit(meta, config.name, plan)
        for line in describe(plan):
            print(f"{config.name}: {line}", flush=True)
        if not running:
            print(f"{config.name} is not running: the repair is served by its next start (`setl start "
                  f"--pipeline {config.name}`, --until-caught-up included); then run setl verify", flush=True)
            return 1

        def alive() -> bool:
            live = meta.liveness(config.name)
            return meta.state(config.name).status is Status.RUNNING and live is not None and not live.stale(
                time.time())

        wait_served(meta, config.name, plan, before, args.timeout, alive=alive)
        print(f"{config.name}: repair served and acked; verifying {', '.join(map(str, plan.tables))}", flush=True)
        final = verify_pipeline(settings, config, meta, plan.tables, wait_timeout=args.wait_timeout)
    print(final.text(args.json))
    return 0 if final.equal else 1
