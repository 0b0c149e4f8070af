"""The page as a plain headless browser sees it at load (`chromium --headless --dump-dom`, the
timing of `--screenshot`): the node, its pipelines and the cluster are there, not a blank page."""

from __future__ import annotations

import subprocess

from setl.meta.sqlite import SqliteMetaStore
from setl.observe import NodeObserver
from setl.observe.server import StatusServer

CHROMIUM = "/usr/bin/chromium"


def test_the_cluster_page_is_rendered_at_load(tmp_path) -> None:
    """A plain headless load of the page shows the pipeline's card and the cluster's nodes (the
    status comes inside the page), and a ``</script>`` in an error text does not break it."""
    meta = SqliteMetaStore(tmp_path / "meta.db")
    observer = NodeObserver("node-a", ["p1"], meta, lambda: {"p1": {"running": False}})
    observer.watch_cluster(lambda: {
        "coordinator": "node-a", "moves": 1, "last_rebalance": None,
        "nodes": {"node-a": {"live": True, "draining": False, "capacity": None, "weight": 1,
                             "pipelines": ["p1"]},
                  "node-b": {"live": False, "draining": False, "capacity": 2, "weight": 1,
                             "pipelines": ["</script><b>x</b>"]}}})
    server = StatusServer(observer, "127.0.0.1:0")
    server.start()
    try:
        result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", server.url],
                                capture_output=True, text=True, timeout=90)
    finally:
        server.stop()
        meta.close()
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'id="cluster" class="cluster"' in dom and 'data-node="node-a"' in dom and 'data-node="node-b"' in dom
    assert "node node-a" in dom  # the header, rendered by the script from the embedded status
    assert "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in dom  # shown as text, not markup
