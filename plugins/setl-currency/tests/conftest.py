"""Run against the source tree when the package is not installed, on setl's local test Spark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))


@pytest.fixture(scope="session")
def spark():
    """setl's shared local Spark session."""
    from setl.testing.spark import local_spark

    return local_spark()
