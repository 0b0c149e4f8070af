"""Rule reload on a running node (SIGHUP, `setl reload`): what a re-read pipeline file changes, and
whether the node can apply it online.

Only the table rules may change online: tables added to or removed from the selection, with the
same source, target, pipeline settings and transform steps, and every table selected both before
and after routed by an identical rule (same target template, columns, renames and filter). The
node then drains its in-flight batches, swaps the stages built here for the old ones and asks
for an online copy (`setl snapshot --table`) of every table the new rules add. Anything else is
refused as a whole (`ReloadRefused`): the old configuration keeps running, never half-applied.
"""

from __future__ import annotations

import contextlib
import logging

import attrs

from setl.config import NodeSettings, PipelineConfig, TableRule
from setl.errors import SetlError
from setl.meta.base import MetaStore
from setl.model import TableName
from setl.pipeline.build import build_stages, describe_tables
from setl.pipeline.chain import Stages
from setl.pipeline.checks import check_rules, rules_fingerprint
from setl.routing import RoutingPlan
from setl.schema import check_tables

log = logging.getLogger("setl.pipeline")


class ReloadRefused(SetlError):
    """A re-read pipeline file that cannot be applied while the pipeline runs; the old one keeps running."""


@attrs.frozen
class Reload:
    """A reload the node applies at its next batch boundary: the new config, its stages (built,
    checked, not opened), and the source tables the new rules add (copied online) or drop."""

    config: PipelineConfig
    stages: Stages = attrs.field(eq=False)
    added: tuple[TableName, ...]
    removed: tuple[TableName, ...]

    @property
    def fingerprint(self) -> str:
        return rules_fingerprint(self.config)

    def describe(self) -> str:
        parts = [f"{len(self.added)} table(s) added" + (f" ({', '.join(map(str, self.added))}: copied online)"
                                                       if self.added else ""),
                 f"{len(self.removed)} removed" + (f" ({', '.join(map(str, self.removed))})" if self.removed else "")]
        return ", ".join(parts)


def _settings_change(old: PipelineConfig, new: PipelineConfig) -> str | None:
    """What changed besides the table rules, in words, or None."""
    for what in ("source", "target", "pipeline", "verify"):
        if getattr(old, what) != getattr(new, what):
            return f"its {what} settings changed"
    steps = [(rule.source, rule.transforms) for rule in old.tables if rule.transforms]
    if steps != [(rule.source, rule.transforms) for rule in new.tables if rule.transforms]:
        return "its transform steps changed"
    return None


def _treatment(rule: TableRule) -> TableRule:
    """A rule without its `source` regex: how it treats the tables it takes."""
    return attrs.evolve(rule, source="")


def prepare(settings: NodeSettings, old: PipelineConfig, new: PipelineConfig, meta: MetaStore,
            running: Stages) -> Reload | None:
    """The reload of `old` (running on `running`) to `new` (None: the table rules are unchanged).

    Builds and checks the new stages against the source's tables, without opening the target or
    touching the running pipeline. `ReloadRefused` names what cannot change online.
    """
    name = old.name
    changed = _settings_change(old, new)
    if changed is not None:
        raise ReloadRefused(f"{changed} in {new.file or 'its file'}: only table rules change online; "
                            f"restart the pipeline to apply it (the running configuration is kept)",
                            pipeline=name, stage="reload")
    if old.tables == new.tables:
        return None
    try:
        stages = build_stages(settings, new, meta)
    except SetlError as exc:
        raise ReloadRefused(f"the new rules do not build: {exc}", pipeline=name, stage="reload") from exc
    try:
        tables = describe_tables(new, stages, always=True)
        if tables is None:
            raise ReloadRefused("the source cannot describe its tables now; try again", pipeline=name, stage="reload")
        for line in check_rules(new, tables):
            log.warning("pipeline=%s reload: %s", name, line)
        before = RoutingPlan.compile(old.tables, pipeline=name, file=old.file or None)
        after = RoutingPlan.compile(new.tables, pipeline=name, file=new.file or None)
        added: list[TableName] = []
        for table in tables:
            source = table.table
            was, now = before.route(source.schema, source.table), after.route(source.schema, source.table)
            if now is None:
                continue
            if was is None:
                added.append(source)
            elif _treatment(old.tables[was.rule_index]) != _treatment(new.tables[now.rule_index]):
                raise ReloadRefused(f"table {source} would be replicated differently (its rule's target, columns "
                                    f"or filter changed): restart the pipeline to apply it", pipeline=name,
                                    stage="reload", table=str(source))
        selected = {table.table for table in tables}
        described = describe_tables(old, running, always=True) or ()
        removed = [t.table for t in described if t.table not in selected]
        check_tables(stages.load, tables, first_start=False)  # seeds the table creator with the new tables
    except BaseException:
        with contextlib.suppress(Exception):
            stages.load.close()
        raise
    return Reload(new, stages, tuple(added), tuple(removed))


__all__ = ["Reload", "ReloadRefused", "prepare"]
