"""Rows events of tables a reader does not hand on are counted by length, never decoded
(`setl.sources.mysql_binlog.skipping`), and every position, split transactions' included, stays
what the reader that decodes everything hands on."""

from __future__ import annotations

import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from setl import _compiled
from setl.model import Position, RowChange, Transaction
from setl.sources.mysql_binlog import skipping
from tests.sources.binlog import bare, execute, head
from tests.sources.test_fast_decoder import COLUMNS, ROWS, WIDE
from tests.sources.test_mysql_binlog_stream import drain

pytestmark = pytest.mark.timeout(120)

PURE = _compiled.pure_python()
ODD = ("CREATE TABLE odd (id INT PRIMARY KEY, s SET('x','y','z'), b BIT(10), j JSON, g POINT, e ENUM('p','q'), "
       "dc DECIMAL(12,4), ts TIMESTAMP(3) NULL, tm TIME(5), v VARCHAR(400), c CHAR(3))")
KEEP = ("keep",)


def positions(transactions: list[Transaction], tables: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Each row change of `tables` as (table, op, id, its position), and every end (piece ends included)."""
    out: list[tuple[Any, ...]] = []
    for tx in transactions:
        out += [(c.table, c.op, (c.after or c.before or {}).get("id"), c.position) for c in tx.changes
                if isinstance(c, RowChange) and c.table in tables]
        out.append(("end", tx.end, tx.complete))
    return out


def mixed_transaction(server: Any, db: str) -> tuple[Position, Position]:
    """One transaction writing the kept table between rows of unread tables of every sized type
    (a 4 MiB blob, partial images, a system-versioned table), then a small one; its range."""
    marks = ", ".join(["%s"] * len(COLUMNS))
    execute(server, db, "SET SESSION sql_mode = ''", WIDE, ODD, "CREATE TABLE keep (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE hist (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
            "INSERT INTO hist VALUES (1, 0), (2, 0)")
    start = head(server)
    statements: list[Any] = ["SET SESSION sql_mode = ''", "BEGIN"]
    for n, row in enumerate(ROWS):
        statements += [(f"INSERT INTO wide VALUES ({marks})", row), f"INSERT INTO keep VALUES ({n}, {n})"]
    statements += [
        "INSERT INTO odd VALUES (1, 'x,z', b'1010101010', '{\"a\": 1}', POINT(1, 2), 'q', -12.5, "
        "'2020-01-01 00:00:00.123', '-01:00:00.5', REPEAT('v', 400), 'abc')",
        "INSERT INTO odd (id) VALUES (2), (3), (4)", "INSERT INTO keep VALUES (10, 10), (11, 11)",
        "UPDATE wide SET vc = CONCAT(vc, '!'), dc = -dc WHERE id IN (1, 2, 5)", "UPDATE keep SET v = v + 1",
        "UPDATE hist SET v = v + 1", "INSERT INTO keep VALUES (12, 12)",
        "SET SESSION binlog_row_image = 'MINIMAL'", "UPDATE odd SET e = 'p' WHERE id < 4",
        "SET SESSION binlog_row_image = 'FULL'", "INSERT INTO keep VALUES (13, 13)",
        "DELETE FROM wide WHERE id IN (2, 4)", "INSERT INTO wide (id, lb) VALUES (6, REPEAT('z', 4 * 1024 * 1024))",
        "DELETE FROM odd", "DELETE FROM keep WHERE id < 3", "COMMIT", "INSERT INTO keep VALUES (20, 20)"]
    execute(server, db, *statements)
    return start, head(server)


@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "library"])
def test_unread_tables_are_counted_and_split_positions_stay_exact(mariadb_source, source_db, sources,
                                                                    fast_decoder):
    """A reader of one table passes over the others' rows events by length and hands on the same
    changes, piece ends and row ordinals as a reader that decodes every table, and resumes at each
    piece end with exactly the rest."""
    start, end = mixed_transaction(mariadb_source, source_db)

    def until(got: list[Transaction]) -> bool:
        return bool(got) and bare(got[-1].end) == end

    everything = sources(mariadb_source, start, fast_decoder=fast_decoder, max_rows_in_memory=3)
    reference = drain(everything, until)
    one = sources(mariadb_source, start, fast_decoder=fast_decoder, max_rows_in_memory=3,
                  selects=lambda schema, table: table in KEEP)
    got = drain(one, until)
    counter = one.row_counter
    assert counter is not None and everything.row_counter is not None and everything.row_counter.skipped == 0
    # wide and odd (full images) are counted; the MINIMAL update of odd and the versioned table are decoded
    assert counter.skipped >= 10 and counter.decoded == 1, (counter.skipped, counter.decoded)
    assert (counter.count is skipping.count_rows_py) is (PURE or not fast_decoder)
    pieces = [tx.end for tx in reference if not tx.complete]
    assert len(pieces) >= 3 and [tx.end for tx in got if not tx.complete] != []
    kept = [p for p in positions(reference, KEEP) if p[0] != "end"]
    assert [p for p in positions(got, KEEP) if p[0] != "end"] == kept and len(kept) == 20
    # the pieces are cut by the rows held (only the kept table's now): every ordinal is the full count's
    assert {p[3] for p in kept} <= {c.position for tx in reference for c in tx.changes}
    for at in pieces:
        resumed = sources(mariadb_source, at, fast_decoder=fast_decoder, max_rows_in_memory=3,
                          selects=lambda schema, table: table in KEEP)
        rest = [p for p in positions(drain(resumed, until), KEEP) if p[0] != "end"]
        assert rest == [p for p in kept if p[3] is not None and p[3] > at], at


def test_a_signal_table_outside_the_rules_is_still_read(mariadb_source, source_db, sources):
    """`reads` widens what a reader decodes beyond `selects` (the batch DDL tasks' signal table)."""
    execute(mariadb_source, source_db, "CREATE TABLE keep (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE sig (id INT PRIMARY KEY, v INT)", "CREATE TABLE other (id INT PRIMARY KEY, v INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO keep VALUES (1, 1)", "INSERT INTO sig VALUES (1, 1)",
            "INSERT INTO other VALUES (1, 1)")
    end = head(mariadb_source)
    src = sources(mariadb_source, start, selects=lambda schema, table: table == "keep",
                  reads=lambda schema, table: table in ("keep", "sig"))
    got = drain(src, lambda got: bool(got) and bare(got[-1].end) == end)
    assert sorted({c.table for tx in got for c in tx.changes if isinstance(c, RowChange)}) == ["keep", "sig"]
    assert src.row_counter is not None and src.row_counter.skipped == 1  # `other`'s one event


def image(values: list[bytes | None], widths: list[int]) -> bytes:
    """A full row image: the null bitmap, then each non-NULL value with its length prefix if any."""
    bitmap = bytearray((len(widths) + 7) // 8)
    body = b""
    for i, (value, width) in enumerate(zip(values, widths)):
        if value is None:
            bitmap[i >> 3] |= 1 << (i & 7)
        elif width > 0:
            body += value[:width].ljust(width, b"\0")
        else:
            body += len(value).to_bytes(-width, "little") + value
    return bytes(bitmap) + body


@st.composite
def events(draw: Any) -> tuple[bytes, int, list[int], int]:
    widths = draw(st.lists(st.sampled_from([1, 2, 3, 4, 8, 5, 7, -1, -2, -3, -4]), min_size=1, max_size=12))
    kind = draw(st.sampled_from([0, 1, 2]))
    count = draw(st.integers(0, 5))
    data = b"\0" * 7
    for _ in range(count * (2 if kind == 1 else 1)):
        data += image([draw(st.one_of(st.none(), st.binary(max_size=20))) for _ in widths], widths)
    return data, kind, widths, count


@settings(max_examples=150, deadline=None)
@given(events(), st.integers(0, 60), st.binary(max_size=4), st.integers(0, 100))
def test_both_counts_agree_and_never_read_past_the_event(event, cut, noise, at):
    """The compiled and the Python count give the real row count of well-formed images, and on cut
    or overwritten bytes the same count or a ValueError, never a read past the event's end."""
    data, kind, widths, count = event
    sizes = array.array("i", widths)
    assert skipping.count_rows_py(data, 7, len(data), kind, sizes) == count
    mangled = bytearray(data[:max(7, len(data) - cut)])
    if noise and len(mangled) > 7:
        spot = 7 + at % (len(mangled) - 7)
        mangled[spot:spot + len(noise)] = noise
    outcomes: list[int | str] = []
    counters = [skipping.count_rows_py] + ([] if PURE else [skipping._compiled_count])
    for count_rows in counters:
        assert count_rows is not None
        try:
            outcomes.append(count_rows(bytes(mangled), 7, len(mangled), kind, sizes))
        except ValueError:
            outcomes.append("error")
    assert len(set(outcomes)) == 1, outcomes
