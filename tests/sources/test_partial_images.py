"""The binlog source's partial row images (sessions with binlog_row_image NOBLOB or MINIMAL): the columns
the event leaves out are absent from the image (a `PartialImage`), never None, with and without value fixes."""

from __future__ import annotations

import pytest

from setl.model import Op, PartialImage
from tests.sources.binlog import execute, head, read


@pytest.mark.parametrize("fixes", [False, True], ids=["plain", "with-value-fixes"])
def test_partial_images_hold_only_the_logged_columns(fixes, mariadb_source, source_db, sources):
    """NOBLOB leaves TEXT/BLOB out, MINIMAL keeps the key in the before-image and the set columns in the
    after-image; a FULL session's images stay whole (a plain mapping); a NULL that was logged stays None."""
    extra = ", f SET('x','y') DEFAULT 'x'" if fixes else ""  # a SET column: the image goes through value fixes
    execute(mariadb_source, source_db, f"CREATE TABLE p (id INT PRIMARY KEY, n INT, body TEXT{extra})",
            "INSERT INTO p (id, n, body) VALUES (1, NULL, 'long')")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "SET SESSION binlog_row_image = NOBLOB", "UPDATE p SET n = 2 WHERE id = 1",
            "SET SESSION binlog_row_image = MINIMAL", "UPDATE p SET n = NULL WHERE id = 1",
            "DELETE FROM p WHERE id = 1", "SET SESSION binlog_row_image = FULL",
            "INSERT INTO p (id, n, body) VALUES (2, 2, 'b')")
    src = sources(mariadb_source, start)
    noblob, minimal, delete, full = (tx.changes[0] for tx in read(src, 4, source_db))
    set_value = {"f": frozenset({"x"})} if fixes else {}
    assert noblob.op is Op.UPDATE and noblob.partial
    assert dict(noblob.before) == {"id": 1, "n": None, **set_value}  # type: ignore[arg-type]
    assert dict(noblob.after) == {"id": 1, "n": 2, **set_value}  # type: ignore[arg-type]
    assert type(minimal.before) is PartialImage and dict(minimal.before) == {"id": 1}
    assert type(minimal.after) is PartialImage and dict(minimal.after) == {"n": None}
    assert delete.op is Op.DELETE and dict(delete.before) == {"id": 1}  # type: ignore[arg-type]
    assert not full.partial and type(full.after) is not PartialImage
    assert dict(full.after) == {"id": 2, "n": 2, "body": "b", **set_value}  # type: ignore[arg-type]
