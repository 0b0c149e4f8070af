"""Source tables of every key kind for snapshot tests, a writer that changes them while they are
copied, and comparisons of a source with its MariaDB or PostgreSQL copy."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

#: name -> (MariaDB DDL body, key columns); the target gets the same DDL (MariaDB) or its PG form.
TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ints": ("(id INT NOT NULL PRIMARY KEY, k INT NOT NULL, c VARCHAR(60) NOT NULL)", ("id",)),
    "strs": ("(code VARCHAR(40) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, n INT NOT NULL, "
             "note VARCHAR(60))", ("code",)),
    "comp": ("(a INT NOT NULL, b VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL, v BIGINT NOT NULL, "
             "PRIMARY KEY (a, b))", ("a", "b")),
    "nokey": ("(x INT NOT NULL, y VARCHAR(30) NOT NULL)", ()),
    "empty": ("(id INT NOT NULL PRIMARY KEY, v INT)", ("id",)),
}

PG_TYPES = {"ints": "(id INT PRIMARY KEY, k INT NOT NULL, c VARCHAR(60) NOT NULL)",
            "strs": "(code VARCHAR(40) PRIMARY KEY, n INT NOT NULL, note VARCHAR(60))",
            "comp": "(a INT NOT NULL, b VARCHAR(20) NOT NULL, v BIGINT NOT NULL, PRIMARY KEY (a, b))",
            "nokey": "(x INT NOT NULL, y VARCHAR(30) NOT NULL)",
            "empty": "(id INT PRIMARY KEY, v INT)"}


def _code(n: int) -> str:
    # mixed case: the server's case-insensitive collation orders these, never Python
    word = f"k{n:07d}"
    return "".join(ch.upper() if (n >> i) & 1 else ch for i, ch in enumerate(word))


def create(server: Any, db: str, tables: dict[str, str] | None = None, *, binlog: bool = False) -> None:
    """Create the tables in `db` (kept out of the binlog unless `binlog`)."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            if not binlog:
                cur.execute("SET SESSION sql_log_bin = 0")
            for name, body in (tables or {n: d for n, (d, _) in TABLES.items()}).items():
                cur.execute(f"CREATE TABLE `{name}` {body}")
    finally:
        conn.close()


def fill(server: Any, db: str, rows: int, *, binlog: bool = True) -> None:
    """`rows` rows in ints and strs, rows/2 in comp, rows/10 in nokey; empty stays empty."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            if not binlog:
                cur.execute("SET SESSION sql_log_bin = 0")
            step = 5000
            for start in range(0, rows, step):
                ids = range(start, min(rows, start + step))
                cur.executemany("INSERT INTO ints VALUES (%s, %s, %s)", [(i * 2, i % 97, f"c{i}") for i in ids])
                cur.executemany("INSERT INTO strs VALUES (%s, %s, %s)", [(_code(i * 2), i, None if i % 7 else "n")
                                                                           for i in ids])
                cur.executemany("INSERT INTO comp VALUES (%s, %s, %s)", [(i // 3, _code(i), i) for i in ids if i % 2])
                cur.executemany("INSERT INTO nokey VALUES (%s, %s)", [(i, f"y{i}") for i in ids if i % 10 == 0])
            conn.commit()
    finally:
        conn.close()


class Writer:
    """A thread of inserts, updates, deletes and key changes on every table, in small transactions."""

    def __init__(self, server: Any, db: str, rows: int, seed: int = 7) -> None:
        self.server, self.db, self.rows = server, db, rows
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="snapshot-test-writer", daemon=True)

    def __enter__(self) -> "Writer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the writer did not stop"
        if self.error is not None and exc[0] is None:
            raise AssertionError(f"writer failed: {self.error!r}")

    def _run(self) -> None:
        conn = self.server.connect(database=self.db)
        r = self.random
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    for _ in range(r.randint(1, 4)):
                        n = r.randrange(self.rows * 2)
                        what = r.randrange(10)
                        if what == 0:
                            cur.execute("INSERT IGNORE INTO ints VALUES (%s, 1, 'new')", (n * 2 + 1,))
                        elif what == 1:
                            cur.execute("UPDATE ints SET k = k + 1, c = CONCAT('u', c) WHERE id = %s", (n,))
                        elif what == 2:
                            cur.execute("DELETE FROM ints WHERE id = %s", (n,))
                        elif what == 3:  # a key change
                            cur.execute("UPDATE IGNORE ints SET id = %s WHERE id = %s", (n * 2 + self.rows * 4, n))
                        elif what == 4:
                            cur.execute("INSERT IGNORE INTO strs VALUES (%s, 5, 'w')", (_code(n * 2 + 1),))
                        elif what == 5:
                            cur.execute("UPDATE strs SET n = n + 1 WHERE code = %s", (_code(n).upper(),))
                        elif what == 6:
                            cur.execute("DELETE FROM strs WHERE code = %s", (_code(n).lower(),))
                        elif what == 7:
                            cur.execute("UPDATE comp SET v = v + 1 WHERE a = %s", (n // 3,))
                            cur.execute("UPDATE IGNORE comp SET b = CONCAT(b, 'x') WHERE a = %s LIMIT 1", (n // 6,))
                        elif what == 8:
                            cur.execute("INSERT INTO nokey VALUES (%s, 'w')", (n,))
                            cur.execute("DELETE FROM nokey WHERE x = %s LIMIT 1", (n // 2,))
                        else:
                            cur.execute("INSERT IGNORE INTO empty VALUES (%s, %s)", (n, n))
                            cur.execute("DELETE FROM empty WHERE id = %s", (n // 2,))
                    conn.commit()
                    self.transactions += 1
                    time.sleep(0.002)
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()


def checksums(server: Any, db: str, tables: list[str] | None = None) -> dict[str, Any]:
    """CHECKSUM TABLE of each table (MariaDB)."""
    names = tables or list(TABLES)
    rows = server.query(f"CHECKSUM TABLE {', '.join(f'`{db}`.`{t}`' for t in names)}")
    return {str(name).rsplit(".", 1)[1]: value for name, value in rows}


def row_count(server: Any, db: str) -> int:
    """Rows over every table of `db` (MariaDB)."""
    return sum(int(server.query(f"SELECT COUNT(*) FROM `{db}`.`{name}`")[0][0]) for name in TABLES)


def mariadb_rows(server: Any, db: str, table: str) -> list[tuple]:
    return sorted(server.query(f"SELECT * FROM `{db}`.`{table}`"))


def postgres_rows(server: Any, database: str, schema: str, table: str) -> list[tuple]:
    return sorted(server.query(f'SELECT * FROM "{schema}"."{table}"', dbname=database))
