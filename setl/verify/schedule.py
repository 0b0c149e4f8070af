"""Scheduled checks: the node that holds a pipeline runs `setl verify` on it every `verify.every`
(its pipeline file's `verify:` section), on one thread of its own, and hands each result on (the
meta store keeps the last one for `setl status`, the node turns it into metrics and the
``verify_failed`` alert). docs/verify.md#scheduled-checks.

When a check is due: `every` after the last one the meta store holds (whichever node ran it), or
`FIRST_DELAY` after the node took the pipeline when none ever ran, so that frequent restarts do not
put off checks for ever, nor run one at every start. No check starts while a table copy (a
snapshot) of the pipeline is under way: the target does not hold that table whole yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from setl.config import NodeSettings, PipelineConfig, parse_duration
from setl.errors import SetlError
from setl.meta.base import MetaStore
from setl.model import TableName
from setl.tablecopy import CopyStatus
from setl.verify.report import Report
from setl.verify.run import verify_pipeline

log = logging.getLogger("setl.verify")

#: seconds after the node took a pipeline that was never checked before its first check
FIRST_DELAY = 60.0


class _Stopped(SetlError):
    """The node stops: a check in progress ends without a result."""


def summary(report: Report, started: float) -> dict[str, Any]:
    """A check's result as the meta store keeps it and `setl status` shows it."""
    tables = []
    differences = 0
    for table in report.tables:
        counts = {kind: len(getattr(table, kind)) for kind in ("missing", "extra", "different", "unsettled")}
        differences += sum(counts.values())
        tables.append({"table": table.source, "rows": table.rows, "equal": table.equal, **counts})
    return {"time": round(started, 3), "seconds": round(report.seconds, 3), "equal": report.equal,
            "rows": sum(t.rows for t in report.tables), "differences": differences, "tables": tables,
            "error": None}


def failure(error: BaseException, started: float, seconds: float) -> dict[str, Any]:
    """A check that reached no verdict."""
    return {"time": round(started, 3), "seconds": round(seconds, 3), "equal": False, "rows": 0,
            "differences": 0, "tables": [], "error": str(error)}


@attrs.define(eq=False)
class ScheduledChecks:
    """Runs the scheduled checks of `pipelines` (those with a `verify` section) while `holds(name)`
    says this node runs the pipeline; `on_result(name, result)` gets each result (`summary` or
    `failure`) once the meta store holds it. `check` (tests inject one) runs one check and returns
    its `Report`. `start` and `stop` own the thread."""

    settings: NodeSettings
    pipelines: Sequence[PipelineConfig]
    meta: MetaStore
    holds: Callable[[str], bool]
    on_result: Callable[[str, dict[str, Any]], None]
    check: Callable[..., Report] = verify_pipeline
    tick: float = 1.0
    first_delay: float = FIRST_DELAY
    clock: Callable[[], float] = time.time
    _stop: threading.Event = attrs.field(factory=threading.Event)
    _thread: threading.Thread | None = None
    _held_since: dict[str, float] = attrs.field(factory=dict)

    def start(self) -> None:
        if not any(c.verify is not None for c in self.pipelines) or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="setl-verify-schedule", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the scheduled check did not stop within %.0fs (it waits for a read); left to end",
                            timeout)
            self._thread = None

    def due(self, config: PipelineConfig, now: float) -> bool:
        """Whether `config`'s check is due at `now` (the node holds it)."""
        assert config.verify is not None
        if any(p.status is not CopyStatus.DONE for p in self.meta.snapshot_progress(config.name)):
            return False  # a table being copied is not complete on the target yet: no false alarm
        last = self.meta.verify_result(config.name)
        if last is not None and last.get("time") is not None:
            return now >= float(last["time"]) + config.verify.seconds
        held = self._held_since.setdefault(config.name, now)
        return now >= held + min(self.first_delay, config.verify.seconds)

    def run_once(self, config: PipelineConfig) -> dict[str, Any]:
        """Check `config`'s pipeline now, store and hand on the result."""
        assert config.verify is not None
        schedule = config.verify
        tables = [TableName.parse(text) for text in schedule.tables]
        started, began = self.clock(), time.monotonic()

        def stopping(table: str, rows: int, estimate: int, done: bool) -> None:
            if self._stop.is_set():
                raise _Stopped("the node stops")

        def sleep(seconds: float) -> None:  # a wait for the acked position, or the throttle
            if self._stop.wait(seconds):
                raise _Stopped("the node stops")

        pausing: list[str] = []

        def paused(table: str, lag: float | None) -> None:
            if lag is not None and not pausing:
                log.info("pipeline=%s stage=verify table=%s scheduled check paused: lag %.0fs > %gs", config.name,
                         table, lag, schedule.max_lag)
            elif lag is None and pausing:
                log.info("pipeline=%s stage=verify table=%s scheduled check resumed", config.name, table)
            pausing[:] = [table] if lag is not None else []

        log.info("pipeline=%s stage=verify scheduled check of %s starting", config.name,
                 ", ".join(schedule.tables) or "every table")
        try:
            report = self.check(self.settings, config, self.meta, tables, attempts=schedule.attempts,
                                max_rows_per_second=schedule.max_rows_per_second, chunk_rows=schedule.chunk_rows,
                                wait_timeout=parse_duration(schedule.wait_timeout), progress=stopping, sleep=sleep,
                                max_lag=schedule.max_lag, lag_timeout=parse_duration(schedule.lag_timeout),
                                paused=paused, engine=schedule.engine)
            result = summary(report, started)
        except _Stopped:
            raise
        except SetlError as exc:
            if self._stop.is_set():
                raise _Stopped("the node stops") from exc
            result = failure(exc, started, time.monotonic() - began)
        self.meta.save_verify_result(config.name, result)
        if result["error"]:
            log.error("pipeline=%s stage=verify scheduled check reached no verdict: %s", config.name, result["error"])
        elif result["equal"]:
            log.info("pipeline=%s stage=verify scheduled check: %d table(s), %d rows, equal in %.1fs", config.name,
                     len(result["tables"]), result["rows"], result["seconds"])
        else:
            log.warning("pipeline=%s stage=verify scheduled check: %d difference(s) in %s (setl verify --pipeline %s "
                        "lists them, setl repair fixes them)", config.name, result["differences"],
                        ", ".join(t["table"] for t in result["tables"] if not t["equal"]), config.name)
        self.on_result(config.name, result)
        return result

    def _loop(self) -> None:
        scheduled = [c for c in self.pipelines if c.verify is not None]
        while not self._stop.wait(self.tick):
            for config in scheduled:
                if self._stop.is_set():
                    return
                if not self.holds(config.name):
                    self._held_since.pop(config.name, None)
                    continue
                try:
                    if self.due(config, self.clock()):
                        self.run_once(config)
                except _Stopped:
                    return
                except Exception:  # a check never takes the node down
                    log.exception("pipeline=%s stage=verify scheduled check failed", config.name)
                    self._stop.wait(max(self.tick, 30.0))
