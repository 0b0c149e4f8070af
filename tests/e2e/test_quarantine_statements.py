"""A row change logged as a statement (a session with binlog_format=STATEMENT or MIXED): setl has no
row images for it. Under ``on_table_error: quarantine`` one that writes one read table alone is handed
on as a marker in its place, which quarantines that table at the statement while the others flow on;
only `setl snapshot --table` brings it back (a replay is refused). Any other, and any under ``pause``,
stops the pipeline at the end of its transaction (docs/quarantine.md, "A row logged as a statement")."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from setl.errors import SourceError, TableRefused
from setl.model import STATEMENT_LOGGED, Position
from setl.scheduler import Outcome, Scheduler
from setl.sinks.mysql import MysqlLoad
from tests.e2e.setl_process import SetlProcess, spawned

from .replicate import binlog_head, replicate, table_rule
from .test_quarantine import (
    SETTINGS_SMALL,
    TABLES,
    make_mysql_targets,
    make_source,
    positions_of_kept,
    source_rows,
    write,
)
from .test_quarantine_live import LIVE_TABLES, Target, Writer, caught_up, make_live_source, make_target, setl_for

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def statement_session(server: Any, *, autocommit: bool = False) -> Iterator[Any]:
    """A cursor on a source session whose row changes are logged as statements."""
    with contextlib.closing(pymysql.connect(**server.connect_args(autocommit=autocommit))) as conn, \
            conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = STATEMENT")
        yield cur
        if not autocommit:
            conn.commit()


def run(source: Any, start: Position, source_db: str, target_db: str, load: MysqlLoad, tmp_path: Any, *,
        markers: bool = True, tables: str = ".*", outcome: Outcome = Outcome.CAUGHT_UP,
        reader_process: bool = False) -> Scheduler:
    """Pipeline `load.pipeline` from `start` (or the target's position) until it acked the binlog's end,
    its source handing on statement markers as under ``on_table_error: quarantine`` with an SQL target
    (`markers`), or not (``pause``); its reader in a process of its own with `reader_process`."""
    rules = [table_rule(rf"{source_db}\.{tables}", f"{target_db}.{{table}}")]
    return replicate(source, start, rules, load, tmp_path, name=load.pipeline, settings=SETTINGS_SMALL,
                     outcome=outcome, statement_markers=markers, max_rows_in_memory=SETTINGS_SMALL.batch.max_rows,
                     reader_process=reader_process)


def mysql_load(server: Any, database: str, policy: str = "quarantine", name: str = "q") -> MysqlLoad:
    return MysqlLoad(server.target_config(), pipeline=name, position_schema=database, initial_backoff=0.01,
                     on_table_error=policy)


def target_rows(server: Any, database: str, table: str) -> list[tuple]:
    return server.query(f"SELECT id, v FROM `{database}`.`{table}` ORDER BY id")


def kept(server: Any, database: str, table: str, position_schema: str | None = None) -> list[tuple]:
    """The positions kept for quarantined `database`.`table` (position table in `position_schema`,
    default `database`), in their kept order."""
    return positions_of_kept(server.query(f"SELECT `change` FROM `{position_schema or database}`.setl_position_kept"
                                          " WHERE target_table = %s ORDER BY seq", (f"{database}.{table}",)))


@pytest.fixture(params=["mariadb", "postgresql"])
def sql_target(request: pytest.FixtureRequest) -> Target:
    return make_target(request, request.param, LIVE_TABLES)


def test_under_pause_a_row_logged_as_a_statement_stops_the_pipeline(mariadb_source, source_db, mariadb_target,
                                                                    mysql_db, tmp_path):
    """Without markers (``on_table_error: pause``): a transaction writing two tables by statement stops
    the pipeline with one source line naming the table, the statement's position and the fix; every
    table holds exactly what the source held before that transaction, and nothing is quarantined."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db, bad="v VARCHAR(20)")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    before = {table: source_rows(mariadb_source, source_db, table) for table in TABLES}
    at = binlog_head(mariadb_source)
    with statement_session(mariadb_source) as cur:
        cur.execute(f"INSERT INTO `{source_db}`.a VALUES (900, 'row?')")
        cur.execute(f"INSERT INTO `{source_db}`.bad VALUES (900, 'stmt')")
    write(mariadb_source, source_db, 100)
    scheduler = run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db, "pause"),
                    tmp_path, markers=False, outcome=Outcome.PAUSED)
    error = scheduler.error
    assert isinstance(error, SourceError), error
    text = str(error)
    assert "\n" not in text and "is logged as a statement" in text and "SET GLOBAL binlog_format=ROW" in text, text
    assert f"{source_db}.a" in text and f"{source_db}.bad" in text and f"{at.log}:" in text, text
    for table in TABLES:
        assert target_rows(mariadb_target, mysql_db, table) == before[table], table
    assert mysql_load(mariadb_target, mysql_db).quarantined() == []


@pytest.mark.parametrize("reader_process", [False, True], ids=["reader_thread", "reader_process"])
def test_a_statement_inside_a_split_transaction_quarantines_its_table_at_its_own_position(
        mariadb_source, source_db, mariadb_target, mysql_db, tmp_path, reader_process):
    """A transaction setl splits (45 row changes, batches of 20) holding a MIXED-logged UPDATE of one
    table after 25 rows: that table is quarantined at the statement's ordinal in the transaction
    (LOG:START+26) with the rows after it kept, the other tables end equal, the cause names the
    statement and a snapshot; a later transaction's rows of the table are kept too (the reader in the
    node's process, and in a process of its own)."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db, bad="v VARCHAR(20)")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    tx_start = binlog_head(mariadb_source)
    with contextlib.closing(pymysql.connect(**mariadb_source.connect_args(autocommit=False))) as conn, \
            conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = MIXED")  # UUID() is unsafe: those inserts are logged as rows
        cur.executemany(f"INSERT INTO `{source_db}`.a VALUES (%s, LEFT(UUID(), 4))", [(i,) for i in range(500, 525)])
        cur.execute(f"UPDATE `{source_db}`.bad SET v = CONCAT('s', id) WHERE id < 15")  # safe: a statement
        cur.executemany(f"INSERT INTO `{source_db}`.b VALUES (%s, LEFT(UUID(), 4))", [(i,) for i in range(500, 510)])
        cur.executemany(f"INSERT INTO `{source_db}`.bad VALUES (%s, LEFT(UUID(), 4))",
                        [(i,) for i in range(500, 510)])
        conn.commit()
    write(mariadb_source, source_db, 100)
    run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path,
        reader_process=reader_process)
    for table in ("a", "b"):
        assert target_rows(mariadb_target, mysql_db, table) == source_rows(mariadb_source, source_db, table), table
    [found] = mysql_load(mariadb_target, mysql_db).quarantined()
    assert found.table == f"{mysql_db}.bad" and found.cause.startswith(STATEMENT_LOGGED), found
    assert "UPDATE" in found.cause and "setl snapshot --table" in found.cause, found.cause
    assert found.first == Position(tx_start.log, tx_start.offset, row=26), found.first
    positions = kept(mariadb_target, mysql_db, "bad")
    assert positions[:11] == [(tx_start.log, tx_start.offset, n) for n in [26, *range(37, 47)]], positions
    assert len(positions) > 11 and positions == sorted(positions), positions  # the later transactions' rows
    assert all(not v.startswith("s") for _, v in target_rows(mariadb_target, mysql_db, "bad"))


def test_a_statement_kept_for_a_table_quarantined_for_a_value_stops_its_replay_there(
        mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """A table quarantined for a value the target refuses, then written by a STATEMENT-logged UPDATE:
    the marker is kept in order among its changes; after the fix the replay applies what precedes
    it and stops at it with the one line naming the statement and `setl snapshot`, the table still
    quarantined with the marker first among what is left."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db)  # bad.v is VARCHAR(5)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1, long_at=5)
    at = binlog_head(mariadb_source)
    statement_update(mariadb_source, source_db)
    after = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 100)
    run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path)
    load = mysql_load(mariadb_target, mysql_db)
    [found] = load.quarantined()
    assert "Data too long" in found.cause, found
    held = kept(mariadb_target, mysql_db, "bad")
    assert (after.log, after.offset, 0) in held, (held, after)
    mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad MODIFY v VARCHAR(20)")
    with pytest.raises(TableRefused, match=STATEMENT_LOGGED) as refused:
        load.replay(f"{mysql_db}.bad", chunk=1000)
    load.close()
    assert "\n" not in str(refused.value) and "setl snapshot --table" in str(refused.value), refused.value
    left = kept(mariadb_target, mysql_db, "bad")
    assert left == held[held.index((after.log, after.offset, 0)):], (left, held)
    assert all(p[:2] <= (at.log, at.offset) for p in held[:held.index(left[0])]), held
    [still] = mysql_load(mariadb_target, mysql_db).quarantined()
    assert still.table == f"{mysql_db}.bad", still


def test_statements_setl_cannot_give_one_table_still_stop_the_pipeline(mariadb_source, source_db, mariadb_target,
                                                                       mysql_db, tmp_path):
    """Under quarantine, each of a multi-table UPDATE, an INSERT ... SELECT from a read table, an UPDATE
    of a table with a trigger and one calling a stored function stops the pipeline with the one source
    line (saying why it cannot quarantine its table alone), nothing of its transaction applied."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db, bad="v VARCHAR(20)")
    with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE TABLE `{source_db}`.trig (id INT PRIMARY KEY, v VARCHAR(20))")
        cur.execute(f"CREATE TRIGGER `{source_db}`.trig_a AFTER UPDATE ON `{source_db}`.trig FOR EACH ROW "
                    f"UPDATE `{source_db}`.a SET v = NEW.v WHERE id = NEW.id")
        cur.execute(f"CREATE FUNCTION `{source_db}`.touch_b(x VARCHAR(20)) RETURNS VARCHAR(20) DETERMINISTIC "
                    "MODIFIES SQL DATA "
                    f"BEGIN UPDATE `{source_db}`.b SET v = x WHERE id = 3; RETURN x; END")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.trig (id INT PRIMARY KEY, v VARCHAR(20))")
    cases = [
        (f"UPDATE `{source_db}`.a JOIN `{source_db}`.bad USING (id) SET bad.v = a.v", "names more than one table"),
        (f"INSERT INTO `{source_db}`.bad SELECT id + 100000, v FROM `{source_db}`.a", "names more than one table"),
        (f"UPDATE `{source_db}`.trig SET v = 'tg'", "trigger(s) trig_a"),
        (f"UPDATE `{source_db}`.bad SET v = `{source_db}`.touch_b('fn') WHERE id = 1",
         f"stored function(s) {source_db}.touch_b"),
    ]
    for number, (statement, why) in enumerate(cases):  # each a pipeline of its own, from its own start
        first = 1 + number * 1000
        mine = f"WHERE id BETWEEN {first} AND {first + 100} ORDER BY id"
        at = binlog_head(mariadb_source)
        write(mariadb_source, source_db, first)
        before = {table: mariadb_source.query(f"SELECT id, v FROM `{source_db}`.`{table}` {mine}") for table in TABLES}
        with statement_session(mariadb_source) as cur:
            cur.execute(statement)
        name = f"q{number}"
        scheduler = run(mariadb_source, at, source_db, mysql_db, mysql_load(mariadb_target, mysql_db, name=name),
                        tmp_path, outcome=Outcome.PAUSED)
        text = str(scheduler.error)
        assert isinstance(scheduler.error, SourceError) and "\n" not in text, text
        assert "is logged as a statement" in text and why in text and f"{at.log}:" in text, (statement, text)
        for table in TABLES:  # its writes before, and nothing of the statement's transaction
            assert mariadb_target.query(f"SELECT id, v FROM `{mysql_db}`.`{table}` {mine}") == before[table], table
        assert before["a"] and mysql_load(mariadb_target, mysql_db, name=name).quarantined() == [], statement


def test_a_rolled_back_statement_quarantines_only_what_the_rollback_kept(mariadb_source, source_db, mariadb_target,
                                                                        mysql_db, tmp_path):
    """A transaction mixing InnoDB and MyISAM tables, logged as statements and rolled back (the binlog
    holds it with ROLLBACK), and one whose InnoDB statement is undone by ROLLBACK TO SAVEPOINT: the
    InnoDB table's statements were undone, so that table is not quarantined and ends equal; the MyISAM
    table's inserts stayed, so that table is quarantined; the others end equal."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db, bad="v VARCHAR(20)")
    with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE TABLE `{source_db}`.m (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=MyISAM")
        cur.execute(f"CREATE TABLE `{source_db}`.unread (id INT PRIMARY KEY, v VARCHAR(20))")
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.m (id INT PRIMARY KEY, v VARCHAR(20))")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    with contextlib.closing(pymysql.connect(**mariadb_source.connect_args(autocommit=False))) as conn, \
            conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = STATEMENT")
        cur.execute(f"UPDATE `{source_db}`.bad SET v = 'undone' WHERE id < 10")
        cur.execute(f"INSERT INTO `{source_db}`.m VALUES (1, 'stays')")
        conn.rollback()
        # an InnoDB write first (of a table no rule selects: passed over), so the MyISAM insert and the
        # savepoint go into the transaction's binlog cache
        cur.execute(f"INSERT INTO `{source_db}`.unread VALUES (1, 'x')")
        cur.execute(f"INSERT INTO `{source_db}`.m VALUES (2, 'stays')")
        cur.execute("SAVEPOINT sp")
        cur.execute(f"UPDATE `{source_db}`.bad SET v = 'undone' WHERE id < 10")
        cur.execute("ROLLBACK TO SAVEPOINT sp")
        conn.commit()
    write(mariadb_source, source_db, 100)
    run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path,
        tables="(a|b|bad|m)")
    assert source_rows(mariadb_source, source_db, "m") == [(1, "stays"), (2, "stays")]
    for table in TABLES:
        assert target_rows(mariadb_target, mysql_db, table) == source_rows(mariadb_source, source_db, table), table
    [found] = mysql_load(mariadb_target, mysql_db).quarantined()
    assert found.table == f"{mysql_db}.m" and found.cause.startswith(STATEMENT_LOGGED), found


def test_xa_statements_quarantine_at_xa_commit_and_never_at_xa_rollback(mariadb_source, source_db, mariadb_target,
                                                                         mysql_db, tmp_path):
    """Two-phase XA logged as statements: the group committed by XA COMMIT quarantines its table (bad),
    the group ended by XA ROLLBACK quarantines nothing (b ends equal); the other tables end equal. Under
    pause (no markers), the committed XA group's statement stops the pipeline (it is not lost)."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db, bad="v VARCHAR(20)")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    for xid, table, value in (("xs1", "bad", "xa"), ("xs2", "b", "never")):
        with statement_session(mariadb_source, autocommit=True) as cur:
            cur.execute(f"XA START '{xid}'")
            cur.execute(f"UPDATE `{source_db}`.`{table}` SET v = '{value}' WHERE id < 10")
            cur.execute(f"XA END '{xid}'")
            cur.execute(f"XA PREPARE '{xid}'")
    write(mariadb_source, source_db, 100)
    with contextlib.closing(pymysql.connect(**mariadb_source.connect_args(autocommit=True))) as conn, \
            conn.cursor() as cur:
        cur.execute("XA ROLLBACK 'xs2'")
        cur.execute("XA COMMIT 'xs1'")
    write(mariadb_source, source_db, 200)
    (tmp_path / "pause").mkdir()
    scheduler = run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db, "pause"),
                    tmp_path / "pause", markers=False, outcome=Outcome.PAUSED)
    assert "UPDATE" in str(scheduler.error) and "is logged as a statement" in str(scheduler.error), scheduler.error
    assert f"{source_db}.bad" in str(scheduler.error), scheduler.error
    run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path)
    for table in ("a", "b"):
        assert target_rows(mariadb_target, mysql_db, table) == source_rows(mariadb_source, source_db, table), table
    [found] = mysql_load(mariadb_target, mysql_db).quarantined()
    assert found.table == f"{mysql_db}.bad" and found.cause.startswith(STATEMENT_LOGGED), found
    assert all(v != "xa" for _, v in target_rows(mariadb_target, mysql_db, "bad"))


def test_a_statement_on_a_table_the_rules_skip_is_passed_over(mariadb_source, source_db, mariadb_target, mysql_db,
                                                             tmp_path):
    """A STATEMENT-logged UPDATE of a source table no rule selects is passed over (as before markers):
    the pipeline catches up, every selected table ends equal, nothing is quarantined."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db, bad="v VARCHAR(20)")
    with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE TABLE `{source_db}`.skipped (id INT PRIMARY KEY, v VARCHAR(20))")
        cur.execute(f"INSERT INTO `{source_db}`.skipped VALUES (1, 'x')")
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    with statement_session(mariadb_source) as cur:
        cur.execute(f"UPDATE `{source_db}`.skipped SET v = 'y'")
    write(mariadb_source, source_db, 100)
    run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path,
        tables="(a|b|bad)")
    for table in TABLES:
        assert target_rows(mariadb_target, mysql_db, table) == source_rows(mariadb_source, source_db, table), table
    assert mysql_load(mariadb_target, mysql_db).quarantined() == []


def statement_update(server: Any, database: str) -> None:
    """One transaction updating the bad table by a STATEMENT-logged UPDATE."""
    with statement_session(server) as cur:
        cur.execute(f"UPDATE `{database}`.bad SET v = CONCAT('s', MOD(id, 10)) WHERE id < 200")


def test_three_tables_under_writes_stay_equal_while_a_statement_quarantines_one_and_a_snapshot_ends_it(
        mariadb_source, source_db, sql_target: Target, tmp_path):
    """A running `setl start` (quarantine) under a concurrent writer: a STATEMENT-format UPDATE of one
    table quarantines it and the 3 others catch up equal; `setl resume --table` is refused with one line
    saying a snapshot is needed, nothing replayed; `setl snapshot --table` then brings the table back
    equal, its quarantine ended and nothing left kept, also after later writes (MariaDB and PostgreSQL)."""
    make_live_source(mariadb_source, source_db)
    start = binlog_head(mariadb_source)
    setl = setl_for(tmp_path, mariadb_source, start, source_db, sql_target)
    others = ("a", "b", "c")
    with spawned(setl) as proc:
        writer = Writer(mariadb_source, source_db, 2.0, seed=3, long_after=None)
        writer.start()
        statement_update(mariadb_source, source_db)
        assert writer.finish() > 5
        caught_up(setl, proc, mariadb_source)
        for table in others:
            assert sql_target.rows(table) == source_rows(mariadb_source, source_db, table), table
        held = sql_target.kept("bad")
        assert held and held == sorted(held), held
        [(cause,)] = sql_target.query("SELECT cause FROM setl.setl_position_quarantine WHERE target_table = %s",
                                       (f"{sql_target.schema}.bad",))
        assert cause.startswith(STATEMENT_LOGGED) and "UPDATE" in cause, cause
        assert SetlProcess.stop(proc) == 0, setl.logs()[-3000:]
    refused = setl.run("resume", "--pipeline", setl.name, "--table", f"{sql_target.schema}.bad")
    line = refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""
    assert refused.returncode == 1 and "cannot be replayed, a snapshot is needed" in line, refused.stderr[-3000:]
    assert sql_target.kept("bad") == held  # nothing replayed
    asked = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.bad")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    later = Writer(mariadb_source, source_db, 0.5, seed=4, long_after=None)
    later.run()
    assert later.error is None and later.transactions > 0, later.error
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quarantine ended by a re-copy" in done.stderr, done.stderr[-3000:]
    for table in LIVE_TABLES:
        assert sql_target.rows(table) == source_rows(mariadb_source, source_db, table), table
    assert sql_target.kept("bad") == []


@pytest.fixture(params=["mariadb", "postgresql"])
def three_tables(request: pytest.FixtureRequest) -> Target:
    return make_target(request, request.param, TABLES)


def test_kill_9_during_a_statement_quarantine_ends_exact(mariadb_source, source_db, three_tables: Target, tmp_path):
    """`setl start` killed -9 while it keeps the changes of a table a STATEMENT-logged UPDATE quarantines
    (before COMMIT), then right after that batch (before its ack): the other tables end equal, the table
    is kept from the statement on, once and in order, and `setl snapshot --table` ends every table equal
    (MariaDB and PostgreSQL)."""
    target = three_tables
    make_source(mariadb_source, source_db)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    statement_update(mariadb_source, source_db)
    after = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 100)
    setl = setl_for(tmp_path, mariadb_source, start, source_db, target,
                    retry={"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20})
    setl.config["pipeline"]["batch"] = {"max_rows": 20, "max_wait_ms": 20}
    setl.write_config()
    setl.faults = json.dumps([{"stage": "quarantine_kept", "action": "crash"}])
    crashed = setl.start_until_caught_up()
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert target.kept("bad") == []  # the quarantining transaction never committed
    setl.faults = json.dumps([{"stage": "termin", "action": "crash"}])
    crashed = setl.start_until_caught_up()
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert target.kept("bad") != [], "the batch that quarantined the table committed"
    setl.faults = None
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    for table in ("a", "b"):
        assert target.rows(table) == source_rows(mariadb_source, source_db, table), table
    positions = [tuple(p) for p in target.kept("bad")]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), positions
    assert positions[0] == (after.log, after.offset, 0), (positions[0], after)  # kept from the statement on
    assert target.rows("bad") != source_rows(mariadb_source, source_db, "bad")
    asked = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.bad")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    for table in TABLES:
        assert target.rows(table) == source_rows(mariadb_source, source_db, table), table
    assert target.kept("bad") == []
