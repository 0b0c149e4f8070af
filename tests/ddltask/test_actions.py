"""Pre-write actions on a real MariaDB target, each run twice (the redo after a kill -9), and the
checks on signal rows and settings."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from setl.config import PipelineConfig
from setl.ddltask import MysqlActions, Signal
from setl.errors import ConfigError, LoadError
from setl.meta.base import DdlTask
from setl.model import Position
from setl.pipeline import build_actions
from setl.scheduler import Outcome
from setl.sinks.parquet import ParquetTargetConfig
from setl.sinks.sqlite import SqliteTargetConfig
from tests.ddltask.rig import Rig

pytestmark = pytest.mark.timeout(60)

AT = Position("mysql-bin.000001", 4)
TABLE = ("CREATE TABLE t (id INT NOT NULL, day INT NOT NULL, PRIMARY KEY (id, day))"
         " PARTITION BY RANGE (day) (PARTITION p1 VALUES LESS THAN (2), PARTITION p2 VALUES LESS THAN (3))")


@pytest.fixture
def target(mariadb_target, mysql_db):
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.t " + TABLE.removeprefix("CREATE TABLE t "))
    mariadb_target.query(f"INSERT INTO `{mysql_db}`.t VALUES (1, 1), (2, 1), (3, 2), (4, 2)")
    actions = MysqlActions(mariadb_target.target_config(), pipeline="p")
    try:
        yield mariadb_target, mysql_db, actions
    finally:
        actions.close()


def state(server, db: str) -> tuple[list, list]:
    rows = sorted(server.query(f"SELECT id, day FROM `{db}`.t"))
    parts = [r[0] for r in server.query(
        "SELECT partition_name FROM information_schema.partitions WHERE table_schema = %s AND table_name = 't'"
        " ORDER BY partition_ordinal_position", (db,))]
    return rows, parts


@pytest.mark.parametrize("op_type, partition, rows, parts", [
    ("truncate_table", "", [], ["p1", "p2"]),
    ("truncate_partition", "p1", [(3, 2), (4, 2)], ["p1", "p2"]),
    ("drop_partition", "p2", [(1, 1), (2, 1)], ["p1"]),
    ("add_range_partition", "p3:4", [(1, 1), (2, 1), (3, 2), (4, 2)], ["p1", "p2", "p3"]),
    ("delete_where", "day = 2", [(1, 1), (2, 1)], ["p1", "p2"]),
    ("none", "anything", [(1, 1), (2, 1), (3, 2), (4, 2)], ["p1", "p2"]),
])
def test_each_action_and_its_redo(target, op_type, partition, rows, parts):
    """Each op does what the docs say, and running it a second time leaves the same target."""
    server, db, actions = target
    task = DdlTask("p", "t1", op_type, db, "t", AT, op_partition=partition)
    actions.run(task)
    assert state(server, db) == (rows, parts)
    actions.run(task)
    assert state(server, db) == (rows, parts)


def test_an_action_the_target_refuses_is_a_load_error_naming_the_table(target):
    """A partition that does not exist is a LoadError with the MySQL message and the table."""
    server, db, actions = target
    with pytest.raises(LoadError) as info:
        actions.run(DdlTask("p", "t1", "truncate_partition", db, "t", AT, op_partition="p9"))
    assert f"table={db}.t" in str(info.value) and "MySQL error" in str(info.value)


@pytest.mark.parametrize("row, problem", [
    ({"task_id": "x", "op_type": "drop_table", "op_db": "d", "op_table": "t"}, "op_type 'drop_table'"),
    ({"task_id": "", "op_type": "none", "op_db": "d", "op_table": "t"}, "task_id is empty"),
    ({"task_id": "x", "op_type": "truncate_table", "op_db": "d", "op_table": "t", "op_partition": "p1"},
     "takes no op_partition"),
    ({"task_id": "x", "op_type": "drop_partition", "op_db": "d", "op_table": "t", "op_partition": "p 1"},
     "needs a partition name"),
    ({"task_id": "x", "op_type": "add_range_partition", "op_db": "d", "op_table": "t", "op_partition": "p1"},
     "NAME:BOUND"),
    ({"task_id": "x", "op_type": "delete_where", "op_db": "d", "op_table": "t", "op_partition": "day"},
     "COLUMN=VALUE"),
])
def test_bad_signal_rows_are_refused_with_the_reason(row, problem):
    """A malformed signal row is a ValueError saying what is wrong."""
    with pytest.raises(ValueError, match=problem):
        Signal.from_row(row, AT)


def test_a_signal_row_parses_bytes_and_flags():
    """Bytes values are text, op_type is case-insensitive, overwrite takes 1/'true'."""
    signal = Signal.from_row({"task_id": b"r1", "op_type": "TRUNCATE_PARTITION", "op_db": "d", "op_table": "t",
                              "op_partition": "p1", "overwrite": 1}, AT)
    assert (signal.task_id, signal.op_type, signal.overwrite) == ("r1", "truncate_partition", True)


@pytest.mark.parametrize("target_config", [SqliteTargetConfig("sqlite", "x.db"),
                                           ParquetTargetConfig("parquet", "out")])
def test_targets_without_actions_are_refused_at_start(target_config):
    """Only MySQL targets have actions: others are a ConfigError naming the pipeline."""
    from setl.sources.file import FileSourceConfig

    config = PipelineConfig(name="p", source=FileSourceConfig("file", "in.jsonl"), target=target_config,
                            file="pipelines/p.yaml")
    with pytest.raises(ConfigError, match="has no pre-write actions"):
        build_actions(config)


def test_a_bad_signal_row_pauses_the_pipeline_naming_table_and_position(tmp_path, mariadb_source, mariadb_target,
                                                                       source_db, mysql_db):
    """A signal with an unknown op pauses the pipeline (after retries) and loads none of its rows."""
    rig = Rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db,
              source_ddl=["CREATE TABLE f (id INT PRIMARY KEY)"], target_ddl=["CREATE TABLE f (id INT PRIMARY KEY)"],
              retry_attempts=2)
    rig.execute_source(rig.signal("x", "drop_table", "f"), "INSERT INTO f VALUES (1)")
    scheduler = rig.run(expect=Outcome.PAUSED)
    message = str(scheduler.error)
    assert "stage=select" in message and f"table={source_db}.setl_signal" in message
    assert "position=mysql-bin." in message and "op_type 'drop_table'" in message
    assert rig.rows("f") == []
    assert rig.meta.state(rig.name).error == message


@pytest.mark.parametrize("settings, problem", [
    ({"signal_table": "nodot"}, "pipeline.ddl_tasks.signal_table: expected schema.table, got 'nodot'"),
    ({"signal_table": "a.b", "nope": 1}, "pipeline.ddl_tasks.nope: unknown key"),
])
def test_bad_ddl_task_settings_exit_2_with_one_line(tmp_path, settings, problem):
    """A bad pipeline.ddl_tasks setting stops `setl start` with exit code 2 and one line naming it."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"path": str(tmp_path / "meta.db")}}))
    (conf / "pipelines" / "p.yaml").write_text(yaml.safe_dump({
        "source": {"type": "mysql", "port": 1}, "target": {"type": "mysql", "port": 1},
        "pipeline": {"ddl_tasks": settings}}))
    done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", "p"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert problem in done.stderr and len(done.stderr.strip().splitlines()) == 1
