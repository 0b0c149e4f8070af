"""The repair that `setl repair` and ``POST /api/v1/pipelines/{name}/repair`` share: copy the keys
a verify report found different again, through the pipeline (the running node serves the requests,
or its next start), then verify the repaired tables (`setl.verify.repair`, docs/verify.md)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from setl.config import NodeSettings, PipelineConfig
from setl.connectors import registry
from setl.control.actions import ActionResult, Progress, refuse_stale_rules
from setl.errors import UsageError
from setl.meta.base import MetaStore, Status
from setl.model import TableName


def check(config: PipelineConfig) -> None:
    """A UsageError unless the pipeline's source can read tables again and its target can be verified."""
    if not registry().source(config.source.type).capabilities.snapshots:
        raise UsageError(f"source type {config.source.type} cannot read tables again (its connector does not "
                         "declare the snapshots capability); setl repair needs a source that does, such as mysql",
                         pipeline=config.name, stage="repair")
    if config.target.type not in ("mysql", "postgresql"):
        raise UsageError(f"target type {config.target.type} cannot be verified, so not repaired either (MariaDB/MySQL "
                         "and PostgreSQL targets can); `setl snapshot --table` copies a table again",
                         pipeline=config.name, stage="repair")


def repair(settings: NodeSettings, config: PipelineConfig, meta: MetaStore, only: Sequence[TableName], *,
           report: dict[str, Any] | None, timeout: float, wait_timeout: float, progress: Progress) -> ActionResult:
    """Repair what `report` (a `setl verify --json` report; None: verify first) lists as different
    in `only` (empty: every table), and verify the repaired tables once the running node has served
    and acked the repair. The result's data: ``state`` ``nothing`` (no difference: nothing asked),
    ``deferred`` (the pipeline is not running: its next start serves the repair, nothing is verified
    yet) or ``verified``; then ``equal`` and the final ``report`` with its ``lines``."""
    from setl.routing import build_plan
    from setl.verify.repair import copies_begun, describe, plan_repairs, submit, wait_served
    from setl.verify.run import verify_pipeline

    name = config.name
    if timeout <= 0 or wait_timeout <= 0:
        raise UsageError("the repair's timeout and verify's wait timeout must be above 0", pipeline=name)
    check(config)
    routes = build_plan(settings, config)

    def whole_reason(table: TableName) -> str | None:
        route = routes.route(table.schema, table.table)
        if route is None:
            raise UsageError(f"pipeline {name}: no table rule selects {table}", pipeline=name, stage="repair")
        if route.filter is not None:
            return f"its rule tables[{route.rule_index}] has a row filter"
        if config.tables[route.rule_index].transforms:
            return f"its rule tables[{route.rule_index}] has transforms"
        return None

    if report is None:
        progress({"message": f"{name}: verifying first", "note": True})
        report = verify_pipeline(settings, config, meta, list(only), wait_timeout=wait_timeout).to_dict()
    plan = plan_repairs(report, whole_reason, list(only))
    if not plan.tables:
        return ActionResult(name, "repair", (f"{name}: nothing to repair: the report lists no difference"
                                             + (f" in {', '.join(map(str, only))}" if only else ""),),
                            changed=False, data={"state": "nothing", "equal": True})
    running = meta.state(name).status is Status.RUNNING
    if running:
        refuse_stale_rules(meta, config)
    before = copies_begun(meta, name)
    submit(meta, name, plan)
    for line in describe(plan):
        progress({"message": f"{name}: {line}"})
    if not running:
        return ActionResult(name, "repair", (f"{name} is not running: the repair is served by its next start "
                                             f"(`setl start --pipeline {name}`, --until-caught-up included); then "
                                             "run setl verify",),
                            data={"state": "deferred", "equal": None, "tables": [str(t) for t in plan.tables]})

    def alive() -> bool:
        live = meta.liveness(name)
        return meta.state(name).status is Status.RUNNING and live is not None and not live.stale(time.time())

    wait_served(meta, name, plan, before, timeout, alive=alive)
    progress({"message": f"{name}: repair served and acked; verifying {', '.join(map(str, plan.tables))}"})
    final = verify_pipeline(settings, config, meta, plan.tables, wait_timeout=wait_timeout)
    return ActionResult(name, "repair", tuple(final.lines()),
                        data={"state": "verified", "equal": final.equal, "tables": [str(t) for t in plan.tables],
                              "report": final.to_dict()})
