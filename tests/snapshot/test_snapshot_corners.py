"""A snapshot of the tables real databases hold: dots and `%` in names, zero and partial dates,
generated columns, duplicate rows in a keyless table, every awkward type, a MyISAM table next to
InnoDB ones; copied into an empty MariaDB (tables created) under writes, equal to the source."""

from __future__ import annotations

import json

import pytest

from tests.e2e.setl_process import mysql_target, postgres_target, spawned
from tests.helpers.wait import wait_until
from tests.snapshot.test_snapshot_e2e import make_setl, run_until_caught_up

pytestmark = pytest.mark.timeout(300)

TABLES = {
    "we.ird%t": "(id INT PRIMARY KEY, v VARCHAR(20))",
    "dates": "(id INT PRIMARY KEY, d DATE, dt DATETIME, ts TIMESTAMP NULL)",
    "gen": "(id INT PRIMARY KEY, a INT NOT NULL, v INT AS (a * 2) VIRTUAL, s INT AS (a + 1) STORED)",
    "dups": "(x INT, y VARCHAR(10))",
    "kinds": ("(id BIGINT UNSIGNED PRIMARY KEY, b BIT(10), st SET('a','b','c'), e ENUM('x','y'), j JSON, "
              "bl BLOB, dc DECIMAL(30,10), f FLOAT, dbl DOUBLE, t TIME(6), ts6 TIMESTAMP(6) NULL, yr YEAR, "
              "ch CHAR(3) CHARACTER SET latin1, u TEXT CHARACTER SET utf8mb4)"),
    "legacy": "(id INT PRIMARY KEY, v VARCHAR(10)) ENGINE=MyISAM",
}


def _fill(server, db: str) -> None:
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("SET SESSION sql_mode = ''")  # zero and partial dates, as old databases hold them
            for name, body in TABLES.items():
                cur.execute(f"CREATE TABLE `{name}` {body}")
            cur.executemany("INSERT INTO `we.ird%%t` VALUES (%s, %s)", [(i, f"v{i}%.") for i in range(3000)])
            cur.execute("INSERT INTO dates VALUES (1, '0000-00-00', '0000-00-00 00:00:00', NULL), "
                        "(2, '2024-00-15', '2024-02-00 10:00:00', '2024-01-01 00:00:01'), "
                        "(3, '2024-02-29', '9999-12-31 23:59:59', '2038-01-19 03:14:07')")
            cur.executemany("INSERT INTO gen (id, a) VALUES (%s, %s)", [(i, i * 3) for i in range(2000)])
            cur.executemany("INSERT INTO dups VALUES (%s, %s)", [(i % 50, "same") for i in range(1500)])
            cur.execute("INSERT INTO kinds VALUES (18446744073709551615, b'1010101010', 'a,c', 'y', "
                        "'{\"k\": [1, 2.5, null]}', x'00ff00', 12345678901234567890.0123456789, 1.5, "
                        "-2.25e-300, '-838:59:59.000000', '2024-01-01 00:00:00.123456', 2155, 'abc', 'ünï 😀'), "
                        "(0, b'0', '', 'x', NULL, '', -0.0000000001, 0, 0, '00:00:00', NULL, 1901, '', ''), "
                        "(7, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
            cur.executemany("INSERT INTO legacy VALUES (%s, %s)", [(i, f"m{i}") for i in range(500)])
        conn.commit()
    finally:
        conn.close()


def _write(server, db: str, round_: int) -> None:
    """Changes to every table, in the binlog (while the copy runs, and after it)."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            base = 10_000 + round_ * 10
            cur.execute("INSERT INTO `we.ird%%t` VALUES (%s, 'new%%')", (base,))
            cur.execute("UPDATE `we.ird%%t` SET v = CONCAT(v, '.') WHERE id = %s", (round_ % 3000,))
            cur.execute("UPDATE dates SET d = '0000-00-00' WHERE id = 3")
            cur.execute("UPDATE gen SET a = a + 1 WHERE id = %s", (round_ % 2000,))
            cur.execute("INSERT INTO dups VALUES (%s, 'same')", (round_ % 50,))
            cur.execute("UPDATE kinds SET st = 'b', yr = 2000 + %s WHERE id = 0", (round_ % 100,))
            cur.execute("UPDATE legacy SET v = 'changed' WHERE id = %s", (round_ % 500,))
        conn.commit()
    finally:
        conn.close()


def test_awkward_tables_copied_into_an_empty_mariadb(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    _fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2121, chunk_rows=400)
    rounds = 0
    with spawned(setl) as proc:
        def copied() -> bool:
            nonlocal rounds
            assert proc.poll() is None, setl.logs()[-3000:]
            _write(mariadb_source, source_db, rounds)
            rounds += 1
            row = setl.status()
            return bool(row["snapshot"]) and all(s["status"] == "done" for s in row["snapshot"])

        wait_until(copied, timeout=180, interval=0.05, message=lambda: f"snapshot done: {setl.status()}")
        assert setl.stop(proc) == 0
    for extra in range(5):
        _write(mariadb_source, source_db, rounds + extra)
    run_until_caught_up(setl)
    for name in TABLES:
        table = f"`{name}`"
        columns = "*" if name != "gen" else "id, a, v, s"
        source = sorted(mariadb_source.query(f"SELECT {columns} FROM `{source_db}`.{table}"), key=repr)
        target = sorted(mariadb_target.query(f"SELECT {columns} FROM `{mysql_db}`.{table}"), key=repr)
        assert source == target, name
        assert source, name
    # created, not hand-written: generated columns become plain columns holding the source's values
    # (docs/schema.md), checked above row by row
    (extra,) = mariadb_target.query(f"SELECT EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{mysql_db}' "
                                    "AND TABLE_NAME = 'gen' AND COLUMN_NAME = 'v'")[0]
    assert "GENERATED" not in str(extra).upper()


def test_names_generated_columns_and_duplicates_into_an_empty_postgresql(tmp_path, mariadb_source, postgres_server,
                                                                         source_db, postgres_db):
    """The same awkward names, generated columns and duplicate keyless rows into PostgreSQL (tables
    created): equal row by row."""
    names = ("we.ird%t", "gen", "dups")
    conn = mariadb_source.connect(database=source_db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            for name in names:
                cur.execute(f"CREATE TABLE `{name}` {TABLES[name]}")
            cur.executemany("INSERT INTO `we.ird%%t` VALUES (%s, %s)", [(i, f"v{i}%.") for i in range(3000)])
            cur.executemany("INSERT INTO gen (id, a) VALUES (%s, %s)", [(i, i * 3) for i in range(2000)])
            cur.executemany("INSERT INTO dups VALUES (%s, %s)", [(i % 50, "same") for i in range(1500)])
            cur.execute("SET SESSION sql_log_bin = 1")
        conn.commit()
        setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                         f"{source_db}.{{table}}", server_id=2122, chunk_rows=400)
        with conn.cursor() as cur:  # changes in the binlog before the start: the copy already holds them
            cur.execute("UPDATE `we.ird%%t` SET v = 'before' WHERE id < %s", (10,))
            cur.execute("INSERT INTO dups VALUES (1, 'same')")
        conn.commit()
        run_until_caught_up(setl)
        with conn.cursor() as cur:  # and after the copy, through the binlog
            cur.execute("UPDATE gen SET a = a + 1 WHERE id < %s", (100,))
            cur.execute("DELETE FROM dups WHERE x = 2 LIMIT 1")
            cur.execute("INSERT INTO `we.ird%%t` VALUES (%s, 'after%%')", (5000,))
        conn.commit()
    finally:
        conn.close()
    run_until_caught_up(setl)
    for name in names:
        columns = "*" if name != "gen" else "id, a, v, s"
        pg_columns = "*" if name != "gen" else "id, a, v, s"
        source = sorted(mariadb_source.query(f"SELECT {columns} FROM `{source_db}`.`{name}`"))
        target = sorted(postgres_server.query(f'SELECT {pg_columns} FROM "{source_db}"."{name}"', dbname=postgres_db))
        assert source and source == [tuple(row) for row in target], name


def test_a_keyless_myisam_table_written_as_its_read_begins_is_copied_again(tmp_path, mariadb_source,
                                                                          mariadb_target, source_db, mysql_db):
    """A consistent snapshot does not cover MyISAM: a keyless MyISAM table's read sees the writes
    committed after its snapshot position and before its SELECT, which the binlog replays too. The
    `snapshot_read` failpoint holds the read there while rows are inserted: setl sees the write in
    that window, copies the table again, and no row arrives twice."""
    conn = mariadb_source.connect(database=source_db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("CREATE TABLE mk (x INT, y VARCHAR(20)) ENGINE=MyISAM")
            cur.executemany("INSERT INTO mk VALUES (%s, %s)", [(i % 100, "old") for i in range(3000)])
        conn.commit()
    finally:
        conn.close()
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2123, chunk_rows=400)
    setl.faults = json.dumps([{"stage": "snapshot_read", "action": "slow", "seconds": 4, "times": 1}])
    with spawned(setl) as proc:
        def reading() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            return "failpoint snapshot_read: sleeping" in setl.logs()

        # the read has its snapshot position and sleeps 4 s before its SELECT
        wait_until(reading, timeout=60, interval=0.05, message=lambda: setl.logs()[-3000:])
        mariadb_source.query(f"INSERT INTO `{source_db}`.mk VALUES (7, 'during'), (7, 'during'), (8, 'during')")

        def copied() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            row = setl.status()
            return bool(row["snapshot"]) and all(s["status"] == "done" for s in row["snapshot"])

        wait_until(copied, timeout=120, interval=0.2, message=lambda: f"{setl.status()} {setl.logs()[-3000:]}")
        assert setl.stop(proc) == 0
    run_until_caught_up(setl)
    source = sorted(mariadb_source.query(f"SELECT * FROM `{source_db}`.mk"))
    target = sorted(mariadb_target.query(f"SELECT * FROM `{mysql_db}`.mk"))
    assert len(source) == 3003 and source == target
    assert "was written while its snapshot read began" in setl.logs(), setl.logs()[-3000:]
