"""A 1,000-row transaction into a keyless table, loaded in 100-row pieces by `setl start`, killed
with SIGKILL twice inside it (once between a piece's load and its ack, once between two pieces):
after a restart the target holds every row exactly once, on MariaDB and on PostgreSQL.

Each piece of the transaction is acked at its row checkpoint (LOG:OFFSET+ROW) and the target
records that checkpoint with the piece's rows, so a restart resumes inside the transaction,
skipping the rows already in, instead of replaying the whole transaction.
"""

from __future__ import annotations

import json
import signal
import subprocess

from setl.model import Position
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, postgres_target

ROWS = 1000
PIECE = 100


def fill_source(server, database: str) -> Position:
    """A keyless table on the source and, after the returned position, one 1,000-row transaction."""
    server.query(f"CREATE TABLE `{database}`.big (n INT NOT NULL, v VARCHAR(20) NOT NULL)")
    start = binlog_head(server)
    values = ", ".join(f"({n}, 'row {n % 7}')" for n in range(1, ROWS + 1))
    server.query(f"INSERT INTO `{database}`.big (n, v) VALUES {values}")  # autocommit: one transaction
    server.query(f"INSERT INTO `{database}`.big (n, v) VALUES (0, 'after')")
    return start


def make_setl(tmp_path, source, database: str, start: Position, target: dict, target_name: str) -> SetlProcess:
    return SetlProcess(tmp_path, source=mysql_source(source, start={"file": start.log, "pos": start.offset}),
                       target=target, tables=[{"source": rf"{database}\.big", "target": target_name}],
                       pipeline={"parallelism": 1, "batch": {"max_rows": PIECE, "max_wait_ms": 50},
                                 "retry": {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 500}})


def crash_at(setl: SetlProcess, stage: str, batch: int) -> Position:
    """`setl start` that SIGKILLs itself at `stage` of batch `batch`; the ack it left."""
    env = setl._env()
    env["SETL_FAULTS"] = json.dumps([{"stage": stage, "action": "crash", "batch": batch}])
    proc = subprocess.Popen(setl._argv(("start", "--pipeline", setl.name)), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    ack = setl.acked()
    assert ack is not None
    return ack.position


def kill_twice_then_finish(setl: SetlProcess, start: Position) -> list[Position]:
    """Crash between the load and ack of batch 4, then between the pieces of batches 6 and 7; then catch up."""
    acks = [crash_at(setl, "termin", 4)]  # batch 4 (rows 301-400) loaded, not acked
    acks.append(crash_at(setl, "load", 7))  # the restart's batch 7 is not loaded
    final = setl.start_until_caught_up()
    assert final.returncode == 0, final.stderr[-3000:]
    for ack in acks:  # both kills struck inside the transaction
        assert ack.log == start.log and ack.row > 0, acks
    return acks


def expected(source, database: str) -> list[tuple]:
    rows = [tuple(r) for r in source.query(f"SELECT n, v FROM `{database}`.big ORDER BY n")]
    assert len(rows) == ROWS + 1
    return rows


def test_sigkill_inside_a_split_transaction_into_keyless_mariadb(tmp_path, mariadb_source, source_db,
                                                                   mariadb_target, mysql_db):
    """SIGKILLs of `setl start` inside a 1,000-row transaction leave a keyless MariaDB table with each row once."""
    start = fill_source(mariadb_source, source_db)
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.big (n INT NOT NULL, v VARCHAR(20) NOT NULL)")
    setl = make_setl(tmp_path, mariadb_source, source_db, start, mysql_target(mariadb_target), f"{mysql_db}.big")
    kill_twice_then_finish(setl, start)
    theirs = [tuple(r) for r in mariadb_target.query(f"SELECT n, v FROM `{mysql_db}`.big ORDER BY n")]
    assert theirs == expected(mariadb_source, source_db)


def test_sigkill_inside_a_split_transaction_into_keyless_postgresql(tmp_path, mariadb_source, source_db,
                                                                      postgres_server, postgres_db):
    """SIGKILLs of `setl start` inside a 1,000-row transaction leave a keyless PostgreSQL table with each row once."""
    start = fill_source(mariadb_source, source_db)
    postgres_server.query("CREATE TABLE public.big (n INT NOT NULL, v VARCHAR(20) NOT NULL)", dbname=postgres_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, start, postgres_target(postgres_server, postgres_db),
                     "public.big")
    kill_twice_then_finish(setl, start)
    theirs = [tuple(r) for r in postgres_server.query("SELECT n, v FROM public.big ORDER BY n", dbname=postgres_db)]
    assert theirs == expected(mariadb_source, source_db)
