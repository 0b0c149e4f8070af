"""A table copy's state machine (`Copy`) and the book's transitions (`CopyBook`), driven step by
step without threads or servers, as the reader threads and the poll thread drive them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from setl.model import Position, TableName, Transaction
from setl.snapshot.copies import Copy, CopyBook, CopyStateError, Phase
from setl.snapshot.ledger import Chunk
from setl.snapshot.reader import TablePlan

ITEMS = TableName("shop", "items")
LOG = TableName("shop", "log")


def plan(name: TableName = ITEMS, *, keyless: bool = False) -> TablePlan:
    """A plan of `name`, keyed on `id` unless `keyless`."""
    return TablePlan(name, ("id", "v"), {"id": "int", "v": "text"}, () if keyless else ("id",), 10)


def at(offset: int) -> Position:
    return Position("mysql-bin.000001", offset)


@pytest.fixture
def book() -> Iterator[CopyBook]:
    """A book at position 4, its lock held (as its callers hold it)."""
    book = CopyBook()
    with book.lock:
        book.reset(at(4))
        yield book


def chunk(copy: Copy, index: int, offset: int, *, final: bool = False, generation: int = 1) -> Chunk:
    """Chunk `index` of `copy`, read at `offset`."""
    return Chunk(copy.plan.name, generation, index, ({"id": index, "v": "x"},), at(offset), None, None, final,
                 copy=copy.serial)


def test_keyed_copy_claims_chunks_in_key_order_until_the_final_one():
    """Each claim starts after the previous chunk's upper key; the final claim (no upper) leaves nothing to claim."""
    copy = Copy(plan(), 1)
    assert (copy.phase, copy.lower) == (Phase.READING, None)
    assert copy.claim() and copy.phase is Phase.CLAIMING
    assert not copy.claim()  # one reader finds a boundary at a time
    assert copy.claimed((10,)) == 0 and (copy.phase, copy.lower) == (Phase.READING, (10,))
    assert copy.claim()
    assert copy.claimed(None) == 1 and copy.phase is Phase.READ
    assert not copy.claim()


def test_resumed_copy_starts_after_its_last_acked_key():
    """A copy resumed after key 41 claims its next chunk from there, with index 0 of this run."""
    copy = Copy(plan(), 3, after=(41,))
    assert copy.claim() and copy.lower == (41,)
    assert copy.claimed((80,)) == 0 and copy.lower == (80,)


def test_released_claim_can_be_claimed_again():
    """A reader failing while finding a boundary gives the chunk back; a release outside a claim changes nothing."""
    copy = Copy(plan(), 1)
    copy.claim()
    copy.released()
    assert copy.phase is Phase.READING and copy.claim()
    assert copy.claimed(None) == 0
    copy.released()
    assert copy.phase is Phase.READ


def test_copy_is_handed_on_only_once_final_and_every_earlier_chunk_are_out_of_order():
    """Chunks handed on out of index order: the final one first does not finish the copy, the last missing one does."""
    copy = Copy(plan(), 1)
    for upper in ((10,), (20,), None):
        copy.claim()
        copy.claimed(upper)
    assert not copy.handed(keyed=True, final=True)  # chunk 2 placed before chunks 0 and 1
    assert not copy.handed_on
    assert not copy.handed(keyed=True, final=False)
    assert copy.handed(keyed=True, final=False)
    assert copy.phase is Phase.HANDED and copy.handed_on


def test_chunk_handed_while_the_next_is_claimed_does_not_finish_the_copy():
    """A non-final chunk handed on while a reader claims the next leaves the copy under way."""
    copy = Copy(plan(), 1)
    copy.claim()
    copy.claimed((10,))
    copy.claim()
    assert not copy.handed(keyed=True, final=False)
    assert copy.phase is Phase.CLAIMING


def test_keyless_copy_is_one_claim_handed_on_with_its_final_piece():
    """A keyless copy is claimed whole; its pieces do not count as chunks, its final piece finishes it."""
    copy = Copy(plan(LOG, keyless=True), 2)
    assert copy.claim()
    copy.claimed_whole()
    assert copy.phase is Phase.READ and not copy.claim()
    assert not copy.handed(keyed=False, final=False)
    assert copy.handed(keyed=False, final=True)
    assert copy.handed_on


def test_marker_follows_a_handed_copy_once():
    """The end marker is queued once, after the copy is all handed on, and never before."""
    copy = Copy(plan(), 1)
    with pytest.raises(CopyStateError, match=r"shop.*items.*mark in phase reading"):
        copy.mark()
    copy.claim()
    copy.claimed(None)
    copy.handed(keyed=True, final=True)
    assert copy.mark() and copy.phase is Phase.MARKED and copy.handed_on
    assert not copy.mark()


def test_empty_copy_has_nothing_to_claim_and_is_not_handed_on_until_marked():
    """A table empty at its TRUNCATE is never claimed; it counts as handed on only once its marker is queued."""
    copy = Copy(plan(), 1, empty=True)
    assert not copy.claim() and not copy.handed_on
    assert copy.mark() and copy.handed_on


def test_transitions_out_of_phase_are_refused():
    """Claiming results without a claim, or handing on chunks of a finished copy, raise a `CopyStateError`."""
    copy = Copy(plan(), 1)
    with pytest.raises(CopyStateError, match="claimed in phase reading"):
        copy.claimed((1,))
    with pytest.raises(CopyStateError, match="claimed_whole in phase reading"):
        copy.claimed_whole()
    copy.claim()
    copy.claimed(None)
    copy.handed(keyed=True, final=True)
    with pytest.raises(CopyStateError, match="handed in phase handed"):
        copy.handed(keyed=True, final=False)


def test_book_claims_within_its_room_counting_claims_in_progress(book: CopyBook):
    """`CopyBook.claim` gives nothing once claims plus reads pending fill `max_chunks`, and a copy again later."""
    first, second = book.new_copy(plan()), book.new_copy(plan(LOG))
    assert first.serial != second.serial
    book.open(first)
    book.open(second)
    assert book.claim(2) is first
    assert book.claim(2) is second
    assert book.claim(2) is None  # two claims fill the room
    first.claimed((10,))
    rid = book.register(book.generation)
    assert book.claim(2) is None  # the read registered holds the room of its claim
    book.ended(book.generation, rid, chunk(first, 0, 5, generation=book.generation))
    assert book.claim(2) is None  # its chunk waits in the merge
    taken = book.merge
    book.merge.offer(Transaction((), at(6)))
    found = taken.next()
    assert isinstance(found, tuple)
    book.taken(found[1])
    assert book.claim(2) is first
    assert dict(book.queued) == {}


def test_interleaving_book_claims_go_round_the_copies(book: CopyBook):
    """With `interleave`, one reader claiming chunk after chunk takes them from each copy in turn,
    not every chunk of the first table first: consecutive chunks are of different tables, so
    `load.chunks: per_table` loads them on connections of their own at once. A copy with nothing to
    claim is passed over. Without it, the first copy with a chunk to claim is taken."""
    orders = TableName("shop", "orders")
    book.interleave = True
    copies = [book.new_copy(plan(name)) for name in (ITEMS, LOG, orders)]
    for copy in copies:
        book.open(copy)
    taken = []
    for upper in range(1, 7):
        copy = book.claim(10)
        assert copy is not None
        taken.append(copy.plan.name)
        copy.claimed(None if (copy is copies[1] and upper == 2) else (upper,))  # LOG's second chunk is its last
    assert taken == [ITEMS, LOG, orders, ITEMS, orders, ITEMS]  # LOG passed over once read to its end
    book.interleave = False
    assert [book.claim(10) for _ in range(2)] == [copies[0], copies[2]]  # ITEMS is claiming: orders next


def test_read_of_an_earlier_generation_is_dropped(book: CopyBook):
    """After `stop_reads`, a read registered before ends without placing its chunk, and a new one is refused."""
    copy = book.new_copy(plan())
    book.open(copy)
    generation = book.generation
    rid = book.register(generation)
    book.stop_reads()
    book.ended(generation, rid, chunk(copy, 0, 5, generation=generation))
    assert book.register(generation) == -1
    assert not book.queued and book.merge.pending == 1  # the old read is forgotten with the merge's reset
    book.reset(at(4))
    assert book.merge.idle and not book.copies


def test_dropped_copy_abandons_its_chunks_and_a_new_copy_gets_a_new_serial(book: CopyBook):
    """`drop` forgets the copy, its window and keyless state, and marks its serial abandoned; its next copy differs."""
    old = book.new_copy(plan(LOG, keyless=True))
    book.open(old, keyless_open=True)
    book.window(old, at(5), at(9), book.generation)
    assert LOG in book.windows and LOG in book.keyless_open
    book.drop(LOG)
    assert not book.busy(LOG) and LOG not in book.windows and LOG not in book.keyless_open
    assert old.serial in book.abandoned
    book.window(old, at(5), at(9), book.generation)  # a late window of the abandoned copy
    assert LOG not in book.windows
    book.queue(LOG)
    assert book.busy(LOG) and book.take_waiting() == [LOG] and not book.waiting
    assert book.new_copy(plan(LOG, keyless=True)).serial != old.serial


def test_finished_lets_go_only_the_copy_that_was_acked(book: CopyBook):
    """An ack finishing an earlier copy of a table leaves the copy begun since in the book."""
    first = book.new_copy(plan())
    book.open(first)
    book.drop(ITEMS)
    again = book.new_copy(plan())
    book.open(again)
    book.finished(ITEMS, first.serial)
    assert book.copies == {ITEMS: again} and book.active
    book.finished(ITEMS, again.serial)
    assert not book.active and book.idle


def test_book_hands_out_queued_transactions_in_order_and_keeps_a_failure(book: CopyBook):
    """Transactions queued with `then` come out first in, first out; a reader's failure stays for the poll thread."""
    truncate, marker = Transaction((), at(4)), Transaction((), at(5))
    book.then(truncate)
    book.then(marker)
    assert not book.idle
    assert book.next_out() is truncate and book.next_out() is marker and book.next_out() is None
    error = RuntimeError("read failed")
    book.fail(error)
    assert book.failure is error
    book.reset(at(6))
    assert book.failure is None and book.handed == at(6)
