"""Conflicts found on a real binlog's row images: a source and a target writing the same rows (docs/conflicts.md)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from setl.config import PipelineSettings
from setl.sinks.conflicts import SOURCE_WON, TARGET_WON, ConflictPolicy, TablePolicy
from setl.sinks.mysql import MysqlLoad
from setl.testing.servers import MariaDBServer
from tests.e2e.replicate import PER_TABLE, SETTINGS, binlog_head, replicate, table_rule

TABLE = ("CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20) COLLATE utf8mb4_general_ci, f FLOAT, dbl DOUBLE, "
         "amount DECIMAL(10,4), at DATETIME(6), stamp TIMESTAMP(3) NULL, c CHAR(5), note TEXT, b VARBINARY(8), "
         "updated_at DATETIME(6) NOT NULL)")
ROWS = [(n, f"Name{n}", 0.1 * n, 1 / 3 * n, f"{n}.0100", f"2024-01-0{n} 10:00:00.00000{n}",
         f"2024-01-0{n} 10:00:00.{n}00", "ab", None if n % 2 else "x ", bytes([n, 0]), "2024-06-01 00:00:00")
        for n in range(1, 7)]


@pytest.mark.parametrize("settings", [SETTINGS, PER_TABLE], ids=["ordered", "per_table"])
def test_target_writes_racing_source_writes_are_found_and_settled(
        mariadb_source: MariaDBServer, source_db: str, mariadb_target: MariaDBServer, mysql_db: str,
        tmp_path: Path, settings: PipelineSettings) -> None:
    """Rows of every comparable type copied from a real binlog, then changed on both sides: only the
    rows the target changed are conflicts (no false one from FLOAT, DOUBLE, DECIMAL, DATETIME(6),
    TIMESTAMP(3), NULL, CHAR or case-insensitive text), each settled by the later updated_at."""
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute(TABLE)
        start = binlog_head(mariadb_source)
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", ROWS)
    mariadb_target.query(f"CREATE TABLE {mysql_db}.t " + TABLE.split(" t ", 1)[1])
    policy = ConflictPolicy("a", "b", {"a": 1, "b": 2}, TablePolicy("last_writer_wins", "updated_at"))

    def load() -> MysqlLoad:
        return MysqlLoad(mariadb_target.target_config(), pipeline="a_to_b", position_schema=mysql_db,
                         conflicts=policy)

    rules = [table_rule(rf"{source_db}\.t", f"{mysql_db}.t")]
    replicate(mariadb_source, start, rules, load(), tmp_path, name="a_to_b", settings=settings)
    # the target (site b) changes rows 2 (later than the source will) and 3 (earlier), by case only for 3
    mariadb_target.query(f"UPDATE {mysql_db}.t SET name = 'b-wins', updated_at = '2024-06-03' WHERE id = 2")
    mariadb_target.query(f"UPDATE {mysql_db}.t SET name = 'NAME3', updated_at = '2024-06-01 00:00:00.5' WHERE id = 3")
    middle = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("UPDATE t SET name = CONCAT(name, '-a'), updated_at = '2024-06-02' WHERE id <= 4")
        cur.execute("DELETE FROM t WHERE id = 5")
    replicate(mariadb_source, middle, rules, load(), tmp_path, name="a_to_b", settings=settings)
    found = mariadb_target.query(f"SELECT row_key, decision, source_row, target_row, policy "
                                 f"FROM {mysql_db}.setl_conflicts ORDER BY id")
    assert [(json.loads(k), d) for k, d, *_ in found] == [([2], TARGET_WON), ([3], SOURCE_WON)]
    assert [json.loads(r[3])["name"] for r in found] == ["b-wins", "NAME3"]
    assert [json.loads(r[2])["name"] for r in found] == ["Name2-a", "Name3-a"]
    names = dict(mariadb_target.query(f"SELECT id, name FROM {mysql_db}.t"))
    assert names == {1: "Name1-a", 2: "b-wins", 3: "Name3-a", 4: "Name4-a", 6: "Name6"}
