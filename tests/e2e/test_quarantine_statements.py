"""A row change logged as a statement (a session with binlog_format=STATEMENT) on a table of a
pipeline under ``on_table_error: quarantine``: setl has no row images for it, so it stops the whole
pipeline at the source, at the end of that transaction, with nothing of the transaction applied and
no table quarantined (docs/quarantine.md, "What quarantines a table")."""

from __future__ import annotations

import contextlib

import pymysql
import pytest

from setl.errors import SourceError
from setl.scheduler import Outcome

from .replicate import binlog_head
from .test_quarantine import (
    TABLES,
    make_mysql_targets,
    make_source,
    mysql_load,
    mysql_target_rows,
    run,
    source_rows,
    write,
)

pytestmark = pytest.mark.timeout(120)


def test_a_row_logged_as_a_statement_stops_the_pipeline_under_quarantine_too(mariadb_source, source_db,
                                                                            mariadb_target, mysql_db, tmp_path):
    """A transaction writing the bad table by statement and the others by rows: under quarantine the
    pipeline pauses with one source line naming the table, the statement's position and the fix; every
    table holds exactly what the source held before that transaction, and nothing is quarantined."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db, bad="v VARCHAR(20)")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    before = {table: source_rows(mariadb_source, source_db, table) for table in TABLES}
    at = binlog_head(mariadb_source)
    with contextlib.closing(pymysql.connect(**mariadb_source.connect_args(autocommit=False))) as conn, \
            conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = STATEMENT")
        cur.execute(f"INSERT INTO `{source_db}`.a VALUES (900, 'row?')")
        cur.execute(f"INSERT INTO `{source_db}`.bad VALUES (900, 'stmt')")
        conn.commit()
    write(mariadb_source, source_db, 100)
    scheduler = run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path,
                    outcome=Outcome.PAUSED)
    error = scheduler.error
    assert isinstance(error, SourceError), error
    text = str(error)
    assert "\n" not in text and "is logged as a statement" in text and "SET GLOBAL binlog_format=ROW" in text, text
    assert f"{source_db}.a" in text and f"{source_db}.bad" in text and f"{at.log}:" in text, text
    rows = mysql_target_rows(mariadb_target, mysql_db)
    for table in TABLES:
        assert rows(table) == before[table], table
    assert mysql_load(mariadb_target, mysql_db).quarantined() == []
