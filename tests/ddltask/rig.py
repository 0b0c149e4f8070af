"""A batch-DDL-task pipeline between the real MariaDB source and target, for the tests here."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pymysql
import yaml

from setl.config import load_node, load_pipeline
from setl.connectors import registry
from setl.ddltask import DdlTaskLoad, DdlTaskPartLoad
from setl.meta import open_meta_store
from setl.meta.base import DdlTaskStatus
from setl.model import Position
from setl.pipeline import Stages, build_stages
from setl.scheduler import Listener, Outcome, Scheduler

_server_ids = itertools.count(8101)

SIGNAL_DDL = (
    "CREATE TABLE setl_signal (task_id VARCHAR(191) NOT NULL PRIMARY KEY, op_type VARCHAR(32) NOT NULL,"
    " op_db VARCHAR(64) NOT NULL, op_table VARCHAR(64) NOT NULL,"
    " op_partition VARCHAR(255) NOT NULL DEFAULT '', overwrite BOOLEAN NOT NULL DEFAULT FALSE)"
)

class Rig:
    """A conf dir with one pipeline `source_db.* -> target_db.*` with batch DDL tasks on.

    Source tables are created with `source_ddl` and target tables with `target_ddl` before the
    pipeline's start position is taken, so the binlog it reads holds only rows.
    """

    def __init__(self, tmp_path: Path, source, target, source_db: str, target_db: str, *,
                 source_ddl: list[str], target_ddl: list[str], max_rows: int = 4,
                 parallelism: int = 3, task_column: str | None = None, retry_attempts: int = 3,
                 load_mode: str = "ordered", zookeeper: str | None = None) -> None:
        self.source, self.target = source, target
        self.source_db, self.target_db = source_db, target_db
        self.name = "ddl" + target_db[-6:]
        self.conf = tmp_path / "conf"
        (self.conf / "pipelines").mkdir(parents=True)
        self.execute_source(SIGNAL_DDL, *source_ddl)
        self.execute_target(*target_ddl)
        file, pos = source.query("SHOW MASTER STATUS")[0][:2]
        if zookeeper:  # an HA pair's shared store, under a root of its own
            self.node_settings = {"meta": {"store": "zookeeper"},
                                  "ha": {"zookeeper": zookeeper, "chroot": f"/{self.name}",
                                         "session_timeout_ms": 1500, "standby_delay_ms": 0}}
        else:
            self.node_settings = {"meta": {"store": "sqlite", "path": str(tmp_path / "meta.db")}}
        (self.conf / "setl.yaml").write_text(yaml.safe_dump({"node": {"id": "n1"}, **self.node_settings}))
        settings: dict[str, Any] = {"signal_table": f"{source_db}.setl_signal"}
        if task_column:
            settings["task_column"] = task_column
        (self.conf / "pipelines" / f"{self.name}.yaml").write_text(yaml.safe_dump({
            "source": {"type": "mysql", "host": source.host, "port": source.port, "user": "root",
                       "server_id": next(_server_ids), "flavor": "mariadb",
                       "start": {"file": file, "pos": int(pos)}},
            "target": {"type": "mysql", "host": target.host, "port": target.port, "user": "root"},
            "tables": [{"source": rf"{source_db}\..*", "target": target_db + ".{table}"}],
            "pipeline": {"parallelism": parallelism, "batch": {"max_rows": max_rows, "max_wait_ms": 50},
                         "load": {"mode": load_mode},
                         "retry": {"max_attempts": retry_attempts, "initial_backoff_ms": 10,
                                   "max_backoff_ms": 50},
                         "ddl_tasks": settings}}))
        self.load_mode = load_mode
        self.meta = open_meta_store(load_node(self.conf))
        self.load: DdlTaskLoad | None = None

    # -- the source job

    def execute_source(self, *statements: str | tuple) -> None:
        """Run `statements` in one source transaction."""
        args = self.source.connect_args(database=self.source_db, autocommit=False)
        with contextlib.closing(pymysql.connect(**args)) as conn:
            with conn.cursor() as cur:
                for statement in statements:
                    if isinstance(statement, tuple):
                        cur.execute(*statement)
                    else:
                        cur.execute(statement)
            conn.commit()

    def execute_target(self, *statements: str) -> None:
        with contextlib.closing(self.target.connect(database=self.target_db)) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def signal(self, task_id: str, op_type: str, table: str, partition: str = "", overwrite: bool = False):
        """The INSERT of one signal row, for `execute_source`."""
        return ("INSERT INTO setl_signal VALUES (%s, %s, %s, %s, %s, %s)",
                (task_id, op_type, self.source_db, table, partition, overwrite))

    # -- running setl

    def stages(self) -> Stages:
        """The pipeline's stages as `setl start` builds them."""
        stages = build_stages(load_node(self.conf), load_pipeline(self.conf, self.name, registry()), self.meta)
        load = getattr(stages.load, "inner", None) if os.environ.get("SETL_FAULTS") else stages.load
        assert isinstance(load, DdlTaskLoad)  # under SETL_FAULTS a FaultyLoad wraps it
        assert isinstance(load, DdlTaskPartLoad) or self.load_mode == "ordered"
        self.load = load
        return stages

    def run(self, expect: Outcome = Outcome.CAUGHT_UP, listener: Listener | None = None) -> Scheduler:
        """Run the pipeline in this process until it has caught up with the source."""
        config = load_pipeline(self.conf, self.name, registry())
        stages = self.stages()
        scheduler = Scheduler(self.name, config.pipeline, stages.select, stages.extract,
                              stages.transform, stages.load, self.meta, node_id="n1",
                              listener=listener)
        stages.load.open()
        try:
            outcome = scheduler.run(until_caught_up=True)
        finally:
            stages.load.close()
        assert outcome is expect, f"pipeline ended {outcome}: {scheduler.error}"
        return scheduler

    def start_process(self, env: dict[str, str] | None = None, node: str = "n1") -> subprocess.Popen:
        """`setl start --until-caught-up` as a subprocess of node `node` (its own conf dir)."""
        conf = self.conf
        if node != "n1":
            conf = self.conf.with_name(f"conf-{node}")
            if not conf.exists():
                conf.mkdir()
                (conf / "pipelines").symlink_to(self.conf / "pipelines")
                (conf / "setl.yaml").write_text(yaml.safe_dump({"node": {"id": node}, **self.node_settings}))
        full = {k: v for k, v in os.environ.items() if k != "SETL_FAULTS"}  # the test's markers only
        full.update(env or {})
        return subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start",
                                 "--pipeline", self.name, "--until-caught-up"], env=full,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # -- what happened

    def rows(self, table: str, columns: str = "*") -> list[tuple]:
        return sorted(self.target.query(f"SELECT {columns} FROM `{self.target_db}`.`{table}`"))

    def statuses(self) -> dict[str, DdlTaskStatus]:
        return {t.task_id: t.status for t in self.meta.ddl_tasks(self.name)}

    def dump(self) -> str:
        return json.dumps([[t.task_id, t.status.value, t.reason] for t in self.meta.ddl_tasks(self.name)])

    def close(self) -> None:
        self.meta.close()

    def source_head(self):
        file, pos = self.source.query("SHOW MASTER STATUS")[0][:2]
        return Position(file, int(pos))
