"""How `setl.pipeline.build_stages` sets up a snapshot's reads from the pipeline's load settings."""

from __future__ import annotations

import pytest

from tests.e2e.setl_process import mysql_target
from tests.snapshot import tables as t
from tests.snapshot.test_snapshot_e2e import make_setl

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("load", "interleave"), [({}, False), ({"chunks": "per_table"}, True),
                                                  ({"mode": "per_table"}, True)])
def test_a_load_by_table_reads_the_copies_chunks_in_turn(tmp_path, mariadb_source, mariadb_target, source_db,
                                                         mysql_db, load, interleave):
    """Where the target loads chunks of different tables at once (``load.mode`` or ``load.chunks``
    per_table) the copies' chunks are read a table at a time in turn; in ordered mode, where one
    batch loads at a time, the first table's chunks come first."""
    from setl.config import load_node, load_pipeline
    from setl.connectors import for_node
    from setl.meta.sqlite import SqliteMetaStore
    from setl.pipeline import build_stages
    from setl.snapshot.select import find_snapshot

    t.create(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2317, load=load)
    settings = load_node(setl.conf)
    meta = SqliteMetaStore(tmp_path / "meta.db")
    try:
        stages = build_stages(settings, load_pipeline(setl.conf, setl.name, for_node(settings)), meta)
        snapshot = find_snapshot(stages.select)
        assert snapshot is not None and snapshot.book.interleave is interleave
        stages.load.close()
    finally:
        meta.close()
