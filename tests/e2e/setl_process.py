"""`setl` as an operator runs it, for end-to-end tests: a temp conf dir holding one pipeline, and
the CLI as a subprocess on it (logs go to files, so a long run never blocks on a full pipe)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from setl.meta import SqliteMetaStore
from setl.model import Ack, Position


def mysql_source(server: Any, *, server_id: int = 1500, start: Any = "earliest", **extra: Any) -> dict:
    """The `source:` mapping for reading `server`'s binlog as root."""
    return {"type": "mysql", "host": server.host, "port": server.port, "user": server.user,
            "password": server.password, "server_id": server_id, "start": start, **extra}


def mysql_target(server: Any, **extra: Any) -> dict:
    return {"type": "mysql", "host": server.host, "port": server.port, "user": server.user,
            "password": server.password, **extra}


def postgres_target(server: Any, database: str) -> dict:
    return {"type": "postgresql", "host": server.host, "port": server.port, "user": server.user,
            "database": database}


def binlog_head(server: Any) -> Position:
    """The source's current binlog end (``SHOW MASTER STATUS``)."""
    log, offset = server.query("SHOW MASTER STATUS")[0][:2]
    return Position(log, int(offset))


class SetlProcess:
    """One pipeline `name` in `root/conf`, with its SQLite meta store in `root`.

    The name is unique by default: a SQL target keeps each pipeline's position in its own
    ``setl.setl_position`` row, which a later test on the same server must not inherit.

    `run` runs a command to its end; `spawn` starts one in the background (`stop` ends it).
    Each spawned process logs to its own file under `root`; `logs()` reads them all.
    """

    def __init__(self, root: Path, *, source: dict, target: dict, tables: list[dict],
                 pipeline: dict | None = None, name: str | None = None) -> None:
        self.root = root
        self.name = name or f"p{uuid.uuid4().hex[:10]}"
        self.faults: str | None = None  # SETL_FAULTS for the processes it starts (None: none)
        self.conf = root / "conf"
        (self.conf / "pipelines").mkdir(parents=True, exist_ok=True)
        self.meta_path = root / "meta.db"
        self.config = {"source": source, "target": target, "tables": tables,
                       "pipeline": pipeline or {"parallelism": 3,
                                                "batch": {"max_rows": 2000, "max_wait_ms": 50},
                                                "retry": {"max_attempts": 3, "initial_backoff_ms": 50,
                                                          "max_backoff_ms": 500}}}
        (self.conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite",
                                                                       "path": str(self.meta_path)}}))
        self.write_config()
        self._spawned = 0

    @property
    def config_path(self) -> Path:
        return self.conf / "pipelines" / f"{self.name}.yaml"

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, "-m", "setl.cli", "--conf", str(self.conf), *args]

    def _env(self) -> dict[str, str]:
        """The test's environment, with this process's failpoints only (`faults`: SETL_FAULTS JSON)."""
        env = dict(os.environ)
        env.pop("SETL_FAULTS", None)
        if self.faults:
            env["SETL_FAULTS"] = self.faults
        return env

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`setl ARGS`, to its end. A run past `timeout` fails the test with the end of what the
        process printed and every thread's stack (SIGUSR1: `setl start` registers faulthandler),
        so a wait is visible instead of a bare timeout."""
        proc = subprocess.Popen(self._argv(args), env=self._env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGUSR1)
            try:
                stdout, stderr = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            else:
                if proc.poll() is None:
                    proc.kill()
            raise AssertionError(f"setl {' '.join(args)} ran past {timeout}s; its output ends with:\n"
                                 f"{(stderr or '')[-12000:]}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def start_until_caught_up(self, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run("start", "--pipeline", self.name, "--until-caught-up", timeout=timeout)

    def spawn(self, *args: str) -> subprocess.Popen:
        """`setl start --pipeline NAME` (or `args`) in the background, logging to a file."""
        self._spawned += 1
        log = open(self.root / f"setl-{self._spawned}.log", "w")
        with log:
            return subprocess.Popen(self._argv(args or ("start", "--pipeline", self.name)), env=self._env(),
                                    stdout=log, stderr=subprocess.STDOUT, text=True)

    @staticmethod
    def stop(proc: subprocess.Popen, timeout: float = 30) -> int:
        """SIGTERM `proc` and return its exit code (SIGKILL if it does not end in `timeout`)."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait(10)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob("setl-*.log")))

    def acked(self) -> Ack | None:
        if not self.meta_path.exists():
            return None
        meta = SqliteMetaStore(self.meta_path)
        try:
            return meta.position(self.name)
        finally:
            meta.close()

    def liveness_figures(self) -> dict | None:
        """The figures the running process last published with its liveness beat, None before one."""
        if not self.meta_path.exists():
            return None
        meta = SqliteMetaStore(self.meta_path)
        try:
            live = meta.liveness(self.name)
            return dict(live.figures) if live is not None else None
        finally:
            meta.close()

    def status(self) -> dict:
        result = self.run("status", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)[0]


@contextlib.contextmanager
def spawned(setl: SetlProcess, *args: str):
    """A background `setl start` that is stopped (SIGTERM, then SIGKILL) however the block ends."""
    proc = setl.spawn(*args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
