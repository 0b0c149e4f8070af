"""`setl check`: everything a start would find wrong with a pipeline, found without starting it.

For each pipeline, in the order a start meets them: its configuration (file, keys, plugins, TLS
files), the source's server settings (one line per setting that is not fine, with its fix, and a
summary: `judge_settings()` of a source that has one), the source (connection, grants: `check()`),
the rules against the source's tables (`setl.pipeline.checks`), the target tables (each one
missing is planned with the type mapping; each existing one must fit), and the Spark steps
(analysed against the tables' columns: this starts Spark). Nothing is written anywhere: no
position, no fence, no table.

Each finding is one line (`Finding`); a pipeline is fine when none is an error (`--strict` makes
warnings errors too). Refused server settings do not stop the checks after them (the source's
`check()`, its connection and cascades, waits for them to be fixed).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

import attrs

from setl.config import NodeSettings, PipelineConfig
from setl.connectors import NO_TABLES, build_schema, creates_tables
from setl.errors import SetlError
from setl.meta.base import MetaStore
from setl.model import Position
from setl.pipeline import identity
from setl.pipeline.build import analyse_steps, build_select, build_stages, build_transform, table_creator
from setl.pipeline.checks import check_rules, judge_source
from setl.routing import build_plan
from setl.schema.create import find_creator


@attrs.frozen
class Finding:
    """One line of a check: `level` ok, warning or error; `what` was checked; `text` says what."""

    pipeline: str
    level: str
    what: str
    text: str
    #: the exit code `setl start` gives the same failure: 2 a configuration error, 1 any other
    code: int = 1

    def line(self) -> str:
        return f"{self.level:7} pipeline={self.pipeline} {self.what}: {self.text}"


def check_pipeline(node: NodeSettings, load: Callable[[], PipelineConfig], name: str,
                   saved: Position | None = None, meta: MetaStore | None = None) -> Iterator[Finding]:
    """The findings for pipeline `name` (its config read by `load`; `saved`: its stored position,
    if any), one at a time, stopping after the first error a later check depends on. With `meta`
    (this node's meta store), also whether the target still holds what the meta store says it got
    (`setl.pipeline.identity.preview`)."""
    def found(level: str, what: str, text: str, code: int = 1) -> Finding:
        text = " ".join(text.split())
        text = text.removeprefix(f"pipeline={name} ").removeprefix(f"pipeline={name}: ")  # named once, up front
        return Finding(name, level, what, text, code)

    try:
        config = load()
    except SetlError as exc:
        yield found("error", "config", str(exc), exc.exit_code)
        return
    yield found("ok", "config", f"{config.file or name}: source {config.source.type}, target {config.target.type}, "
                                f"{len(config.tables)} rule(s)")
    try:
        routing = build_plan(node, config)
        select = build_select(node, config, routing)
    except SetlError as exc:
        yield found("error", "source", str(exc), exc.exit_code)
        return
    try:
        report = judge_source(config, select, saved)
    except SetlError as exc:
        yield found("error", "source", str(exc), exc.exit_code)
        return
    if report is not None:  # one line per setting that is not fine, with its fix, then the summary
        for verdict in (*report.refused, *report.warnings):
            yield found("error" if verdict in report.refused else "warning", "source", verdict.line())
        if report.refused:  # the rules and the target do not depend on them: checked on
            yield found("error", "source", report.summary())
    check: Any = getattr(select, "check", None)
    if check is not None and not (report is not None and report.refused):  # it would refuse them again
        try:
            yield found("ok", "source", str(check()) + (f"; {report.summary()}" if report is not None else ""))
        except SetlError as exc:
            yield found("error", "source", str(exc), exc.exit_code)
            return
    try:
        tables = select.describe()
    except SetlError as exc:
        yield found("error", "source", f"cannot describe the source's tables: {exc}", exc.exit_code)
        return
    if tables is None:
        yield found("warning", "rules", f"source type {config.source.type} cannot list its tables before a start: "
                                        "rules, filters and steps are checked at the first batches")
        return
    try:
        warnings = check_rules(config, tables)
    except SetlError as exc:
        yield found("error", "rules", str(exc), exc.exit_code)
        return
    for line in warnings:
        yield found("warning", "rules", line)
    yield found("ok", "rules", f"{len(tables)} source table(s) selected")
    answered = yield from _target(node, config, routing, select, tables, found)
    try:
        stages = build_stages(node, config, None)
    except SetlError as exc:
        yield found("error", "transforms", str(exc), exc.exit_code)
        return
    if meta is not None and answered:
        yield from _resume(node, config, stages, tables, meta, found)
    try:
        analysed = analyse_steps(config, stages, tables)
    except SetlError as exc:
        yield found("error", "transforms", str(exc), exc.exit_code)
        return
    if analysed:
        yield found("ok", "transforms", f"steps analysed for {analysed} table(s)")


def _target(node: NodeSettings, config: PipelineConfig, routing: Any, select: Any, tables: Any,
            found: Callable[..., Finding]) -> Generator[Finding, None, bool]:
    """The target's findings; returns whether it answered (a target that did not is not asked again,
    which would wait out its connect timeout a second time)."""
    try:
        target = build_schema(config, node)
    except SetlError as exc:
        yield found("error", "target", str(exc), exc.exit_code)
        return False
    if target is None:
        if creates_tables(config, node):
            yield found("ok", "target", f"target type {config.target.type} makes its tables from the rows")
        else:
            yield found("warning", "target", NO_TABLES.format(type=config.target.type))
        return True
    try:
        target.open()  # reached, and answering, whether or not a table is planned
        creator = table_creator(config, routing, select, build_transform(node, config, routing), target)
        creator.planner.seed(tables)
        creator.check()  # an existing table that does not fit: ConfigError
        missing = creator.missing()  # the DDL of the others: a type without a mapping is a ConfigError
        yield found("ok", "target", f"{len(creator.planner.tables())} table(s) planned, {len(missing)} to create "
                                    "(types mapped), the others fit")
        for planned in creator.planner.tables():
            mapped = target.mapped_names(planned)
            if mapped:
                yield found("ok", "target", f"table {planned.table}: names over 63 bytes mapped "
                                            f"(docs/sql-targets.md): {', '.join(mapped)}")
    except SetlError as exc:
        yield found("error", "target", str(exc), exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - a driver's error: the target cannot be reached, or refused a read
        yield found("error", "target", f"cannot reach or read the {config.target.type} target: {_driver_error(exc)}")
        return False
    finally:
        target.close()
    return True


def _driver_error(exc: BaseException) -> str:
    """A database driver's error as one phrase: PyMySQL's ``(code, text)`` as ``text (MySQL error code)``."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    if len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):
        return f"{args[1]} (MySQL error {args[0]})"
    return str(exc).strip() or type(exc).__name__


def _resume(node: NodeSettings, config: PipelineConfig, stages: Any, tables: Any, meta: MetaStore,
            found: Callable[..., Finding]) -> Iterator[Finding]:
    """Whether the target still holds what the meta store says it got, read on a connection of the
    schema target's own (nothing written). A refusal is `setl start`'s exit 2."""
    for level, text in identity.preview_output(config, stages, meta):  # a target of files
        yield found(level, "target", text, 2 if level == "error" else 1)
    creator = find_creator(stages.load)
    try:
        target = build_schema(config, node)
    except SetlError as exc:
        yield found("error", "target", str(exc), exc.exit_code)
        return
    if target is None:
        return
    try:
        if creator is not None:
            creator.creator.planner.seed(tables)
        for level, text in identity.preview(config, stages, meta, target.conn):
            yield found(level, "target", text, 2 if level == "error" else 1)
    except SetlError as exc:
        yield found("error", "target", str(exc), exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - a driver's error: the target cannot be reached, or refused a read
        yield found("error", "target", f"cannot reach or read the {config.target.type} target: {_driver_error(exc)}")
    finally:
        target.close()
        if creator is not None:
            creator.creator.close()


__all__ = ["Finding", "check_pipeline"]
