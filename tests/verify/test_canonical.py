"""The canonical texts `setl verify` compares in Python, and the comparison loop's waits and pacing
with an injected clock."""

from __future__ import annotations

import datetime
import decimal
import ipaddress

import pytest

from setl.model import Position
from setl.values import Geometry
from setl.verify import canonical
from setl.verify.compare import Verifier
from setl.verify.pace import VerifyError


def test_null_and_empty_string_differ_and_no_two_rows_share_a_text():
    """NULL is no text, '' is one; a separator inside a value cannot make two rows one."""
    assert canonical.text("varchar", None) is None
    assert canonical.text("varchar", "") == ""
    assert canonical.row_text([None]) != canonical.row_text([""])
    assert canonical.row_text(["a", "b:c"]) != canonical.row_text(["a:b", "c"])
    assert canonical.row_hash(["a", None]) != canonical.row_hash([None, "a"])


def test_values_from_either_driver_give_one_text():
    """A source value (PyMySQL, setl.values forms) and the same value as psycopg or PyMySQL read it
    from a target give the same text; a 1 µs, a scale or a trailing-space change gives another."""
    utc = datetime.timezone.utc
    naive = datetime.datetime(2024, 1, 2, 3, 4, 5, 6)
    assert canonical.text("timestamp", naive) == canonical.text("timestamp", naive.replace(tzinfo=utc))
    plus2 = datetime.timezone(datetime.timedelta(hours=2))
    assert canonical.text("timestamp", naive) == canonical.text(
        "timestamp", naive.replace(tzinfo=utc).astimezone(plus2))
    assert canonical.text("datetime", naive) != canonical.text("datetime", naive + datetime.timedelta(microseconds=1))
    assert canonical.text("decimal", decimal.Decimal("1.500")) == "1.500"
    assert canonical.text("decimal", decimal.Decimal("1.50")) != canonical.text("decimal", decimal.Decimal("1.500"))
    assert canonical.text("time", datetime.timedelta(hours=-1, microseconds=250)) == "-3599.999750"
    assert canonical.text("time", datetime.time(1, 2, 3, 400000)) == canonical.text(
        "time", datetime.timedelta(hours=1, minutes=2, seconds=3, microseconds=400000))
    assert canonical.text("char", "ab") != canonical.text("char", "ab ")
    assert canonical.text("float", 1.1) == canonical.text("float", 1.100000023841858)
    assert canonical.text("double", 1.1) != canonical.text("double", 1.100000023841858)
    assert canonical.text("bit", b"\x01\x00") == canonical.text("bit", 256) == "256"
    assert canonical.text("tinyint", True) == "1"
    assert canonical.text("blob", memoryview(b"\x00\xff")) == "00FF"


def test_json_set_and_addresses_compare_by_value():
    """jsonb's key order and spacing, a SET's member order and an address's spelling are not
    differences; a changed value is."""
    assert canonical.text("json", '{"b": 1, "a": [1, 2.5]}') == canonical.text("json", {"a": [1, 2.5], "b": 1})
    assert canonical.text("json", '{"a": 1}') != canonical.text("json", '{"a": 2}')
    assert canonical.text("set", frozenset({"z", "x"})) == canonical.text("set", "x,z") == "x,z"
    assert canonical.text("set", frozenset()) == canonical.text("set", "") == ""
    assert canonical.text("inet6", "::ffff:1.2.3.4") == canonical.text("inet6", ipaddress.ip_address("::ffff:102:304"))
    assert canonical.text("inet4", ipaddress.ip_address("10.0.0.1")) == "10.0.0.1"
    assert canonical.text("uuid", "6CCD780C-BABA-1026-9564-5B8C656024DB") == "6ccd780c-baba-1026-9564-5b8c656024db"
    assert canonical.text("point", Geometry(b"\x00\x00\x00\x00\x01")) == "0000000001"


def test_summary_is_order_free_and_counts_duplicates():
    """The chunk aggregate does not depend on row order, and a duplicated row changes it."""
    hashes = [canonical.row_hash([str(n)]) for n in range(5)]
    assert canonical.summary(hashes) == canonical.summary(list(reversed(hashes)))
    assert canonical.summary(hashes + hashes[:1]) != canonical.summary(hashes)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_wait_for_the_acked_position_and_its_timeout():
    """A read waits until the acked position reaches the source's; past the timeout it is one error
    naming pipeline, table and both positions."""
    clock = Clock()
    acks = iter([None, Position("b.000001", 100), Position("b.000001", 400)])
    verifier = Verifier("p1", lambda: next(acks), wait_timeout=5, sleep=clock.sleep, clock=lambda: clock.now)
    verifier.pace.wait_acked(Position("b.000001", 400), "s.t")
    assert len(clock.slept) == 2
    stuck = Verifier("p1", lambda: Position("b.000001", 100), wait_timeout=5, sleep=clock.sleep,
                     clock=lambda: clock.now)
    with pytest.raises(VerifyError) as caught:
        stuck.pace.wait_acked(Position("b.000002", 4), "s.t")
    text = str(caught.value)
    assert "pipeline=p1" in text and "table=s.t" in text and "b.000001:100" in text and "b.000002:4" in text
    assert caught.value.exit_code == 2


def test_max_rows_per_second_paces_the_reads():
    """After N source rows read for a table, whatever read them (chunk hashes, drill-downs,
    re-checks), the table's check has taken at least N / max_rows_per_second seconds."""
    clock = Clock()
    verifier = Verifier("p1", lambda: None, max_rows_per_second=1000, sleep=clock.sleep, clock=lambda: clock.now)
    verifier.pace.charge(500)  # a chunk's hash
    assert clock.now == pytest.approx(0.5)
    clock.now = 2.0
    verifier.pace.charge(500)  # already slower than the bound: no sleep
    assert clock.slept == [pytest.approx(0.5)]
    verifier.pace.charge(2000)  # a differing chunk's rows read twice: 3,000 rows, 3 s
    assert clock.now == pytest.approx(3.0) and len(clock.slept) == 2
