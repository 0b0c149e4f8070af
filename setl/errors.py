"""The one exception tree of setl: every error a user can see derives from `SetlError`."""

from __future__ import annotations


class SetlError(Exception):
    """Root of setl's errors.

    `context` names where the error happened (pipeline, stage, table, batch,
    position); `str()` renders it as one line an operator can act on.
    """

    exit_code = 1
    #: False for a failure that retrying cannot change: the scheduler pauses at the first one
    #: instead of spending `retry.max_attempts` on it.
    retryable = True

    def __init__(self, message: str, **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = {k: v for k, v in context.items() if v is not None}

    def with_context(self, **context: object) -> "SetlError":
        """Fill in context keys that are not set yet, and return self."""
        for key, value in context.items():
            if value is not None and key not in self.context:
                self.context[key] = value
        return self

    def __str__(self) -> str:
        parts = [f"{self.context['file']}:"] if "file" in self.context else []
        parts += [f"{key}={value}" for key, value in self.context.items() if key != "file"]
        if not parts:
            return self.message
        head = " ".join(parts)
        return f"{head} {self.message}" if head.endswith(":") else f"{head}: {self.message}"


class ConfigError(SetlError, ValueError):
    """A configuration file or value is wrong; names the file and key path."""

    exit_code = 2


class UsageError(SetlError, ValueError):
    """The command line asked for something that cannot be done."""

    exit_code = 2


class PluginError(SetlError):
    """A plugin cannot be found, loaded or configured."""

    exit_code = 2


class MetaStoreError(SetlError):
    """The meta store could not read or write positions or state."""


class SourceError(SetlError):
    """The source (binlog or test source) failed or refused to start."""


class PositionPurged(SourceError):
    """The position asked for is no longer available at the source."""


class UnreadableEvent(SourceError):
    """A binlog event setl cannot decode or apply exactly (an unknown kind, a corrupt body, rows
    logged as statements): reading it again gives the same, so the pipeline pauses at it instead of
    retrying."""

    retryable = False


class CorruptEvent(UnreadableEvent):
    """A binlog event whose bytes setl cannot decode (corrupt, or beyond what its readers know)."""


class ExtractError(SetlError):
    """A row could not be extracted (filter or mapping failed)."""


class RefusedExtractError(ExtractError):
    """A change no table rule can route exactly (a partial row image that a filter or a transform
    would need whole): pause, don't retry."""

    retryable = False


class TransformError(SetlError):
    """A transform raised or returned an unusable result."""


class LoadError(SetlError):
    """The target refused or failed to apply a batch."""


class TransientLoadError(LoadError):
    """A load failure worth retrying at once (deadlock, lost connection)."""


class RefusedLoadError(LoadError):
    """The target refuses a batch by configuration (`pipeline.ddl: fail`): pause, don't retry."""

    retryable = False


class TableRefused(LoadError):
    """One table's change that its target cannot take and retrying cannot change: a value or a DDL
    the target refuses, a missing privilege, a schema change the table's `schema_changes` policy
    refuses. The context names the table and the position. Under the pipeline's
    `on_table_error: pause` (the default) the pipeline pauses; under `quarantine` only that table
    stops and the others go on (docs/quarantine.md)."""

    retryable = False


class LeadershipLost(SetlError):
    """This node no longer holds the mainstem; it must stop writing."""


class PipelinePaused(SetlError):
    """The pipeline is paused, by an operator or after its retries ran out."""
