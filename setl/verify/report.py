"""What `setl verify` found, per table and for the run, as text lines or as data (`--json`)."""

from __future__ import annotations

import json
from typing import Any

import attrs


@attrs.define
class TableReport:
    """One table's result. Keys are ``{source column: canonical text}``; a keyless table's
    `missing`/`extra` hold whole rows with the number of copies missing or extra (`count`)."""

    source: str
    target: str
    mode: str
    why: str = ""
    rows: int = 0  # source rows compared
    chunks: int = 0
    seconds: float = 0.0
    missing: list[dict[str, Any]] = attrs.Factory(list)
    extra: list[dict[str, Any]] = attrs.Factory(list)
    different: list[dict[str, Any]] = attrs.Factory(list)
    #: keys that changed during every re-check: neither proven equal nor different
    unsettled: list[dict[str, Any]] = attrs.Factory(list)
    unchecked: dict[str, str] = attrs.Factory(dict)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different or self.unsettled)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "equal": self.equal, "mode": self.mode,
                "why": self.why, "rows": self.rows, "chunks": self.chunks, "seconds": round(self.seconds, 3),
                "missing": self.missing, "extra": self.extra, "different": self.different,
                "unsettled": self.unsettled, "unchecked_columns": self.unchecked}

    def lines(self, limit: int = 20) -> list[str]:
        state = "equal" if self.equal else "DIFFERENT"
        head = (f"{self.source} -> {self.target}: {state}, {self.rows:,} rows in {self.chunks} chunk(s), "
                f"{self.seconds:.1f}s ({self.mode}" + (f": {self.why}" if self.why else "") + ")")
        out = [head]
        for label, items in (("missing", self.missing), ("extra", self.extra), ("different", self.different),
                             ("unsettled", self.unsettled)):
            for item in items[:limit]:
                key = ", ".join(f"{k}={v!r}" for k, v in (item.get("key") or item.get("row") or {}).items())
                extra = f" columns: {', '.join(item['columns'])}" if item.get("columns") else ""
                count = f" x{item['count']}" if item.get("count", 1) != 1 else ""
                out.append(f"  {label}: {key}{count}{extra}")
            if len(items) > limit:
                out.append(f"  ... and {len(items) - limit} more {label}")
        for column, why in self.unchecked.items():
            out.append(f"  column {column} not compared: {why}")
        return out


@attrs.define
class Report:
    """The run's tables compared, those `skipped` (source table -> why: a copy not done, whose
    target table is stale until it is, is not drift), and those `stopped` at a DDL their
    ``schema_changes`` policy refuses (source table -> the refusal): not compared, and never equal."""

    pipeline: str
    tables: list[TableReport] = attrs.Factory(list)
    seconds: float = 0.0
    skipped: dict[str, str] = attrs.Factory(dict)
    stopped: dict[str, str] = attrs.Factory(dict)

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.tables) and not self.stopped

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "equal": self.equal, "seconds": round(self.seconds, 3),
                "rows": sum(t.rows for t in self.tables), "tables": [t.to_dict() for t in self.tables],
                "skipped": [{"source": name, "why": why} for name, why in self.skipped.items()],
                "stopped": [{"source": name, "why": why} for name, why in self.stopped.items()]}

    def text(self, as_json: bool = False) -> str:
        """The report as `setl verify` prints it: indented JSON, or its lines."""
        return json.dumps(self.to_dict(), indent=2) if as_json else "\n".join(self.lines())

    def lines(self) -> list[str]:
        out = [line for table in self.tables for line in table.lines()]
        out += [f"{name}: skipped, {why}" for name, why in self.skipped.items()]
        out += [f"{name}: STOPPED, {why}" for name, why in self.stopped.items()]
        bad = sum(not t.equal for t in self.tables) + len(self.stopped)
        out.append(f"{self.pipeline}: {len(self.tables)} table(s), {sum(t.rows for t in self.tables):,} rows, "
                   + ("equal" if not bad else f"{bad} table(s) differ")
                   + (f", {len(self.skipped)} skipped" if self.skipped else "") + f" in {self.seconds:.1f}s")
        return out
