"""PostgreSQL names over 63 bytes (issue 26.4): a longer MariaDB name is cut on a UTF-8 character
boundary and suffixed with ``_`` and 8 hex digits of the SHA-1 of the whole name, the same in
table creation, replicated DDL, the load statements, `setl schema` and `setl verify`; two names
sharing their first 63 bytes stay two columns. Proven from a snapshot and from the binlog alone:
inserts, updates, deletes and an ADD COLUMN with a long multi-byte name."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.setl_process import postgres_target
from tests.schema.test_schema import make, pg_rows, position, q, run_source

pytestmark = pytest.mark.timeout(300)

TABLE = "long_" + "x" * 59  # 64 bytes
FIRST, SECOND = "c" * 63 + "1", "c" * 63 + "2"  # equal in their first 63 bytes
ADDED = "é" * 40  # 80 bytes of 2-byte characters


def expected_name(name: str) -> str:
    """The documented rule (docs/sql-targets.md), written out independently of setl's code."""
    raw = name.encode()
    if len(raw) <= 63:
        return name
    prefix = raw[:54]
    while True:  # back off to a character boundary
        try:
            text = prefix.decode()
            break
        except UnicodeDecodeError:
            prefix = prefix[:-1]
    return f"{text}_{hashlib.sha1(raw).hexdigest()[:8]}"


@pytest.mark.parametrize("start", ["snapshot", "binlog"])
def test_long_names_land_under_their_mapped_names(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                  postgres_server: Any, postgres_db: str, start: str) -> None:
    """Two columns sharing 63 bytes, a 64-byte table name and a long ADD COLUMN land under the
    mapped names with the source's rows; `setl schema` and `setl check` show them, `setl verify` agrees."""
    begin = position(mariadb_source)  # binlog: the CREATE TABLE is replicated DDL
    run_source(mariadb_source, source_db, [
        f"CREATE TABLE {q(TABLE)} (id INT PRIMARY KEY, {q(FIRST)} INT, {q(SECOND)} VARCHAR(10))",
        f"INSERT INTO {q(TABLE)} VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c'), (4, 4, 'd'), (5, 5, 'e')",
    ])
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.long_x+", "target": f"{source_db}.{{table}}"}],
                start="snapshot" if start == "snapshot" else begin)
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    run_source(mariadb_source, source_db, [
        f"UPDATE {q(TABLE)} SET {q(FIRST)} = {q(FIRST)} + 10, {q(SECOND)} = 'u' WHERE id <= 2",
        f"DELETE FROM {q(TABLE)} WHERE id = 5",
        f"INSERT INTO {q(TABLE)} VALUES (6, 6, 'f')",
        f"ALTER TABLE {q(TABLE)} ADD COLUMN {q(ADDED)} INT",
        f"INSERT INTO {q(TABLE)} VALUES (7, 7, 'g', 70)",
        f"UPDATE {q(TABLE)} SET {q(ADDED)} = 42 WHERE id = 1",
        f"DELETE FROM {q(TABLE)} WHERE id = 3",
    ])
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]

    table = expected_name(TABLE)
    columns = ["id", *map(expected_name, (FIRST, SECOND, ADDED))]
    assert len(set(columns)) == 4 and all(len(c.encode()) <= 63 for c in columns)
    assert columns[3].startswith("é" * 27 + "_")  # 54 bytes cut on a character boundary
    found = pg_rows(postgres_server, postgres_db, "SELECT column_name FROM information_schema.columns WHERE "
                    "table_schema = %s AND table_name = %s ORDER BY ordinal_position", (source_db, table))
    assert [r[0] for r in found] == columns
    listed = ", ".join('"' + c + '"' for c in columns)
    got = pg_rows(postgres_server, postgres_db, f'SELECT {listed} FROM "{source_db}"."{table}" ORDER BY id')
    want = mariadb_source.query(f"SELECT * FROM {q(source_db)}.{q(TABLE)} ORDER BY id")
    assert got == [tuple(r) for r in want]
    assert [r[0] for r in want] == [1, 2, 4, 6, 7]

    shown = setl.run("schema", "--pipeline", setl.name)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert f"{FIRST!r} -> {columns[1]!r}" in shown.stdout and f"{TABLE!r} -> {table!r}" in shown.stdout, shown.stdout
    checked = setl.run("check", "--pipeline", setl.name)
    assert checked.returncode == 0, (checked.stdout[-3000:], checked.stderr[-3000:])
    assert f"{SECOND!r} -> {columns[2]!r}" in checked.stdout, checked.stdout
    verified = setl.run("verify", "--pipeline", setl.name, "--json")
    assert verified.returncode == 0, (verified.stdout[-3000:], verified.stderr[-3000:])
    assert '"unchecked_columns": {}' in verified.stdout, verified.stdout  # every column compared
