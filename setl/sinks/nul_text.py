"""What a PostgreSQL target does with text holding NUL (``target.nul_in_text``).

MySQL and MariaDB text may hold the character U+0000; PostgreSQL's text types cannot. The target
config chooses:

* ``refuse`` (the default): the batch fails with a permanent error (the pipeline pauses at once,
  no retries), one line naming the table and position, and what to set instead;
* ``strip``: every NUL is removed from the text;
* ``escape``: every NUL is written as the two characters ``\\0`` (backslash, zero).

A primary-key column holding NUL is refused under every policy: stripping or escaping it could
make two source keys one. A before-image (used to match rows of tables without a key) is rewritten
the same way, so the row written is found again. Rewritten values are counted per table in the
log (a WARNING per table and batch) and in the ``setl_values_rewritten`` metric
(`setl.sinks.rewrites`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from setl.errors import RefusedLoadError
from setl.model import Batch, RowChange, partial_like
from setl.sinks import rewrites

log = logging.getLogger(__name__)

POLICIES = ("refuse", "strip", "escape")
NUL = "\x00"
#: What ``escape`` writes for each NUL.
ESCAPED = "\\0"
#: The hint a refused batch's error line ends with.
HINT = "text holding NUL (0x00), which PostgreSQL cannot store (target.nul_in_text is refuse; set it to strip or " \
       "escape to write it without)"


def _holds_nul(image: Mapping[str, Any] | None) -> bool:
    return image is not None and any(type(value) is str and NUL in value for value in image.values())


class NulTextPolicy:
    """Applies a ``strip`` or ``escape`` policy to the row images of a batch (module docstring);
    ``refuse`` leaves batches as they are and lets the target's own refusal stand."""

    def __init__(self, policy: str, *, pipeline: str, target: str) -> None:
        if policy not in POLICIES:
            raise ValueError(f"nul_in_text must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.policy = policy
        self.pipeline = pipeline
        self.target = target
        self._counts: dict[str, int] = {}

    def apply(self, batch: Batch) -> Batch:
        """`batch` with NUL stripped or escaped from its text values; the batch itself when the
        policy is refuse or no text holds NUL."""
        if self.policy == "refuse" or not any(
                isinstance(c, RowChange) and (_holds_nul(c.before) or _holds_nul(c.after)) for c in batch.changes):
            return batch
        found: dict[str, int] = {}
        changes: list[Any] = []
        for change in batch.changes:
            if isinstance(change, RowChange) and (_holds_nul(change.before) or _holds_nul(change.after)):
                change = attrs.evolve(change, before=self._clean(batch, change, change.before, found),
                                      after=self._clean(batch, change, change.after, found))
            changes.append(change)
        kind = "nul_stripped" if self.policy == "strip" else "nul_escaped"
        for table, count in found.items():
            self._counts[table] = self._counts.get(table, 0) + count
            rewrites.count(self.pipeline or batch.pipeline, table, kind, count)
            log.warning("pipeline=%s stage=load table=%s batch=%s position=%s: %d text value(s) holding NUL "
                        "written %s to the %s target (nul_in_text: %s; %d since start)", self.pipeline, table,
                        batch.id, batch.end, count, "without it" if self.policy == "strip" else "with it escaped",
                        self.target, self.policy, self._counts[table])
        return batch.replace(tuple(changes))

    def _clean(self, batch: Batch, change: RowChange, image: Mapping[str, Any] | None,
               found: dict[str, int]) -> Mapping[str, Any] | None:
        if not _holds_nul(image):
            return image
        assert image is not None
        replacement = "" if self.policy == "strip" else ESCAPED
        out = partial_like(image, dict(image))
        for column, value in image.items():
            if type(value) is str and NUL in value:
                if column in change.primary_key:
                    raise RefusedLoadError(
                        f"primary-key column {column} holds text with NUL (0x00), which the {self.target} "
                        f"target cannot store and nul_in_text: {self.policy} cannot rewrite without merging keys",
                        pipeline=self.pipeline or batch.pipeline, stage="load", table=change.qualified_table,
                        batch=batch.id, position=change.position or batch.end)
                out[column] = value.replace(NUL, replacement)
                found[change.qualified_table] = found.get(change.qualified_table, 0) + 1
        return out


__all__ = ["ESCAPED", "HINT", "POLICIES", "NulTextPolicy"]
