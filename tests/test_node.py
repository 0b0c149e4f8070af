"""How a node builds a pipeline's stages from its config."""

from __future__ import annotations

import textwrap

from setl.config import load_node, load_pipeline
from setl.node import build_select


def test_binlog_source_splits_transactions_at_the_batch_size(tmp_path):
    """A transaction larger than `batch.max_rows` reaches the scheduler in batch-sized pieces."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {tmp_path / 'meta.db'}}}\n")
    (conf / "pipelines" / "p.yaml").write_text(textwrap.dedent("""\
        source: {type: mysql, host: 127.0.0.1, port: 3306, server_id: 4242}
        target: {type: sqlite, path: t.db}
        pipeline: {batch: {max_rows: 1234}}
        """))
    source = build_select(load_node(conf), load_pipeline(conf, "p"))
    assert source.max_rows_in_memory == 1234 and source.server_id == 4242
