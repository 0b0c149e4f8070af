"""A real `setl start` with its HTTP endpoint on, for the observability tests: one pipeline from a
MariaDB source database to a MariaDB target database, and clients for the endpoint and the servers."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from setl.testing.servers import free_port, wait_until

from ..e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target

#: `ObservedNode`'s `retry` for tests of a pause: two attempts within 1.5 s, then the pipeline pauses.
PAUSE_SOON = {"max_attempts": 2, "initial_backoff_ms": 50, "max_backoff_ms": 200, "max_elapsed_ms": 1500}


class ObservedNode:
    """`setl start --pipeline NAME` with ``http.listen`` on a free loopback port (`url`)."""

    def __init__(self, root: Path, source: Any, source_db: str, target: Any, target_db: str,
                 *, retry: dict | None = None, name: str | None = None, start: Any = None) -> None:
        head = binlog_head(source)
        self.source, self.source_db, self.target, self.target_db = source, source_db, target, target_db
        self.setl = SetlProcess(
            root, source=mysql_source(source, start=start or {"file": head.log, "pos": head.offset}),
            target=mysql_target(target), tables=[{"source": rf"{source_db}\..*", "target": f"{target_db}.{{table}}"}],
            pipeline={"parallelism": 3, "batch": {"max_rows": 2000, "max_wait_ms": 20},
                      "retry": retry or {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 500}},
            name=name)
        self.name = self.setl.name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.setl.conf / "setl.yaml").write_text(yaml.safe_dump({
            "node": {"id": "obs-node"}, "meta": {"store": "sqlite", "path": str(self.setl.meta_path)},
            "http": {"listen": f"127.0.0.1:{self.port}"}}))
        self.proc: Any = None

    def start(self, timeout: float = 60.0) -> ObservedNode:
        self.proc = self.setl.spawn()
        wait_until(self._running, timeout, 0.2, message=lambda: f"the node's endpoint\n{self.setl.logs()[-3000:]}")
        return self

    def _running(self) -> bool:
        assert self.proc.poll() is None, f"setl exited {self.proc.returncode}:\n{self.setl.logs()[-3000:]}"
        with contextlib.suppress(OSError, ValueError):
            row = self.pipeline()
            return bool(row["running_here"] and row["figures"] is not None)
        return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None  # a second stop does nothing
        if proc is not None:
            SetlProcess.stop(proc)

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "")

    def get_json(self, path: str) -> Any:
        return json.loads(self.get(path)[1])

    def pipeline(self) -> dict[str, Any]:
        return self.get_json("/api/status")["pipelines"][0]

    def lag(self) -> float | None:
        return self.pipeline()["figures"]["lag_seconds"]

    def source_exec(self, *statements: str) -> None:
        with contextlib.closing(self.source.connect(database=self.source_db)) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def target_rows(self, table: str) -> int:
        return int(self.target.query(f"SELECT COUNT(*) FROM `{self.target_db}`.`{table}`")[0][0])

    def target_has(self, table: str) -> bool:
        return bool(self.target.query("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                                      "AND TABLE_NAME = %s", (self.target_db, table)))


class Writer:
    """Inserts into `table` on the source at `rate` transactions a second (autocommit), on a thread."""

    def __init__(self, node: ObservedNode, table: str, rate: float) -> None:
        self.node, self.table, self.rate = node, table, rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self.written = 0
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with contextlib.closing(self.node.source.connect(database=self.node.source_db)) as conn:
                conn.autocommit(True)
                began = time.monotonic()
                with conn.cursor() as cur:
                    while not self._stop.is_set():
                        due = began + self.written / self.rate
                        delay = due - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        cur.execute(f"INSERT INTO `{self.table}` (v) VALUES ('load')")
                        self.written += 1
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self.error is None, f"the writer failed: {self.error}"
