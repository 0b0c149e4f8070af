"""The last hour of each pipeline's figures, one sample a second, in fixed-size rings (float32
arrays: 100 pipelines keep an hour in about 4 MB)."""

from __future__ import annotations

import math
import threading
from array import array
from typing import Any

from setl.observe.lag import Figures

#: The series kept per pipeline, and the `Figures` field each one samples.
SERIES = {"lag": "lag_seconds", "rate": "rows_per_second", "behind": "bytes_behind"}


class History:
    """Samples of every pipeline's `Figures` at shared times; the oldest drop off after `size` samples."""

    def __init__(self, size: int = 3600) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._times = array("d", [math.nan]) * size
        self._series: dict[str, dict[str, array]] = {}
        self._next = 0  # the slot the next sample goes to
        self._count = 0

    def record(self, when: float, figures: dict[str, Figures | None]) -> None:
        with self._lock:
            slot = self._next
            self._times[slot] = when
            for name in figures.keys() - self._series.keys():
                self._series[name] = {key: array("f", [math.nan]) * self.size for key in SERIES}
            for name, series in self._series.items():
                found = figures.get(name)
                for key, field in SERIES.items():
                    value = getattr(found, field) if found is not None else None
                    series[key][slot] = math.nan if value is None else float(value)
            self._next = (slot + 1) % self.size
            self._count = min(self.size, self._count + 1)

    def since(self, after: float | None = None, step: int = 1, pipelines: set[str] | None = None) -> dict[str, Any]:
        """Samples taken after `after` (all kept, if None), every `step`-th, oldest first; None for gaps."""
        step = max(1, step)
        with self._lock:
            order = [(self._next - self._count + i) % self.size for i in range(self._count)]
            if after is not None:
                order = [i for i in order if self._times[i] > after]
            order = order[::-1][::step][::-1]  # keep the newest sample whatever the step
            times = [round(self._times[i], 3) for i in order]
            out: dict[str, dict[str, list[float | None]]] = {}
            for name, series in self._series.items():
                if pipelines is not None and name not in pipelines:
                    continue
                out[name] = {key: [_value(values[i]) for i in order] for key, values in series.items()}
        return {"times": times, "pipelines": out}


def _value(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)
