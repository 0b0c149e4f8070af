"""A node's reloads of table rules (SIGHUP, `setl reload`): prepared at the node's next look,
applied between two schedulers of the pipeline (`Reloads`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from setl.alerts import Alerts
from setl.config import NodeSettings, PipelineConfig
from setl.errors import MetaStoreError, SetlError
from setl.meta.base import MetaStore
from setl.pipeline import Stages
from setl.pipeline.reload import Reload, ReloadRefused, prepare

if TYPE_CHECKING:
    from setl.scheduler import Scheduler

log = logging.getLogger("setl.node")

#: Seconds between two looks for `setl reload` requests in the meta store.
REQUEST_POLL = 1.0


class Reloadable(Protocol):
    """A pipeline the node runs, as a reload sees it (`setl.node_runs.Supervised`)."""

    config: PipelineConfig
    stages: Stages
    done: bool
    reload: Reload | None


class Reloads:
    """Reloads of table rules for a node's pipelines.

    `request` only sets a flag, so a signal handler may call it. At the node's next look
    (`if_asked`, on the supervising thread) each running pipeline's file is read again through
    `reload_config` and its reload prepared (`setl.pipeline.reload.prepare`), then the pipeline's
    scheduler (`scheduler_of`) is stopped gracefully: the node swaps the reloaded stages in before
    the next one starts. A refusal (the file does not load, the change cannot be made online)
    keeps the running configuration and raises the ``reload_refused`` alert. What came of each
    pipeline's last reload is kept in `outcomes` (published with its liveness figures).
    """

    def __init__(self, settings: NodeSettings, meta: MetaStore, alerts: Alerts,
                 reload_config: Callable[[str], PipelineConfig] | None,
                 scheduler_of: Callable[[str], Scheduler | None], outcomes: dict[str, dict[str, Any]]) -> None:
        """`reload_config(name)` re-reads a pipeline's file (None: this node cannot reload);
        `outcomes` is the node's record of each pipeline's last reload, written here."""
        self.settings = settings
        self.meta = meta
        self.alerts = alerts
        self.reload_config = reload_config
        self._scheduler_of = scheduler_of
        self._asked = threading.Event()
        self._next_poll = 0.0
        self._served: dict[str, str] = {}  # per pipeline: the last meta-store request seen
        self.outcomes = outcomes

    def request(self) -> None:
        """Reload every pipeline at the next look (SIGHUP)."""
        self._asked.set()

    def if_asked(self, runs: Iterable[Reloadable]) -> None:
        """When a reload was asked for: prepare it for every pipeline that has not ended (SIGHUP), or
        for each pipeline with a new request in the meta store (`setl reload`, from any host; looked
        for every `REQUEST_POLL` seconds)."""
        runs = [run for run in runs if not run.done]
        if self._asked.is_set():
            self._asked.clear()
            for run in runs:
                self.reload(run)
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + REQUEST_POLL
        for run in runs:
            request = self._new_request(run.config.name)
            if request is not None:
                self.reload(run, request=request)

    def prime(self, runs: Iterable[Reloadable]) -> None:
        """Before the node's pipelines start: the reload requests stored now are served already
        (this start reads each file as it is), so only later ones reload."""
        for run in runs:
            self._new_request(run.config.name)

    def _new_request(self, name: str) -> str | None:
        """The pipeline's reload request in the meta store if this node has not served it yet."""
        try:
            request = self.meta.reload_request(name)
        except MetaStoreError as exc:  # the next look asks again; the CLI waits for an answer meanwhile
            log.warning("pipeline=%s stage=reload cannot read reload requests: %s", name, exc)
            return None
        if request is None or self._served.get(name) == request:
            return None
        self._served[name] = request
        return request

    def reload(self, run: Reloadable, *, request: str | None = None) -> None:
        """Prepare `run`'s reload and stop its scheduler gracefully: the next one starts on the new
        stages. A refusal keeps the old configuration running. The outcome names the meta-store
        `request` it answers, if any (`setl reload` waits for that)."""
        name = run.config.name
        outcome: dict[str, Any] = {"at": time.time(), **({"request": request} if request else {})}
        try:
            if self.reload_config is None:
                raise ReloadRefused("this node was not started from a configuration directory", pipeline=name,
                                    stage="reload")
            try:
                new = self.reload_config(name)
            except SetlError as exc:
                raise ReloadRefused(f"the file does not load: {exc}", pipeline=name, stage="reload") from exc
            reload = prepare(self.settings, run.reload.config if run.reload else run.config, new, self.meta,
                             run.stages)
        except Exception as exc:  # noqa: BLE001 - any failure to prepare refuses the reload as a whole, and is logged
            message = str(exc) if isinstance(exc, SetlError) else f"{type(exc).__name__}: {exc}"
            log.error("pipeline=%s stage=reload reload refused, the running configuration is kept: %s", name, message)
            self.alerts.emit(name, "reload_refused", error=message)
            self.outcomes[name] = {**outcome, "result": "refused", "message": message}
            return
        if reload is None:
            log.info("pipeline=%s stage=reload the table rules are unchanged: nothing to reload", name)
            self.outcomes[name] = {**outcome, "result": "unchanged", "message": "the table rules are unchanged"}
            return
        if run.reload is not None:  # an earlier reload not swapped in yet: this one replaces it
            run.reload.stages.load.close()
        run.reload = reload
        log.info("pipeline=%s stage=reload new table rules: %s; draining in-flight batches to apply them",
                 name, reload.describe())
        scheduler = self._scheduler_of(name)
        if scheduler is not None:
            scheduler.stop()
            self.outcomes[name] = {**outcome, "result": "pending", "message": reload.describe()}
        else:  # paused, or waiting to retry its start: the next start runs the new stages
            self.outcomes[name] = {**outcome, "result": "deferred",
                                   "message": f"{reload.describe()}; applied when the pipeline runs again"}
