"""`setl verify` against a running pipeline on real servers: equal tables pass, injected drift of
each kind is found with its exact keys and columns, into MariaDB and into PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator

import pytest

from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, postgres_target, spawned
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(120)

#: every type family the canonical texts cover server-side
TYPES = ("(id INT NOT NULL PRIMARY KEY, i BIGINT, u BIGINT UNSIGNED, d DECIMAL(10,3), s VARCHAR(40), "
         "c CHAR(5), t TEXT, e ENUM('a','b'), dt DATETIME(6), ts TIMESTAMP(6) NULL, dd DATE, tm TIME(3), "
         "b VARBINARY(16), bl BLOB, bt BIT(8), y YEAR)")
#: JSON and DOUBLE: compared in Python (no exact server-side text into PostgreSQL)
DOCS = "(id INT NOT NULL PRIMARY KEY, j JSON, f DOUBLE, st SET('x','y','z'))"
BAG = "(x INT NOT NULL, y VARCHAR(10))"
#: a string key (case-insensitive, mixed case): key ranges into MariaDB, one chunk into PostgreSQL
NAMED = "(code VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)"
ROWS = 40


def fill(server, db: str) -> None:
    conn = server.connect(database=db)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(f"CREATE TABLE types {TYPES}")
        cur.execute(f"CREATE TABLE docs {DOCS}")
        cur.execute(f"CREATE TABLE bag {BAG}")
        cur.execute(f"CREATE TABLE named {NAMED}")
        for n in range(1, ROWS + 1):
            cur.execute("INSERT INTO types VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (n, n * 1000, 2 ** 63 + n, f"{n}.500", None if n == 8 else f"s{n}", f"c{n % 10}",
                         f"text {n}" * 3, "ab"[n % 2], f"2024-01-{n % 28 + 1:02d} 10:00:00.{n:06d}",
                         f"2024-02-{n % 28 + 1:02d} 11:00:00.{n:06d}", f"2020-03-{n % 28 + 1:02d}",
                         f"{n}:30:00.250", bytes([n, 0, 255]), b"\x00blob" * n, n, 2000 + n))
            cur.execute("INSERT INTO docs VALUES (%s, %s, %s, %s)",
                        (n, json.dumps({"n": n, "list": [1, 2.5, "x"]}), n / 3, "x,z" if n % 2 else ""))
            cur.execute("INSERT INTO bag VALUES (%s, %s)", (n % 5, f"y{n % 5}"))
            cur.execute("INSERT INTO named VALUES (%s, %s)", ("".join(ch.upper() if (n >> i) & 1 else ch
                                                                      for i, ch in enumerate(f"key{n}")), n))


def make_setl(tmp_path, source, db: str, target: dict, template: str, server_id: int, tables=None) -> SetlProcess:
    return SetlProcess(tmp_path, source=mysql_source(source, server_id=server_id, start="snapshot",
                                                     snapshot={"chunk_rows": 500}),
                       target=target,
                       tables=tables or [{"source": rf"{re.escape(db)}\..*", "target": template}],
                       pipeline={"parallelism": 2, "batch": {"max_rows": 2000, "max_wait_ms": 50},
                                 "retry": {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 500}})


@contextlib.contextmanager
def running(setl: SetlProcess, source) -> Iterator[None]:
    """`setl start` in the background, its table copies done and caught up with the source's binlog head."""
    with spawned(setl) as proc:
        head = binlog_head(source)

        def caught_up() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            ack = setl.acked()
            if ack is None or ack.position < head:
                return False
            copies = setl.status()["snapshot"]
            return bool(copies) and all(c["status"] == "done" for c in copies)

        wait_until(caught_up, timeout=60, interval=0.2, message=lambda: f"caught up: {setl.logs()[-2000:]}")
        yield
        assert setl.stop(proc) == 0, setl.logs()[-3000:]


def verify(setl: SetlProcess, *args: str) -> tuple[int, dict]:
    result = setl.run("verify", "--pipeline", setl.name, "--json", "--wait-timeout", "30", *args, timeout=90)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return result.returncode, json.loads(result.stdout)


def by_table(report: dict) -> dict[str, dict]:
    return {t["source"].split(".", 1)[1]: t for t in report["tables"]}


MARIADB_DRIFT = [
    "UPDATE {t}named SET v = 0 WHERE code = 'KEY7'",
    "DELETE FROM {t}named WHERE code = 'kEY6'",
    "DELETE FROM {t}types WHERE id = 1",
    "INSERT INTO {t}types (id, i) VALUES (1000, 5)",
    "UPDATE {t}types SET i = i + 1 WHERE id = 2",
    "UPDATE {t}types SET d = d + 0.001 WHERE id = 3",
    "UPDATE {t}types SET t = 'changed' WHERE id = 4",
    "UPDATE {t}types SET dt = dt + INTERVAL 1 MICROSECOND WHERE id = 5",
    "UPDATE {t}types SET b = X'FF' WHERE id = 6",
    "UPDATE {t}types SET s = '' WHERE id = 8",
    "UPDATE {t}types SET s = 's9 ' WHERE id = 9",
    "UPDATE {t}types SET ts = ts - INTERVAL 1 MICROSECOND WHERE id = 11",
    "UPDATE {t}types SET tm = '12:30:00.251' WHERE id = 12",
    "UPDATE {t}types SET bt = 200 WHERE id = 13",
    "UPDATE {t}docs SET j = '{{\"n\": 1, \"list\": [1, 2.5, \"y\"]}}' WHERE id = 1",
    "UPDATE {t}docs SET f = f + 0.000001 WHERE id = 2",
    "UPDATE {t}docs SET st = 'x' WHERE id = 3",
    "INSERT INTO {t}bag VALUES (1, 'y1')",
]

POSTGRES_DRIFT = [
    "UPDATE {t}named SET v = 0 WHERE code = 'KEY7'",
    "DELETE FROM {t}named WHERE code = 'kEY6'",
    "DELETE FROM {t}types WHERE id = 1",
    "INSERT INTO {t}types (id, i) VALUES (1000, 5)",
    "UPDATE {t}types SET i = i + 1 WHERE id = 2",
    "UPDATE {t}types SET d = d + 0.001 WHERE id = 3",
    "UPDATE {t}types SET t = 'changed' WHERE id = 4",
    "UPDATE {t}types SET dt = dt + interval '1 microsecond' WHERE id = 5",
    "UPDATE {t}types SET b = '\\xff'::bytea WHERE id = 6",
    "UPDATE {t}types SET s = '' WHERE id = 8",
    "UPDATE {t}types SET s = 's9 ' WHERE id = 9",
    "UPDATE {t}types SET c = 'c0 ' WHERE id = 10",
    "UPDATE {t}types SET ts = ts - interval '1 microsecond' WHERE id = 11",
    "UPDATE {t}types SET tm = interval '12:30:00.251' WHERE id = 12",
    "UPDATE {t}types SET bt = 200 WHERE id = 13",
    "UPDATE {t}docs SET j = '{{\"n\": 1, \"list\": [1, 2.5, \"y\"]}}'::jsonb WHERE id = 1",
    "UPDATE {t}docs SET f = f + 0.000001 WHERE id = 2",
    "UPDATE {t}docs SET st = 'x' WHERE id = 3",
    "INSERT INTO {t}bag VALUES (1, 'y1')",
]


def check_drift(report: dict, postgres: bool) -> None:
    tables = by_table(report)
    types, docs, bag = tables["types"], tables["docs"], tables["bag"]
    assert types["mode"] == "sql", types
    assert docs["mode"] == "python", docs
    assert types["missing"] == [{"key": {"id": "1"}}]
    assert types["extra"] == [{"key": {"id": "1000"}}]
    expected = {"2": ["i"], "3": ["d"], "4": ["t"], "5": ["dt"], "6": ["b"], "8": ["s"], "9": ["s"], "11": ["ts"],
                "12": ["tm"], "13": ["bt"]}
    if postgres:
        expected["10"] = ["c"]
    assert {d["key"]["id"]: d["columns"] for d in types["different"]} == expected
    assert {d["key"]["id"]: d["columns"] for d in docs["different"]} == {"1": ["j"], "2": ["f"], "3": ["st"]}
    assert docs["missing"] == docs["extra"] == []
    assert bag["missing"] == []
    assert bag["extra"] == [{"row": {"x": "1", "y": "y1"}, "count": 1}]
    assert types["unsettled"] == docs["unsettled"] == bag["unsettled"] == []
    named = tables["named"]
    assert named["different"] == [{"key": {"code": "KEY7"}, "columns": ["v"]}]
    assert named["missing"] == [{"key": {"code": "kEY6"}}] and named["extra"] == []
    assert named["chunks"] == (1 if postgres else 3)
    assert types["rows"] == ROWS and types["chunks"] >= 2


def test_verify_mariadb_target(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """Equal tables verify equal (exit 0); then every kind of drift written into the MariaDB target is
    reported with its exact key and columns (exit 1)."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2201)
    with running(setl, mariadb_source):
        code, report = verify(setl, "--chunk-rows", "15")
        assert code == 0 and report["equal"], report
        assert sum(t["rows"] for t in report["tables"]) == 4 * ROWS
        conn = mariadb_target.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            for statement in MARIADB_DRIFT:
                cur.execute(statement.format(t=f"`{mysql_db}`."))
        code, report = verify(setl, "--chunk-rows", "15")
    assert code == 1
    check_drift(report, postgres=False)


def test_verify_postgresql_target(tmp_path, mariadb_source, postgres_server, source_db, postgres_db):
    """The same into PostgreSQL: server-side texts from the type mapping, and a trailing-space CHAR."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                     f"{source_db}.{{table}}", server_id=2202)
    with running(setl, mariadb_source):
        code, report = verify(setl, "--chunk-rows", "15")
        assert code == 0 and report["equal"], report
        for statement in POSTGRES_DRIFT:
            postgres_server.query(statement.format(t=f'"{source_db}".'), dbname=postgres_db)
        code, report = verify(setl, "--chunk-rows", "15")
    assert code == 1
    check_drift(report, postgres=True)


def test_mariadb_row_text_from_plain_columns_equals_the_one_from_their_texts(mariadb_source, source_db):
    """`mariadb.plain_sql`: testing and measuring a column itself instead of its text gives the same
    row text, byte for byte, for NULLs, '' and values in several character sets (4-byte characters,
    latin1, sjis, a ``|`` inside a value, trailing spaces), sets, numbers and byte strings."""
    from setl.verify import mariadb

    columns = {"id": "int", "a": "varchar", "l": "char", "j": "varchar", "t": "text", "e": "enum", "st": "set",
               "u": "bigint", "d": "decimal", "f": "float", "g": "double", "b": "varbinary", "bl": "blob",
               "k": "tinyint"}
    conn = mariadb_source.connect(database=source_db)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE TABLE plain (id INT NOT NULL PRIMARY KEY, a VARCHAR(20) CHARACTER SET utf8mb4,"
                    " l CHAR(8) CHARACTER SET latin1, j VARCHAR(10) CHARACTER SET sjis, t TEXT,"
                    " e ENUM('x','|y'), st SET('p','q'), u BIGINT UNSIGNED, d DECIMAL(65,30), f FLOAT, g DOUBLE,"
                    " b VARBINARY(8), bl BLOB, k TINYINT)")
        rows = [
            (1, None, None, None, None, None, None, None, None, None, None, None, None, None),
            (2, "", "", "", "", "x", "", 0, "0", 0, 0, b"", b"", 0),
            (3, "emoji \U0001F600|x", "caf\u00e9  ", "\u30c6\u30b9\u30c8", "a|b,c", "|y", "p,q", 2 ** 64 - 1,
             "-1.000000000000000000000000000001", -1.5, 1e300, b"\x00|\xff", b"\x00" * 300, -128),
        ]
        for row in rows:
            cur.execute(f"INSERT INTO plain VALUES ({', '.join(['%s'] * len(row))})", row)
        names = list(columns)
        texts = [mariadb.text_sql(kind, kind, mariadb.quote(name)) for name, kind in columns.items()]
        plain = [mariadb.plain_sql(kind, mariadb.quote(name)) for name, kind in columns.items()]
        assert all(texts) and sum(p is not None for p in plain) == len(names)
        counted = [kind in ("varchar", "char", "text", "enum", "set") for kind in columns.values()]
        before, after = mariadb.row_sql(texts, counted), mariadb.row_sql(texts, counted, plain)
        assert before != after
        cur.execute(f"SELECT id, BINARY {before}, BINARY {after} FROM plain ORDER BY id".replace("%%", "%"))
        found = cur.fetchall()
    assert [r[0] for r in found] == [1, 2, 3]
    for id_, want, got in found:
        assert got == want, (id_, want, got)
