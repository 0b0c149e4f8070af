"""Batch DDL tasks end to end: real MariaDB source and target, the binlog source, the scheduler."""

from __future__ import annotations

import datetime

import pytest

from setl.meta.base import DdlTaskStatus
from tests.ddltask.rig import Rig

pytestmark = pytest.mark.timeout(120)

D19, D20, D21 = (datetime.date(2026, 11, d) for d in (19, 20, 21))
FACT_SOURCE = "CREATE TABLE fact (id INT NOT NULL, day DATE NOT NULL, v INT, PRIMARY KEY (id, day))"
FACT_TARGET = (
    "CREATE TABLE fact (id INT NOT NULL, day DATE NOT NULL, v INT, PRIMARY KEY (id, day))"
    " PARTITION BY RANGE COLUMNS (day) ("
    " PARTITION p20261119 VALUES LESS THAN ('2026-11-20'),"
    " PARTITION p20261120 VALUES LESS THAN ('2026-11-21'),"
    " PARTITION p20261121 VALUES LESS THAN ('2026-11-22'))"
)


def insert_day(day: str, ids, v: int) -> list[tuple]:
    return [("INSERT INTO fact VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE v = VALUES(v)", (i, day, v))
            for i in ids]


@pytest.fixture
def rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    return Rig(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db,
               source_ddl=[FACT_SOURCE], target_ddl=[FACT_TARGET])


def test_rerun_with_overwrite_replaces_the_partition(rig):
    """A daily reload re-run with overwrite: the target holds only the second run's rows."""
    rig.execute_target("INSERT INTO fact VALUES (99, '2026-11-20', 0), (1, '2026-11-19', 7)")
    rig.execute_source(rig.signal("run1", "truncate_partition", "fact", "p20261120", True))
    for chunk in (range(1, 6), range(6, 11)):
        rig.execute_source(*insert_day("2026-11-20", chunk, 1))
    rig.execute_source(rig.signal("run2", "truncate_partition", "fact", "p20261120", True),
                       *insert_day("2026-11-20", range(1, 4), 2))
    rig.execute_source(*insert_day("2026-11-20", range(4, 8), 2))
    rig.run()
    assert rig.rows("fact", "id, day, v") == sorted(
        [(1, D19, 7)] + [(i, D20, 2) for i in range(1, 8)])
    assert rig.statuses() == {"run1": DdlTaskStatus.DEPRECATED, "run2": DdlTaskStatus.SUCCEEDED}
    assert rig.load.actions_run == {"run1": 1, "run2": 1}
