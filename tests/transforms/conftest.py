"""Fixtures for transform tests: one local Spark session for the whole test run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from setl.plugins import Registry
from setl.testing.spark import local_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared local[2] SparkSession (built once through setl.spark)."""
    yield local_spark()


@pytest.fixture(scope="session")
def registry() -> Registry:
    """A registry of every installed transform, built-ins included."""
    return Registry().discover()
