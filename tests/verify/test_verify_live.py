"""`setl verify` while the pipeline replicates a steady write load: no false difference."""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading

import pytest

from tests.e2e.setl_process import mysql_target, postgres_target
from tests.helpers.wait import wait_until
from tests.verify.test_verify import make_setl, running, verify

pytestmark = pytest.mark.timeout(150)

ROWS = 3000


class Writer:
    """Updates, inserts and deletes in small transactions, as fast as one connection goes (bounded)."""

    def __init__(self, server, db: str) -> None:
        self.server, self.db = server, db
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="verify-test-writer", daemon=True)

    def _run(self) -> None:
        rng = random.Random(3)
        try:
            conn = self.server.connect(database=self.db, autocommit=False)
            with contextlib.closing(conn), conn.cursor() as cur:
                while not self.stop.is_set():
                    for _ in range(3):
                        n = rng.randrange(1, ROWS * 2)
                        kind = rng.random()
                        if kind < 0.7:
                            cur.execute("UPDATE hot SET v = v + 1, t = NOW(6) WHERE id = %s", (n,))
                        elif kind < 0.85:
                            cur.execute("REPLACE INTO hot VALUES (%s, %s, NOW(6), %s)", (n, n, f"r{n}"))
                        else:
                            cur.execute("DELETE FROM hot WHERE id = %s", (n,))
                        cur.execute("INSERT INTO log VALUES (%s, %s)", (n, rng.randrange(5)))
                    conn.commit()
                    self.transactions += 1
                    self.stop.wait(0.004)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


@pytest.mark.parametrize("into", ["postgresql", "mariadb"])
def test_verify_under_write_load_reports_no_false_difference(request, tmp_path, mariadb_source, source_db, into):
    """Three verify runs (keyed table in chunks, keyless log table) while a writer changes the rows and the
    pipeline replicates them into PostgreSQL or MariaDB: every run equal, nothing unsettled."""
    conn = mariadb_source.connect(database=source_db)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE TABLE hot (id INT NOT NULL PRIMARY KEY, v INT NOT NULL, t DATETIME(6), s VARCHAR(20))")
        cur.execute("CREATE TABLE log (n INT NOT NULL, k INT NOT NULL)")
        cur.executemany("INSERT INTO hot VALUES (%s, %s, NOW(6), %s)", [(n, n, f"s{n}") for n in range(1, ROWS + 1)])
    if into == "postgresql":
        target = postgres_target(request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db"))
        template = f"{source_db}.{{table}}"
    else:
        server = request.getfixturevalue("mariadb_target")
        target, template = mysql_target(server), f"{request.getfixturevalue('mysql_db')}.{{table}}"
    setl = make_setl(tmp_path, mariadb_source, source_db, target, template, server_id=2204,
                     tables=[{"source": rf"{re.escape(source_db)}\..*", "target": template}])
    with running(setl, mariadb_source):
        writer = Writer(mariadb_source, source_db)
        writer.thread.start()
        try:
            wait_until(lambda: writer.transactions > 50 or writer.error is not None, timeout=30,
                       message="writes started")
            for _ in range(3):
                code, report = verify(setl, "--chunk-rows", "500")
                assert code == 0, json.dumps(report)[:3000]
                assert all(t["unsettled"] == [] and t["equal"] for t in report["tables"]), report
        finally:
            writer.stop.set()
            writer.thread.join(10)
        assert writer.error is None, writer.error
        assert writer.transactions > 100
