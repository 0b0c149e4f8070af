"""Issue 23 item 3: a start whose meta store knows nothing of the pipeline, on a target that holds a
position under its name (a new pipeline reusing an old name, or a meta store wiped as `rm -rf var/`
does), used to take that position: it skipped the copy and the table creation and ended "caught
up", exit 0, with the target missing rows. It is now refused with one line and exit 2 naming the
position and the two ways on, unless the target's identity record says this very pipeline wrote it
(same source server, same table rules, copy finished: `tests/pipeline/test_identity.py`); here the
rules differ (a new pipeline reusing the name). Taking the position on purpose resumes exactly."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.setl_process import mysql_target
from tests.schema.test_schema import make, position, q, run_source

pytestmark = pytest.mark.timeout(240)


def test_a_position_only_the_target_knows_is_refused_then_taken_on_purpose(
        tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any, mysql_db: str) -> None:
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k VALUES (1, 1), (2, 2)"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    first = setl.start_until_caught_up(timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    run_source(mariadb_source, source_db, ["INSERT INTO k VALUES (3, 3)"])

    setl.meta_path.unlink()  # the meta store is lost; the target keeps the pipeline's position
    setl.config["tables"] = [{"source": rf"{source_db}\.(k)", "target": f"{mysql_db}.{{table}}"}]  # other rules
    setl.write_config()
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("setl: error")]
    assert "already holds a position" in line and "--start" in line and "rules differ" in line, line
    take = re.search(r"`(setl position reset --pipeline \S+ --to \S+)`", line)
    assert take is not None, line
    assert mariadb_target.query(f"SELECT COUNT(*) FROM {q(mysql_db)}.k") == [(2,)]  # nothing written meanwhile

    taken = setl.run(*take.group(1).split()[1:])
    assert taken.returncode == 0, taken.stderr
    resumed = setl.start_until_caught_up(timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    query = "SELECT * FROM {}.k ORDER BY id"
    assert mariadb_target.query(query.format(q(mysql_db))) == mariadb_source.query(query.format(q(source_db)))


def test_starting_afresh_copies_again(tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any,
                                     mysql_db: str) -> None:
    """The other way on: `setl position reset --start` copies the tables again (rows the binlog no
    longer holds arrive), instead of taking the old position."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k VALUES (1, 1)"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    assert setl.start_until_caught_up(timeout=120).returncode == 0
    mariadb_target.query(f"DELETE FROM {q(mysql_db)}.k")  # damaged behind setl's back
    setl.meta_path.unlink()
    setl.config["tables"] = [{"source": rf"{source_db}\.(k)", "target": f"{mysql_db}.{{table}}"}]  # other rules
    setl.write_config()
    assert setl.start_until_caught_up(timeout=120).returncode == 2
    assert setl.run("position", "reset", "--pipeline", setl.name, "--start").returncode == 0
    again = setl.start_until_caught_up(timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert mariadb_target.query(f"SELECT * FROM {q(mysql_db)}.k") == [(1, 1)]


def test_a_crash_between_the_first_load_and_its_ack_resumes(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                            mariadb_target: Any, mysql_db: str) -> None:
    """The meta store has seen the pipeline start (its epoch) but holds no ack when the process dies
    after its first load: the restart takes the target's position, as before (no refusal)."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start=position(mariadb_source))
    run_source(mariadb_source, source_db, ["INSERT INTO k VALUES (1, 1), (2, 2)"])
    setl.faults = '[{"stage": "termin", "action": "crash", "batch": 1}]'
    crashed = setl.start_until_caught_up(timeout=120)
    assert crashed.returncode != 0 and setl.acked() is None, crashed.stderr[-2000:]
    setl.faults = None
    resumed = setl.start_until_caught_up(timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    query = "SELECT * FROM {}.k ORDER BY id"
    assert mariadb_target.query(query.format(q(mysql_db))) == mariadb_source.query(query.format(q(source_db)))
