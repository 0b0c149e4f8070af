"""A pipeline's routing plan: its `tables` rules compiled once into one `Route` per source table,
which Extract, Transform, batch DDL tasks and Load-side consumers all read.

No stage reconstructs a routing decision from its result (a target name can come from several
source tables, and a table name may hold dots): a routed `RowChange` keeps its `source`, and the
route is looked up by that (schema, table) pair.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from types import CodeType
from typing import TYPE_CHECKING

import attrs

from setl.config import NodeSettings, PipelineConfig, TableRule
from setl.errors import ConfigError, ExtractError, PluginError
from setl.model import TableName

if TYPE_CHECKING:
    from setl.plugins import BoundStep, Registry

__all__ = ["Route", "RoutingPlan", "TableName", "TargetTemplate", "build_plan", "flat_name"]


@attrs.frozen
class TargetTemplate:
    """A rule's ``target`` split into a schema template and a table template *before* substitution.

    The split is at the last dot outside a ``{field}``, so ``replica.{table}`` puts every table
    into schema ``replica`` whatever dots its name holds; a template without such a dot keeps the
    source's schema (``{schema}``).
    """

    schema: str
    table: str

    @classmethod
    def parse(cls, template: str) -> TargetTemplate:
        """Split a rule's ``target`` at its last dot outside braces (``{schema}_copy.{table}``);
        a template without one keeps the source's schema (``{schema}``)."""
        depth, last, i = 0, -1, 0
        while i < len(template):
            char = template[i]
            if depth == 0 and char in "{}" and template[i:i + 2] == char * 2:
                i += 2  # an escaped brace
                continue
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
            elif char == "." and depth == 0:
                last = i
            i += 1
        if last < 0:
            return cls("{schema}", template)
        return cls(template[:last], template[last + 1:])

    def format(self, source: TableName) -> TableName:
        """The target table for `source` (``{schema}`` and ``{table}`` filled in)."""
        return TableName(self.schema.format(schema=source.schema, table=source.table),
                         self.table.format(schema=source.schema, table=source.table))


@attrs.frozen(eq=False)
class Route:
    """How one source table is replicated, decided once from the first rule that matches it.

    * `target`: the target table, as a (schema, table) pair;
    * `include`/`exclude`/`rename`: the source columns kept, and their target names;
    * `filter`: the compiled row filter (a Python expression over the source columns), or None;
    * `steps`: the validated transform chain (empty when the plan was compiled without a registry,
      or the rule has no transforms);
    * `schema_changes`: its schema-change policy (`setl.ddl.policy`): the rule's, else the
      pipeline's ``pipeline.schema_changes``.

    Routes compare by identity: a plan hands out one per source table.
    """

    rule_index: int
    source: TableName
    target: TableName
    include: frozenset[str] | None
    exclude: frozenset[str]
    rename: Mapping[str, str]
    filter: CodeType | None
    steps: tuple[BoundStep, ...] = ()
    schema_changes: str = "apply"

    @property
    def reshapes(self) -> bool:
        """Whether rows change their columns on the way (a column left out or renamed)."""
        return self.include is not None or bool(self.exclude) or bool(self.rename)

    def keeps(self, column: str) -> bool:
        """Whether a source column goes to the target (exact, case-sensitive name)."""
        return (self.include is None or column in self.include) and column not in self.exclude

    def target_columns(self, columns: Sequence[str]) -> tuple[str, ...]:
        """The target's column names for the source table's `columns` (what schema creation needs)."""
        return tuple(self.rename.get(c, c) for c in columns if self.keeps(c))

    def target_key(self, primary_key: Sequence[str]) -> tuple[str, ...]:
        """The target's key columns; an `ExtractError` when the column rules drop one (the target
        could no longer apply the row idempotently)."""
        for column in primary_key:
            if not self.keeps(column):
                raise ExtractError(f"column filter drops primary-key column {column!r} "
                                   f"(rule tables[{self.rule_index}])")
        return tuple(self.rename.get(c, c) for c in primary_key)


@attrs.frozen
class _Rule:
    """One `tables` rule, compiled: its regex, target template, filter and validated steps."""

    index: int
    pattern: re.Pattern[str]
    exclude: bool
    target: TargetTemplate
    include: frozenset[str] | None
    excluded_columns: frozenset[str]
    rename: Mapping[str, str]
    filter: CodeType | None
    steps: tuple[BoundStep, ...]
    schema_changes: str


class RoutingPlan:
    """The routes of one pipeline, compiled once (`compile`) and shared by every stage.

    `route(schema, table)` is the one routing decision: first matching rule wins, a table no rule
    matches or whose rule says ``exclude: true`` has no route (None). Lookups are cached per
    (schema, table); safe to call from several threads.
    """

    def __init__(self, rules: Sequence[_Rule], *, pipeline: str = "") -> None:
        self.pipeline = pipeline
        self._rules = tuple(rules)
        self._routes: dict[tuple[str, str], Route | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def compile(cls, rules: Sequence[TableRule], *, pipeline: str = "", registry: Registry | None = None,
                file: str | None = None, schema_changes: str = "apply") -> RoutingPlan:
        """Compile `rules`; with a `registry`, validate every transform step against it now.
        `schema_changes` is the policy of a rule that sets none (``pipeline.schema_changes``).

        Raises `ConfigError` for a bad regex, filter or target, `PluginError` for a bad step.
        """
        compiled = []
        for i, rule in enumerate(rules):
            try:
                pattern = re.compile(rule.source)
            except re.error as exc:
                raise ConfigError(f"invalid regex: {exc}", file=file, pipeline=pipeline or None,
                                  key=f"tables[{i}].source") from exc
            target = TargetTemplate.parse(rule.target)
            if not rule.exclude and (not target.schema or not target.table):
                raise ConfigError(f"target {rule.target!r} names no schema or no table", file=file,
                                  pipeline=pipeline or None, key=f"tables[{i}].target")
            try:
                code = compile(rule.filter, f"tables[{i}].filter", "eval") if rule.filter else None
            except SyntaxError as exc:
                raise ConfigError(f"invalid expression: {exc.msg}", file=file, pipeline=pipeline or None,
                                  key=f"tables[{i}].filter") from exc
            steps: list[BoundStep] = []
            if registry is not None and not rule.exclude:
                for j, step in enumerate(rule.transforms):
                    try:
                        steps.append(registry.validate(step, index=j))
                    except PluginError as exc:
                        exc.with_context(file=file, pipeline=pipeline or None,
                                         key=f"tables[{i}].transforms[{j}]")
                        raise
            compiled.append(_Rule(
                index=i, pattern=pattern, exclude=rule.exclude, target=target,
                include=frozenset(rule.columns.include) if rule.columns.include is not None else None,
                excluded_columns=frozenset(rule.columns.exclude), rename=dict(rule.rename), filter=code,
                steps=tuple(steps), schema_changes=rule.schema_changes or schema_changes,
            ))
        return cls(compiled, pipeline=pipeline)

    def selects(self, schema: str, table: str) -> bool:
        """Whether source table (`schema`, `table`) is replicated (a rule routes it)."""
        return self.route(schema, table) is not None

    def route(self, schema: str, table: str) -> Route | None:
        """The route of source table (`schema`, `table`), or None when it is not replicated."""
        key = (schema, table)
        try:
            return self._routes[key]
        except KeyError:
            pass
        found = self._resolve(TableName(schema, table))
        with self._lock:
            return self._routes.setdefault(key, found)

    def _resolve(self, source: TableName) -> Route | None:
        name = f"{source.schema}.{source.table}"  # what the rules' `source` regexes match, by contract
        for rule in self._rules:
            if not rule.pattern.fullmatch(name):
                continue
            if rule.exclude:
                return None
            try:
                target = rule.target.format(source)
            except (KeyError, IndexError, ValueError, AttributeError) as exc:
                raise ExtractError(f"target of rule tables[{rule.index}] cannot be formatted: "
                                   f"{type(exc).__name__}: {exc}", pipeline=self.pipeline or None,
                                   table=str(source)) from exc
            if not target.schema or (source.table and not target.table):  # a schema-level DDL has no table
                raise ExtractError(f"rule tables[{rule.index}] maps to an empty target name {target}",
                                   pipeline=self.pipeline or None, table=str(source))
            return Route(rule.index, source, target, rule.include, rule.excluded_columns, rule.rename,
                         rule.filter, rule.steps, rule.schema_changes)
        return None


def build_plan(node: NodeSettings, config: PipelineConfig) -> RoutingPlan:
    """A pipeline's routing plan, its transform steps validated against the node's plugins now."""
    registry = None
    if any(rule.transforms for rule in config.tables):
        from setl.plugins import load_registry

        registry = load_registry(node.plugins.dirs, base=node.conf_dir, blocked=node.plugins.blocked)
    return RoutingPlan.compile(config.tables, pipeline=config.name, registry=registry, file=config.file or None,
                               schema_changes=config.pipeline.schema_changes)


def flat_name(schema: str, table: str) -> str:
    """One string for a (schema, table) pair where a target has a single name level (a directory, an
    SQLite table): ``SCHEMA.TABLE``, each part %XX-quoted where it holds ``%``, ``.``, ``/``, ``\\``
    or a control character, so ``s``.``a.b`` and ``s.a``.``b`` never share a name. Plain names stay
    as they are."""
    return f"{_quote_part(schema)}.{_quote_part(table)}"


def _quote_part(part: str) -> str:
    if part in ("", ".", ".."):
        return "".join(f"%{b:02X}" for b in part.encode()) or "%"
    return "".join(c if c not in "%./\\" and c.isprintable() else "".join(f"%{b:02X}" for b in c.encode())
                   for c in part)
