"""What an operator reads (issue 34, point 8): a broken pipeline file is shown as such, a start
error is said once, and a keyless table's warning says what holds."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys

from setl.sinks.mysql import MysqlLoad
from tests.e2e.replicate import binlog_head, replicate, table_rule
from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target


def test_a_pipeline_whose_file_is_broken_is_listed_as_invalid_with_its_error(tmp_path) -> None:
    """`setl status` lists a pipeline whose file would not start as ``invalid`` with the file's
    error, not as a plain ``stopped``; a good file beside it stays ``stopped``."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {tmp_path / 'meta.db'}}}\n")
    (conf / "pipelines" / "broken.yaml").write_text("source: [unclosed\n")
    (conf / "pipelines" / "good.yaml").write_text("source: {type: mysql}\ntarget: {type: mysql}\n"
                                                  "tables: [{source: 'a\\\\.b', target: 'a.b'}]\n")
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "status", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {row["pipeline"]: row for row in json.loads(result.stdout)}
    assert rows["broken"]["status"] == "invalid" and "invalid YAML" in rows["broken"]["error"]
    assert rows["good"]["status"] == "stopped" and rows["good"]["error"] is None


def test_a_start_error_is_said_once_and_not_repeated_by_the_target_check(tmp_path, mariadb_source, source_db,
                                                                          mariadb_target) -> None:
    """A source that refuses the credentials: the cause appears in the start's warning and in its
    final error line, not a third time from the target tables' check."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY)")
    source = {**mysql_source(mariadb_source), "user": "nobody", "password": "wrong"}
    setl = SetlProcess(tmp_path, source=source, target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\.t", "target": "x.t"}],
                       pipeline={"retry": {"max_elapsed_ms": 1000}})
    result = setl.start_until_caught_up()
    assert result.returncode == 1
    assert result.stderr.count("Access denied for user 'nobody'") == 2, result.stderr
    assert result.stderr.splitlines()[-1].startswith("setl: error: pipeline=")


def test_the_keyless_warning_says_each_change_is_applied_once(tmp_path, mariadb_source, source_db, mariadb_target,
                                                              mysql_db, caplog) -> None:
    """A keyless table's warning says what holds (each change applied once, the position committed
    with the rows), not that a replay duplicates rows."""
    caplog.set_level(logging.WARNING)
    mariadb_source.query(f"CREATE TABLE `{source_db}`.bag (v INT)")
    start = binlog_head(mariadb_source)
    mariadb_source.query(f"INSERT INTO `{source_db}`.bag VALUES (1), (1), (2)")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.bag (v INT)")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="keyless", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.bag", f"{mysql_db}.bag")], load, tmp_path,
              name="keyless")
    warnings = [r.getMessage() for r in caplog.records if "has no primary key" in r.getMessage()]
    assert len(warnings) == 1 and "applied once" in warnings[0] and "again" not in warnings[0], warnings
    assert sorted(mariadb_target.query(f"SELECT v FROM `{mysql_db}`.bag")) == [(1,), (1,), (2,)]


def test_every_check_line_about_a_pipeline_names_it_once(tmp_path) -> None:
    """`setl check` names the pipeline as ``pipeline=NAME`` on every line about it, once, like the
    rest of setl's one-line errors: a good file's lines, a source that refuses the connection, and
    a file with an unknown key."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {tmp_path / 'meta.db'}}}\n")
    with socket.socket() as probe:  # a loopback port nothing listens on: refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (conf / "pipelines" / "p1.yaml").write_text(
        f"source: {{type: mysql, host: 127.0.0.1, port: {port}, user: root, server_id: 77}}\n"
        "target: {type: parquet, path: out}\ntables: [{source: 'a\\\\.b', target: 'a.b'}]\n")
    (conf / "pipelines" / "p2.yaml").write_text("source: {type: mysql, bogus: 1}\ntarget: {type: mysql}\n"
                                                "tables: [{source: 'a\\\\.b', target: 'a.b'}]\n")
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "check", "--all"],
                            capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    by_pipeline = {name: [line for line in lines if f" pipeline={name} " in line] for name in ("p1", "p2")}
    assert len(by_pipeline["p1"]) + len(by_pipeline["p2"]) == len(lines), lines
    assert any(line.startswith("error") and " source: " in line and str(port) in line
               for line in by_pipeline["p1"]), lines
    assert any(line.startswith("error") and " config: " in line and "bogus" in line
               for line in by_pipeline["p2"]), lines
    assert all(line.count("pipeline=") == 1 for line in lines), lines
