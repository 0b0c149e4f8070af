"""Fixtures of the source tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from setl.model import Position
from setl.sources.mysql_binlog import MysqlBinlogSource
from tests.sources.binlog import make_source


@pytest.fixture
def sources() -> Iterator[Callable[..., MysqlBinlogSource]]:
    """Makes sources (opened at `at` unless ``open_it=False``) and closes them all afterwards."""
    made: list[MysqlBinlogSource] = []

    def make(server: Any, at: Position | None = None, start: Any = "latest", *, open_it: bool = True,
             **kwargs: Any) -> MysqlBinlogSource:
        src = make_source(server, start, **kwargs)
        made.append(src)
        if open_it:
            src.open(at)
        return src

    yield make
    for src in made:
        src.close()
