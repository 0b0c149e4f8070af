"""How a node builds a pipeline's stages from its config."""

from __future__ import annotations

import gc
import textwrap

import pytest

from setl.config import RuntimeConfig, load_node, load_pipeline
from setl.connectors import registry
from setl.errors import ConfigError
from setl.node import tune_gc
from setl.pipeline import build_select


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
    source = build_select(load_node(conf), load_pipeline(conf, "p", registry()))
    assert source.max_rows_in_memory == 1234 and source.server_id == 4242


def test_tune_gc_freezes_the_startup_heap_and_raises_the_first_threshold(tmp_path):
    """`runtime.gc_threshold` (default 500000) is applied after a freeze; 0 leaves Python's settings alone."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "setl.yaml").write_text("runtime: {gc_threshold: 0}\n")
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        tune_gc(load_node(conf).runtime)
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
        assert load_node(tmp_path / "none").runtime.gc_threshold == 500_000
        tune_gc(RuntimeConfig(gc_threshold=12_345))
        assert gc.get_threshold() == (12_345, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_negative_gc_threshold_is_a_config_error(tmp_path):
    """A negative threshold is refused when setl.yaml is read, naming the key."""
    (tmp_path / "setl.yaml").write_text("runtime: {gc_threshold: -1}\n")
    with pytest.raises(ConfigError, match="gc_threshold"):
        load_node(tmp_path)
