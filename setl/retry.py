"""Every retry policy of setl, in one place: backoff delays and the errors worth retrying.

Built on tenacity; callers pass `sleep=` (a no-op in tests) instead of sleeping
themselves, and never let a `tenacity.RetryError` reach a user.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from typing import TypeVar

import attrs
import tenacity

from setl.config import RetrySettings
from setl.errors import SetlError, TransientLoadError

T = TypeVar("T")

#: Errors a stage may retry in place, without rolling the batch back.
RETRYABLE = (TransientLoadError, ConnectionError, TimeoutError)


@attrs.frozen
class Backoff:
    """Exponential backoff between attempts of a rolled-back batch: 1st retry waits `initial`."""

    initial: float
    maximum: float
    max_attempts: int

    @classmethod
    def from_settings(cls, settings: RetrySettings) -> "Backoff":
        return cls(
            initial=settings.initial_backoff_ms / 1000.0,
            maximum=settings.max_backoff_ms / 1000.0,
            max_attempts=settings.max_attempts,
        )

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt number `attempt` + 1 (attempt >= 1)."""
        wait = tenacity.wait_exponential(multiplier=self.initial, min=self.initial, max=self.maximum)
        # tenacity's wait strategies only read attempt_number from the retry state.
        return float(wait(types.SimpleNamespace(attempt_number=attempt)))


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
        if before_retry is not None and state.outcome is not None:
            before_retry(state.outcome.exception())

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
