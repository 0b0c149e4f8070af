"""Snapshot progress for people: bars on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from setl.snapshot import CopyStatus, TableProgress
from setl.snapshot.display import ProgressReporter, describe


def tables(rows: int, done: bool = False) -> list[TableProgress]:
    return [TableProgress("shop", "orders", CopyStatus.DONE if done else CopyStatus.COPYING, (rows,), rows, 1000,
                          3, started=100.0, updated=110.0),
            TableProgress("shop", "empty", CopyStatus.DONE, None, 0, 0, 0, started=100.0, updated=100.5)]


def test_describe_shows_rows_of_the_estimate_rate_and_eta():
    """One table's line: rows copied of the estimate, its share, rate and ETA."""
    assert describe(tables(250)[0], now=110.0) == "shop.orders copying 250/1000 rows (25%), 25 rows/s, ETA 30s"
    assert describe(tables(1000, done=True)[0]).startswith("shop.orders done 1000/1000 rows (100%), 100 rows/s")


def test_without_a_terminal_a_log_line_every_few_seconds(caplog):
    """Not on a terminal: a line at most every `every` seconds, and one when all are done."""
    now = [0.0]
    reporter = ProgressReporter("p1", every=5.0, tty=False, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="setl.snapshot"):
        reporter(tables(100), False)
        now[0] = 2.0
        reporter(tables(200), False)
        now[0] = 6.0
        reporter(tables(300), False)
        reporter(tables(1000, done=True), True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "1 of 2 table(s) done, 100 rows copied; shop.orders copying 100/1000" in lines[0]
    assert "300 rows copied" in lines[1] and "2 of 2 table(s) done, 1000 rows copied" in lines[2]


def test_on_a_terminal_a_bar_per_table():
    """On a terminal: a rich bar per table with rows of the estimate, stopped when all are done."""
    out = io.StringIO()
    reporter = ProgressReporter("p1", tty=True, console=Console(file=out, force_terminal=True, width=120))
    reporter(tables(400), False)
    reporter(tables(1000, done=True), True)
    text = out.getvalue()
    assert "p1 shop.orders" in text and "p1 shop.empty" in text
    assert "1000/1000" in text
