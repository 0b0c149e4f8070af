"""`setl check` (issue 23): everything a start would find wrong, without starting: one line per
finding, exit 1 on an error (or a warning with --strict), and nothing written to the target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.setl_process import mysql_target
from tests.schema.test_schema import make, q, run_source

pytestmark = pytest.mark.timeout(240)


def _lines(result: Any) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.strip()]


def test_a_sound_pipeline_checks_ok_and_nothing_is_written(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                           mariadb_target: Any, mysql_db: str) -> None:
    """Each problem is one line, and the exit code is `setl start`'s for it: 2 for a configuration
    error (a table that does not fit, a filter on a missing column), 1 for a server that refuses."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v VARCHAR(5))"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}])
    result = setl.run("check", "--pipeline", setl.name)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = _lines(result)
    assert [line.split()[0] for line in lines] == ["ok"] * 4, lines
    assert [line.split()[2] for line in lines] == ["config:", "source:", "rules:", "target:"], lines
    assert "mariadb 10." in lines[1] and "1 table(s) planned, 1 to create" in lines[3]
    assert mariadb_target.query(f"SHOW TABLES FROM {q(mysql_db)}") == []  # no table, no position, no fence


def test_each_problem_is_one_line_with_starts_exit_code(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                        mariadb_target: Any, mysql_db: str) -> None:
    """Each problem is one line, and the exit code is `setl start`'s for it: 2 for a configuration
    error (a table that does not fit, a filter on a missing column), 1 for a server that refuses."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v VARCHAR(5))"])
    mariadb_target.query(f"CREATE TABLE {q(mysql_db)}.k (id INT PRIMARY KEY, v DATE)")  # does not fit
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"},
                 {"source": rf"{source_db}\.typo", "target": f"{mysql_db}.{{table}}"}])
    result = setl.run("check", "--pipeline", setl.name)
    assert result.returncode == 2, result.stdout + result.stderr  # a table that does not fit: configuration
    levels = {line.split()[2].rstrip(":"): line.split()[0] for line in _lines(result)}
    assert levels["target"] == "error" and "column 'v'" in result.stdout
    assert "warning" in [line.split()[0] for line in _lines(result) if "matches no source table" in line]

    # a warning alone: exit 0, and 1 with --strict
    mariadb_target.query(f"DROP TABLE {q(mysql_db)}.k")
    assert setl.run("check", "--pipeline", setl.name).returncode == 0
    assert setl.run("check", "--pipeline", setl.name, "--strict").returncode == 1

    # a filter reading a column the table lacks, and a source that refuses the credentials
    setl.config["tables"] = [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}", "filter": "w > 1"}]
    setl.write_config()
    refused = setl.run("check", "--pipeline", setl.name)
    assert refused.returncode == 2 and "error   " in refused.stdout and "'w'" in refused.stdout, refused.stdout
    setl.config["source"] = {**setl.config["source"], "password": "wrong", "user": "nobody"}
    setl.write_config()
    unreachable = setl.run("check", "--all")
    assert unreachable.returncode == 1  # a server that refuses: not the configuration's fault
    assert [line.split()[0] for line in _lines(unreachable)] == ["ok", "error"], unreachable.stdout
