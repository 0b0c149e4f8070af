"""Every retry policy of setl, in one place: backoff delays and the errors worth retrying.

`classify` sorts a failure into one of three kinds (`Failure`):

* TRANSIENT: the source, target or meta store is away for now (connection refused or lost,
  server shutting down or restarting, too many connections, lock wait timeout, deadlock).
  Retried with capped backoff until the failure has lasted `retry.max_elapsed_ms`, at startup
  (`retry_transient`) as after a rollback (`Backoff.decide`).
* PERMANENT: retrying cannot fix it (bad credentials, unknown database or table, refused DDL,
  bad SQL, a transform Spark cannot analyse, bad config or plugin, a server certificate that is
  not trusted or a TLS setup that does not match, `setl.tls.tls_failure`): the pipeline pauses
  at once.
* OTHER: anything else gets `retry.max_attempts` attempts.

Built on tenacity; callers pass `sleep=` (a no-op in tests) instead of sleeping
themselves, and never let a `tenacity.RetryError` reach a user.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar, cast

import attrs
import tenacity

from setl.errors import ConfigError, PluginError, PositionPurged, SetlError, TransientLoadError
from setl.tls import tls_failure

if TYPE_CHECKING:  # setl.config only as a type: a reader process imports this module, not the config's
    from setl.config import RetrySettings
    from setl.meta.base import MetaStore

T = TypeVar("T")

log = logging.getLogger("setl.retry")

#: Errors a stage may retry in place, without rolling the batch back.
RETRYABLE = (TransientLoadError, ConnectionError, TimeoutError)

#: MySQL/MariaDB error codes of a server that is away for now, or of a lock conflict.
TRANSIENT_MYSQL_CODES = frozenset({
    1040,  # too many connections
    1053,  # server shutdown in progress
    1152,  # aborted connection
    1205,  # lock wait timeout exceeded
    1213,  # deadlock
    1927,  # connection killed
    2002, 2003,  # cannot connect (socket, TCP)
    2006, 2013,  # server gone away, lost connection during query
    2055,  # lost connection (system error)
})
#: MySQL/MariaDB error codes retrying cannot fix.
PERMANENT_MYSQL_CODES = frozenset({
    1044, 1045, 1698,  # access denied
    1049,  # unknown database
    1146,  # no such table
    1054,  # unknown column
    1064,  # SQL syntax
    1142, 1143, 1227,  # command or column denied, needs a privilege
})
#: PostgreSQL SQLSTATEs (prefixes) of a server away for now, or of a lock conflict.
TRANSIENT_SQLSTATES = ("08", "40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300")
#: PostgreSQL SQLSTATEs (prefixes) retrying cannot fix: authorization, syntax or undefined object.
PERMANENT_SQLSTATES = ("28", "3D", "42")
#: What PostgreSQL's server says, at connect time, of a failure retrying cannot fix: psycopg
#: reports these as OperationalError without a SQLSTATE, like a refused connection.
PERMANENT_CONNECT_MESSAGES = re.compile(
    r"password authentication failed|role \S+ does not exist|database \S+ does not exist"
    r"|no pg_hba\.conf entry|permission denied for database|must be superuser")
#: Names of driver and ZooKeeper exceptions that mean "the connection is gone" (matched by name,
#: so this module imports no driver): kazoo's, and a driver's use of a closed connection.
TRANSIENT_NAMES = frozenset({"ConnectionLoss", "ConnectionClosedError", "SessionExpiredError",
                             "KazooTimeoutError", "InterfaceError"})
#: Errors that come out the same on every attempt: bad config or plugin, a purged binlog position.
DETERMINISTIC = (ConfigError, PluginError, PositionPurged)
#: Names of Spark's exceptions for a transform that cannot run (a bad expression, column or type).
PERMANENT_NAMES = frozenset({"AnalysisException", "ParseException", "IllegalArgumentException"})


class Failure(enum.Enum):
    """How `classify` files an error (see the module docstring): TRANSIENT (a server away for now:
    retried with backoff until it has lasted ``retry.max_elapsed_ms``), PERMANENT (retrying
    cannot help: the pipeline pauses at once) or OTHER (``retry.max_attempts`` attempts)."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    OTHER = "other"


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error` and its causes, outermost first (as a traceback shows them: ``raise ... from None``
    ends the chain)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def _mysql_code(exc: BaseException) -> int | None:
    if type(exc).__module__.startswith("pymysql") and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def classify(error: BaseException) -> Failure:
    """Whether retrying `error` can help: see the module docstring. Looks through its causes."""
    chain = list(_chain(error))
    if tls_failure(error) is not None:
        return Failure.PERMANENT
    for exc in chain:
        if isinstance(exc, SetlError) and not exc.retryable:
            return Failure.PERMANENT
        state = getattr(exc, "sqlstate", None) or ""
        if (_mysql_code(exc) in PERMANENT_MYSQL_CODES or (state and state.startswith(PERMANENT_SQLSTATES))
                or type(exc).__name__ in PERMANENT_NAMES
                or (type(exc).__name__ == "OperationalError" and PERMANENT_CONNECT_MESSAGES.search(str(exc)))):
            return Failure.PERMANENT
    for exc in chain:
        state = getattr(exc, "sqlstate", None) or ""
        if (isinstance(exc, RETRYABLE) or _mysql_code(exc) in TRANSIENT_MYSQL_CODES
                or (state and state.startswith(TRANSIENT_SQLSTATES))
                or type(exc).__name__ in TRANSIENT_NAMES
                or (type(exc).__name__ == "OperationalError" and not state and _mysql_code(exc) is None)):
            return Failure.TRANSIENT
    if isinstance(error, DETERMINISTIC):
        return Failure.PERMANENT
    return Failure.OTHER


@attrs.frozen
class Verdict:
    """What to do after a failed attempt: pause (with `message`), or retry.

    `since` is when the current run of failures began (seconds since the epoch): what
    `setl status` shows as ``retrying since T: ERROR``.
    """

    pause: bool
    failure: Failure
    message: str
    since: float


@attrs.define
class Backoff:
    """Exponential backoff between attempts of a rolled-back batch: 1st retry waits `initial`.

    `decide` also tracks the current run of failures (attempt 1 starts one) to spend
    `max_elapsed` seconds on transient ones.
    """

    initial: float
    maximum: float
    max_attempts: int
    max_elapsed: float = 600.0
    clock: Callable[[], float] = time.time
    _since: float | None = attrs.field(default=None, init=False)

    @classmethod
    def from_settings(cls, settings: RetrySettings) -> "Backoff":
        return cls(
            initial=settings.initial_backoff_ms / 1000.0,
            maximum=settings.max_backoff_ms / 1000.0,
            max_attempts=settings.max_attempts,
            max_elapsed=settings.max_elapsed_ms / 1000.0,
        )

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt number `attempt` + 1 (attempt >= 1)."""
        wait = tenacity.wait_exponential(multiplier=self.initial, min=self.initial, max=self.maximum)
        # tenacity's wait strategies only read attempt_number from the retry state.
        state = cast(tenacity.RetryCallState, types.SimpleNamespace(attempt_number=min(attempt, 64)))
        return float(wait(state))

    def decide(self, error: BaseException, attempt: int) -> Verdict:
        """After failed attempt number `attempt` (1 starts a new run of failures): pause or retry.

        Transient failures are retried until the run has lasted `max_elapsed` seconds, others
        for `max_attempts` attempts; permanent ones pause at once.
        """
        now = self.clock()
        if attempt <= 1 or self._since is None:
            self._since = now
        since = self._since
        failure = classify(error)
        if failure is Failure.PERMANENT:
            return Verdict(True, failure, f"paused, retrying cannot help: {error}", since)
        if failure is Failure.TRANSIENT:
            elapsed = now - since
            if elapsed >= self.max_elapsed:
                return Verdict(True, failure, f"paused after retrying for {elapsed:.0f}s "
                                              f"({attempt} attempts, retry.max_elapsed_ms): {error}", since)
            return Verdict(False, failure, f"retrying for {elapsed:.0f}s of {self.max_elapsed:.0f}s "
                                           f"(attempt {attempt})", since)
        if attempt >= self.max_attempts:
            return Verdict(True, failure, f"paused after {attempt} failed attempts: {error}", since)
        return Verdict(False, failure, f"attempt {attempt} of {self.max_attempts}", since)


def record_retrying(meta: MetaStore, pipeline: str, error: BaseException, since: float, node: str | None) -> None:
    """Show in the meta store that `pipeline` is retrying `error` since `since`; never raises
    (the meta store may be what is away)."""
    from setl.meta.base import Status

    try:
        if meta.state(pipeline).status is Status.PAUSED:
            return  # an operator's pause, written meanwhile, stands
        meta.set_state(pipeline, Status.RUNNING, error=str(error), node=node, retrying_since=since)
    except Exception as exc:  # noqa: BLE001 - recording the retry is best effort; the retry itself goes on
        log.warning("pipeline=%s cannot record that it is retrying: %s", pipeline, exc)


def retry_transient(
    fn: Callable[[], T],
    backoff: Backoff,
    *,
    stop: threading.Event | None = None,
    on_retry: Callable[[BaseException, Verdict, float], None] | None = None,
) -> T:
    """Run `fn` (a start step: connect, open), retrying transient failures as `backoff.decide` says.

    Re-raises the failure when the verdict is to pause, and the last one when `stop` is set.
    `on_retry(error, verdict, delay)` runs before each wait.
    """
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            attempt += 1
            verdict = backoff.decide(exc, attempt)
            if verdict.pause or verdict.failure is not Failure.TRANSIENT:
                raise
            delay = backoff.delay(attempt)
            if on_retry is not None:
                on_retry(exc, verdict, delay)
            if stop is not None:
                if stop.wait(delay):
                    raise
            else:
                time.sleep(delay)


def call_with_retries(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    initial: float = 0.1,
    maximum: float = 5.0,
    retry_on: tuple[type[BaseException], ...] = RETRYABLE,
    sleep: Callable[[float], None] = time.sleep,
    before_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Run `fn`, retrying `retry_on` errors with exponential backoff; re-raise the last error."""

    def hook(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if before_retry is not None and error is not None:
            before_retry(error)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential(multiplier=initial, min=initial, max=maximum),
        retry=tenacity.retry_if_exception_type(retry_on),
        sleep=sleep,
        before_sleep=hook,
        reraise=True,
    )
    try:
        return retrying(fn)
    except tenacity.RetryError as exc:  # pragma: no cover - reraise=True makes this unreachable
        raise SetlError(f"gave up after {attempts} attempts") from exc
