"""The JSON-lines file source: positions, resume, follow, and bad records."""

from __future__ import annotations

import pytest

from setl.connectors import BuildContext, registry
from setl.errors import SourceError
from setl.model import Op, Position
from setl.sources.file import FileSource, FileSourceConfig, encode_transaction
from setl.testing.connectors import SelectContract, SourceProbe
from setl.testing.harness import delete, insert, read, update


def write(path, txs):
    path.write_text("".join(encode_transaction(tx) for tx in txs), encoding="utf-8")


def test_positions_are_byte_offsets_after_each_line_and_resume_skips_nothing(tmp_path):
    """Each transaction ends at the byte after its line; reopening there yields exactly the rest."""
    path = tmp_path / "s.jsonl"
    txs = [[insert("t", {"id": i})] for i in range(5)] + [[update("t", {"id": 1}, {"id": 9})], [delete("t", {"id": 2})]]
    write(path, txs)
    source = FileSource(path, follow=False)
    source.open(None)
    read = []
    while (tx := source.poll(0)) is not None:
        read.append(tx)
    assert len(read) == len(txs) and read[-1].end == Position("s.jsonl", path.stat().st_size)
    assert source.head() == read[-1].end
    source.seek(read[2].end)
    rest = []
    while (tx := source.poll(0)) is not None:
        rest.append(tx)
    assert [t.end for t in rest] == [t.end for t in read[3:]]
    assert rest[0].changes[0].key == (3,)


def test_follow_waits_for_a_complete_line(tmp_path):
    """A half-written line is not read until its newline arrives."""
    path = tmp_path / "s.jsonl"
    line = encode_transaction([insert("t", {"id": 1})])
    path.write_text(line[:10])
    source = FileSource(path, follow=True)
    source.open(None)
    assert source.poll(0.05) is None
    with open(path, "a") as out:
        out.write(line[10:])
    assert source.poll(1.0).changes[0].key == (1,)


def test_bad_record_and_foreign_position_are_source_errors_with_positions(tmp_path):
    """A malformed line names its byte offset; a position of another log is refused."""
    path = tmp_path / "s.jsonl"
    path.write_text('{"changes": [{"op": "insert", "schema": "d", "table": "t"}]}\n')
    source = FileSource(path, follow=False, pipeline="p")
    source.open(None)
    with pytest.raises(SourceError, match=r"position=s.jsonl:0.*without the images it needs"):
        source.poll(0)
    with pytest.raises(SourceError, match="belongs to another log"):
        FileSource(path, pipeline="p").open(Position("other.jsonl", 0))


class FileProbe(SourceProbe):
    """A JSON-lines file, through the file connector."""

    wait = 5.0

    def __init__(self, path):
        self.path = path
        path.touch()

    def write(self, transactions):
        with self.path.open("a", encoding="utf-8") as out:
            out.write("".join(encode_transaction(list(tx)) for tx in transactions))

    def make_select(self, pipeline="p"):
        return registry().source("file").create(FileSourceConfig("file", str(self.path)), BuildContext(pipeline))


class TestFileSelectContract(SelectContract):
    """The connector kit's Select contract, on the file source."""

    @pytest.fixture
    def probe(self, tmp_path):
        return FileProbe(tmp_path / "kit.jsonl")


def test_snapshot_reads_round_trip_and_a_read_with_a_before_image_is_refused(tmp_path):
    """A read line (after image only) comes back as a read; one carrying a before image is a source error."""
    path = tmp_path / "s.jsonl"
    write(path, [[read("t", {"id": 1, "v": "a"}), read("t", {"id": 2, "v": "b"})]])
    source = FileSource(path, follow=False)
    source.open(None)
    tx = source.poll(0)
    assert [(c.op, c.before, c.after) for c in tx.changes] == [(Op.READ, None, {"id": 1, "v": "a"}),
                                                              (Op.READ, None, {"id": 2, "v": "b"})]
    source.close()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"changes": [{"op": "read", "schema": "d", "table": "t", "before": {"id": 1}, '
                   '"after": {"id": 1}}]}\n')
    source = FileSource(bad, follow=False, pipeline="p")
    source.open(None)
    with pytest.raises(SourceError, match="read change with a before image"):
        source.poll(0)


class _NoMoving:
    """A file object whose position must not move: it has a descriptor and nothing else."""

    def __init__(self, file) -> None:
        self._fd = file.fileno()

    def fileno(self) -> int:
        return self._fd


def test_head_never_moves_the_position_select_reads_from(tmp_path):
    """`head()` (asked from the node's sampler thread while Select polls) reads the file's end
    without seeking or reading the shared file object, so Select never reads from a wrong offset;
    with a half-written last line it still ends after the last complete one."""
    path = tmp_path / "s.jsonl"
    write(path, [[insert("t", {"id": i})] for i in range(3)])
    complete = path.stat().st_size
    with path.open("a") as out:
        out.write('{"changes": [')
    source = FileSource(path, follow=True)
    source.open(None)
    first = source.poll(0)
    assert first is not None
    reader = source._file
    source._file = _NoMoving(reader)  # any seek, read or readline would raise AttributeError
    try:
        assert source.head() == Position("s.jsonl", complete)
    finally:
        source._file = reader
    rest = [source.poll(0), source.poll(0)]
    assert [tx.changes[0].after["id"] for tx in rest] == [1, 2] and rest[-1].end == Position("s.jsonl", complete)
    source.close()
