"""The snapshot stream's order: a chunk read at binlog position Pc is handed on after exactly the
binlog transactions ending at or before Pc, and a read in flight holds back what may follow it."""

from __future__ import annotations

from setl.model import Position, Transaction
from setl.snapshot.merge import StreamMerge


def tx(offset: int, row: int = 0, complete: bool = True) -> Transaction:
    return Transaction((), Position("mysql-bin.000001", offset, row=row), complete=complete)


def at(offset: int, log: str = "mysql-bin.000001") -> Position:
    return Position(log, offset)


def drain(merge: StreamMerge[str], source: list[Transaction]) -> list[str]:
    """Offer `source` one by one as the merge takes it; the stream it hands on, as labels."""
    out: list[str] = []
    while True:
        if merge.lookahead is None and source:
            merge.offer(source.pop(0))
        found = merge.next()
        if found is None:
            if merge.lookahead is None and source:
                continue
            return out
        out.append(found[1] if isinstance(found, tuple) else f"tx@{found.end.offset}+{found.end.row}")


def test_chunk_goes_after_transactions_ending_at_or_before_its_position():
    """A chunk at 300 follows the transactions ending at 200 and 300 and precedes the one ending at 400."""
    merge: StreamMerge[str] = StreamMerge(at(100))
    merge.add(at(300), "chunk@300")
    assert drain(merge, [tx(200), tx(300), tx(400), tx(500)]) == [
        "tx@200+0", "tx@300+0", "chunk@300", "tx@400+0", "tx@500+0"]


def test_read_in_flight_holds_back_what_may_follow_its_chunk():
    """While a read is in flight (its position unknown) nothing past the frontier goes on; once the
    server tells its position, transactions up to it go on, then the chunk once added, then the rest."""
    merge: StreamMerge[str] = StreamMerge(at(100))
    rid = merge.read_started()
    source = [tx(200), tx(300), tx(400)]
    assert drain(merge, source) == []  # tx@200 is held: the chunk could sit at 100
    merge.read_positioned(rid, at(300))
    assert drain(merge, source) == ["tx@200+0", "tx@300+0"]  # tx@400 waits for the chunk
    merge.add(at(300), "chunk@300")
    merge.read_ended(rid)
    assert drain(merge, source) == ["chunk@300", "tx@400+0"]


def test_pieces_of_split_transactions_order_around_the_chunk():
    """Pieces of a transaction ending at the chunk's position go before it, pieces of one starting
    there (positions START+ROW) after it."""
    merge: StreamMerge[str] = StreamMerge(at(100))
    merge.add(at(300), "chunk@300")
    source = [tx(200, row=50, complete=False), tx(300), tx(300, row=50, complete=False), tx(450)]
    assert drain(merge, source) == ["tx@200+50", "tx@300+0", "chunk@300", "tx@300+50", "tx@450+0"]


def test_idle_source_hands_the_chunk_on_once_its_position_is_reached():
    """With nothing more from the source, a chunk goes on once the frontier reached its position,
    not before (a transaction ending before it may still come)."""
    merge: StreamMerge[str] = StreamMerge(at(100))
    merge.add(at(200), "chunk@200")
    assert drain(merge, []) == []
    assert drain(merge, [tx(200)]) == ["tx@200+0", "chunk@200"]
    merge.add(at(200), "again@200")  # a later read at the same position
    assert drain(merge, []) == ["again@200"]


def test_chunks_in_position_order_whatever_order_reads_finish_in():
    """Chunks go on by position, equal positions in the order they were added, across a new binlog file."""
    merge: StreamMerge[str] = StreamMerge(at(100))
    first, second = merge.read_started(), merge.read_started()
    merge.read_positioned(first, at(500))
    merge.read_positioned(second, at(200))
    merge.add(at(500), "b@500")
    merge.read_ended(first)
    source = [tx(200), tx(300), tx(500), Transaction((), at(4, "mysql-bin.000002")),
              Transaction((), at(120, "mysql-bin.000002"))]
    assert drain(merge, source) == ["tx@200+0"]  # the read at 200 may still place a chunk there
    merge.add(at(200), "a@200")
    merge.add(at(200), "a2@200")
    merge.read_ended(second)
    assert drain(merge, source) == ["a@200", "a2@200", "tx@300+0", "tx@500+0", "b@500", "tx@4+0", "tx@120+0"]
