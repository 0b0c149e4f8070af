"""The issue's case end to end: a source that writes compressed binlog events (`log_bin_compress=ON`)
replicates every row and DDL into MariaDB and PostgreSQL, as an uncompressed one does."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest

from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.testing.servers import MariaDBServer
from tests.e2e.replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(300)


def _write(server: MariaDBServer, db: str) -> None:
    """2,450 rows in 49 transactions, an ALTER TABLE ADD COLUMN between them, updates and deletes."""
    server.query(f"CREATE DATABASE {db}")
    conn = server.connect(database=db, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE users (id INT PRIMARY KEY, name VARCHAR(100), bio TEXT, "
                        "balance DECIMAL(12,2), seen DATETIME(3))")
            for batch in range(49):
                if batch == 25:
                    cur.execute("ALTER TABLE users ADD COLUMN city VARCHAR(40) NOT NULL DEFAULT 'nowhere'")
                cur.executemany("INSERT INTO users (id, name, bio, balance, seen) VALUES (%s, %s, %s, %s, %s)",
                                [(batch * 50 + i, f"user {batch * 50 + i}", "bio " * (i % 30) or None,
                                  decimal.Decimal(f"{i}.{batch:02d}"),
                                  datetime.datetime(2024, 1, 1 + i % 28, 12, 0, 0, 1000 * batch))
                                 for i in range(1, 51)])
                conn.commit()
            cur.execute("UPDATE users SET city = 'Lisbon', balance = balance + 1 WHERE id % 3 = 0")
            cur.execute("DELETE FROM users WHERE id % 11 = 0")
            conn.commit()
    finally:
        conn.close()


def _rows(query: Any, table: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in query(f"SELECT id, name, bio, balance, seen, city FROM {table} ORDER BY id")]


@pytest.mark.parametrize("target", ["mariadb", "postgresql"])
def test_a_compressing_source_replicates_every_row_and_ddl(compressing_mariadb: MariaDBServer, target: str,
                                                           request: Any, tmp_path: Any) -> None:
    """Every row and the ALTER TABLE written as compressed events reach the target: none is skipped."""
    db = f"shop_{target}"
    start = binlog_head(compressing_mariadb)
    _write(compressing_mariadb, db)
    expected = _rows(lambda sql: compressing_mariadb.query(sql), f"{db}.users")
    assert len(expected) == 2450 - 2450 // 11
    if target == "mariadb":
        server = request.getfixturevalue("mariadb_target")
        target_db = request.getfixturevalue("mysql_db")
        load: Any = MysqlLoad(server.target_config(), pipeline="compressed", position_schema=target_db)
        rules = [table_rule(rf"{db}\.users", f"{target_db}.users")]
        replicate(compressing_mariadb, start, rules, load, tmp_path, name="compressed")
        got = _rows(lambda sql: server.query(sql), f"`{target_db}`.users")
    else:
        server = request.getfixturevalue("postgres_server")
        target_db = request.getfixturevalue("postgres_db")
        load = PostgresqlLoad(server.target_config(target_db), pipeline="compressed")
        replicate(compressing_mariadb, start, [table_rule(rf"{db}\.users", "shop.users")], load, tmp_path,
                  name="compressed")
        got = _rows(lambda sql: server.query(sql, dbname=target_db), "shop.users")
    assert got == expected
