"""A table whose changes the target refuses is quarantined while the other tables go on
(``on_table_error: quarantine``, docs/quarantine.md): its changes are kept on the target, and a
replay after the fix ends equal, with no gap and no duplicate, on MariaDB and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable
from typing import Any

import attrs
import pymysql
import pytest

from setl.errors import TableRefused
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.sinks.sql_quarantine import QuarantineFull, decode_run
from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target

from .replicate import SETTINGS, binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(180)

TABLES = ("a", "b", "bad")
SETTINGS_SMALL = attrs.evolve(SETTINGS, batch=attrs.evolve(SETTINGS.batch, max_rows=20))


def make_source(server, database: str) -> None:
    """The three source tables, made outside the binlog (the targets make their own)."""
    with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        for table in TABLES:
            cur.execute(f"CREATE TABLE `{database}`.`{table}` (id INT PRIMARY KEY, v VARCHAR(20))")


def write(server, database: str, first: int, *, long_at: int | None = None) -> None:
    """Transactions that each touch every table: inserts from `first` (the bad table's value at
    `long_at` is 12 characters, the others 4 at most), an update and a delete of earlier rows."""
    with contextlib.closing(pymysql.connect(**server.connect_args(autocommit=False))) as conn, conn.cursor() as cur:
        for step in range(3):
            base = first + step * 10
            for table in TABLES:
                rows = [(i, "x" * 12 if table == "bad" and i == long_at else f"{i % 1000}")
                        for i in range(base, base + 10)]
                cur.executemany(f"INSERT INTO `{database}`.`{table}` (id, v) VALUES (%s, %s)", rows)
                cur.execute(f"UPDATE `{database}`.`{table}` SET v = CONCAT('u', MOD(id, 100)) WHERE id = %s",
                            (base + 1,))
                cur.execute(f"DELETE FROM `{database}`.`{table}` WHERE id = %s", (base + 2,))
            conn.commit()


def source_rows(server, database: str, table: str) -> list[tuple]:
    return server.query(f"SELECT id, v FROM `{database}`.`{table}` ORDER BY id")


def mysql_target_rows(server, database: str) -> Callable[[str], list[tuple]]:
    return lambda table: server.query(f"SELECT id, v FROM `{database}`.`{table}` ORDER BY id")


def make_mysql_targets(server, database: str, bad: str = "v VARCHAR(5)") -> None:
    for table in TABLES:
        column = bad if table == "bad" else "v VARCHAR(20)"
        server.query(f"CREATE TABLE `{database}`.`{table}` (id INT PRIMARY KEY, {column})")


def run(source, start, source_db: str, target_schema: str, load: Any, tmp_path, outcome=Outcome.CAUGHT_UP):
    return replicate(source, start, [table_rule(rf"{source_db}\..*", f"{target_schema}.{{table}}")], load,
                     tmp_path, name="q", settings=SETTINGS_SMALL, outcome=outcome)


def assert_equal(source, source_db: str, rows: Callable[[str], list[tuple]], tables=TABLES) -> None:
    for table in tables:
        assert rows(table) == source_rows(source, source_db, table), table


def mysql_load(server, database: str, **options: Any) -> MysqlLoad:
    return MysqlLoad(server.target_config(), pipeline="q", position_schema=database, initial_backoff=0.01,
                     on_table_error="quarantine", **options)


def test_mariadb_refused_value_quarantines_one_table_and_replay_ends_equal(mariadb_source, source_db,
                                                                           mariadb_target, mysql_db, tmp_path):
    """A value too long for the target's column quarantines that table only: the others end equal,
    its changes are kept from its first change of the refused batch; after the column is widened,
    the replay and the next changes end every table equal, with nothing left kept."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    write(mariadb_source, source_db, 100, long_at=115)
    write(mariadb_source, source_db, 200)
    run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path)
    rows = mysql_target_rows(mariadb_target, mysql_db)
    assert_equal(mariadb_source, source_db, rows, ("a", "b"))
    load = mysql_load(mariadb_target, mysql_db)
    [found] = load.quarantined()
    assert found.table == f"{mysql_db}.bad" and "Data too long" in found.cause, found
    assert found.changes > 0 and found.nbytes > 0, found
    assert rows("bad") != source_rows(mariadb_source, source_db, "bad")
    assert all(i < 115 for i, _ in rows("bad")), rows("bad")  # nothing of or after the refused change

    with pytest.raises(TableRefused, match="Data too long"):  # not fixed yet: the replay refuses, keeps all
        load.replay(f"{mysql_db}.bad", chunk=7)
    assert load.quarantined() == [found]

    mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad MODIFY v VARCHAR(20)")
    assert load.replay(f"{mysql_db}.bad", chunk=7) == found.changes
    load.close()
    assert_equal(mariadb_source, source_db, rows)
    write(mariadb_source, source_db, 300)  # the table follows the stream again
    load = mysql_load(mariadb_target, mysql_db)
    run(mariadb_source, start, source_db, mysql_db, load, tmp_path)
    assert_equal(mariadb_source, source_db, rows)
    assert mysql_load(mariadb_target, mysql_db).quarantined() == []
    assert mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.setl_position_kept")[0][0] == 0


def test_mariadb_dropped_privilege_quarantines_one_table_and_its_ddl_waits_too(mariadb_source, source_db,
                                                                              mariadb_target, mysql_db, tmp_path):
    """A target account without the right to write one table: that table is quarantined (MariaDB
    1142), a later ALTER of it is kept with its rows while the other tables go on; once the grant is
    back, the replay applies the ALTER, then the rows, in order, and every table ends equal."""
    make_source(mariadb_source, source_db)
    data, user = f"{mysql_db}_d", f"q{mysql_db[-12:]}"
    mariadb_target.query(f"CREATE DATABASE `{data}`")
    make_mysql_targets(mariadb_target, data, bad="v VARCHAR(20)")
    mariadb_target.query(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
    try:
        mariadb_target.query(f"GRANT ALL ON `{mysql_db}`.* TO '{user}'@'%'")
        for table in ("a", "b"):
            mariadb_target.query(f"GRANT SELECT, INSERT, UPDATE, DELETE, ALTER ON `{data}`.`{table}` TO '{user}'@'%'")
        mariadb_target.query(f"GRANT SELECT ON `{data}`.bad TO '{user}'@'%'")
        start = binlog_head(mariadb_source)
        write(mariadb_source, source_db, 1)
        mariadb_source.query(f"ALTER TABLE `{source_db}`.bad ADD COLUMN w INT NOT NULL DEFAULT 7")
        write(mariadb_source, source_db, 100)
        config = attrs.evolve(mariadb_target.target_config(), user=user, password="pw")

        def load() -> MysqlLoad:
            return MysqlLoad(config, pipeline="q", position_schema=mysql_db, initial_backoff=0.01,
                             on_table_error="quarantine")

        run(mariadb_source, start, source_db, data, load(), tmp_path)
        rows = mysql_target_rows(mariadb_target, data)
        assert_equal(mariadb_source, source_db, rows, ("a", "b"))
        sink = load()
        [found] = sink.quarantined()
        assert found.table == f"{data}.bad" and "denied" in found.cause and "1142" in found.cause, found
        assert rows("bad") == []  # its first change was refused already
        mariadb_target.query(f"GRANT ALL ON `{data}`.bad TO '{user}'@'%'")
        assert sink.replay(found.table, chunk=8) == found.changes
        sink.close()
        assert_equal(mariadb_source, source_db, rows)
        assert mariadb_target.query(f"SELECT id, w FROM `{data}`.bad ORDER BY id") == mariadb_source.query(
            f"SELECT id, w FROM `{source_db}`.bad ORDER BY id")
        write(mariadb_source, source_db, 300)
        run(mariadb_source, start, source_db, data, load(), tmp_path)
        assert_equal(mariadb_source, source_db, rows)
        assert load().quarantined() == []
    finally:
        mariadb_target.query(f"DROP USER '{user}'@'%'")
        mariadb_target.query(f"DROP DATABASE `{data}`")


def test_mariadb_refused_value_pauses_by_default(mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """Under ``on_table_error: pause`` the same refusal pauses the pipeline with a TableRefused
    naming the table, and nothing is quarantined."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 100, long_at=105)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="q", position_schema=mysql_db, initial_backoff=0.01)
    scheduler = run(mariadb_source, start, source_db, mysql_db, load, tmp_path, outcome=Outcome.PAUSED)
    error = scheduler.error
    assert isinstance(error, TableRefused), error
    assert error.context["table"] == f"{mysql_db}.bad" and "Data too long" in error.message
    assert error.context["position"] is not None and error.context["stage"] == "load"
    assert mysql_load(mariadb_target, mysql_db).quarantined() == []


def test_mariadb_quarantine_bound_pauses_and_drops_nothing(mariadb_source, source_db, mariadb_target, mysql_db,
                                                           tmp_path):
    """A quarantined table that would keep more than ``quarantine.max_rows`` changes pauses the
    pipeline with one line saying so; what was kept stays, and the replay after the fix ends equal."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 100, long_at=105)
    write(mariadb_source, source_db, 200)
    scheduler = run(mariadb_source, start, source_db, mysql_db,
                    mysql_load(mariadb_target, mysql_db, quarantine_max_rows=40), tmp_path, outcome=Outcome.PAUSED)
    assert isinstance(scheduler.error, QuarantineFull), scheduler.error
    assert "max_rows 40" in str(scheduler.error) and "nothing dropped" in str(scheduler.error)
    mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad MODIFY v VARCHAR(20)")
    load = mysql_load(mariadb_target, mysql_db)
    [found] = load.quarantined()
    assert 0 < found.changes <= 40
    load.replay(found.table)
    load.close()
    run(mariadb_source, start, source_db, mysql_db, mysql_load(mariadb_target, mysql_db), tmp_path)
    assert_equal(mariadb_source, source_db, mysql_target_rows(mariadb_target, mysql_db))


def test_postgresql_check_constraint_quarantines_one_table_and_replay_ends_equal(
        mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """On PostgreSQL a CHECK constraint the target adds refuses one table's value: that table is
    quarantined, the others end equal; the replay fails while the constraint stands, and after it is
    dropped the replay and the next changes end every table equal."""
    make_source(mariadb_source, source_db)

    def query(sql: str) -> list[tuple]:
        return postgres_server.query(sql, dbname=postgres_db)

    query("CREATE SCHEMA dw")
    for table in TABLES:
        check = ", CONSTRAINT short_v CHECK (length(v) <= 5)" if table == "bad" else ""
        query(f"CREATE TABLE dw.{table} (id integer PRIMARY KEY, v varchar(20){check})")

    def load(**options: Any) -> PostgresqlLoad:
        return PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="q", initial_backoff=0.01,
                              on_table_error="quarantine", **options)

    def rows(table: str) -> list[tuple]:
        return query(f"SELECT id, v FROM dw.{table} ORDER BY id")

    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    write(mariadb_source, source_db, 100, long_at=115)
    write(mariadb_source, source_db, 200)
    run(mariadb_source, start, source_db, "dw", load(), tmp_path)
    assert_equal(mariadb_source, source_db, rows, ("a", "b"))
    sink = load()
    [found] = sink.quarantined()
    assert found.table == "dw.bad" and "short_v" in found.cause and found.changes > 0, found
    assert all(i < 115 for i, _ in rows("bad")), rows("bad")
    replayed_after_the_fix(sink, found, "short_v", lambda: query("ALTER TABLE dw.bad DROP CONSTRAINT short_v"),
                           mariadb_source, source_db, start, rows, load, tmp_path)


def replayed_after_the_fix(sink: Any, found: Any, cause: str, fix: Callable[[], object], source: Any,
                           source_db: str, start: Any, rows: Callable[[str], list[tuple]], load: Callable[[], Any],
                           tmp_path: Any) -> None:
    """A PostgreSQL quarantine of dw.bad (`found`) ended: the replay is refused for `cause` and keeps
    everything until `fix` runs, then applies every kept change, and the next changes leave every table
    equal with nothing quarantined."""
    with pytest.raises(TableRefused, match=cause):
        sink.replay("dw.bad", chunk=7)
    assert sink.quarantined() == [found]
    fix()
    assert sink.replay("dw.bad", chunk=7) == found.changes
    sink.close()
    assert_equal(source, source_db, rows)
    write(source, source_db, 300)
    run(source, start, source_db, "dw", load(), tmp_path)
    assert_equal(source, source_db, rows)
    assert load().quarantined() == []


def test_postgresql_dropped_privilege_quarantines_one_table_and_replay_ends_equal(
        mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """On PostgreSQL a target role without the right to write one table (42501): that table is
    quarantined with the cause naming the privilege, the others end equal; the replay is refused
    while the grant is missing, and once it is back the replay and the next changes end every table
    equal, with nothing left kept."""
    make_source(mariadb_source, source_db)
    role = f"q_{postgres_db}"[:60]

    def query(sql: str) -> list[tuple]:
        return postgres_server.query(sql, dbname=postgres_db)

    query("CREATE SCHEMA dw")
    for table in TABLES:
        query(f"CREATE TABLE dw.{table} (id integer PRIMARY KEY, v varchar(20))")
    query(f'CREATE ROLE "{role}" LOGIN')
    try:
        query(f'GRANT CREATE, CONNECT, TEMPORARY ON DATABASE "{postgres_db}" TO "{role}"')
        query(f'GRANT USAGE ON SCHEMA dw TO "{role}"')
        query(f'GRANT SELECT, INSERT, UPDATE, DELETE ON dw.a, dw.b TO "{role}"')
        query(f'GRANT SELECT ON dw.bad TO "{role}"')
        config = attrs.evolve(postgres_server.target_config(postgres_db), user=role)

        def load() -> PostgresqlLoad:
            return PostgresqlLoad(config, pipeline="q", initial_backoff=0.01, on_table_error="quarantine")

        def rows(table: str) -> list[tuple]:
            return query(f"SELECT id, v FROM dw.{table} ORDER BY id")

        start = binlog_head(mariadb_source)
        write(mariadb_source, source_db, 1)
        write(mariadb_source, source_db, 100)
        run(mariadb_source, start, source_db, "dw", load(), tmp_path)
        assert_equal(mariadb_source, source_db, rows, ("a", "b"))
        sink = load()
        [found] = sink.quarantined()
        assert found.table == "dw.bad" and "permission denied" in found.cause and found.changes > 0, found
        assert rows("bad") == []  # its first change was refused already
        replayed_after_the_fix(sink, found, "permission denied",
                               lambda: query(f'GRANT INSERT, UPDATE, DELETE ON dw.bad TO "{role}"'),
                               mariadb_source, source_db, start, rows, load, tmp_path)
    finally:
        query(f'DROP OWNED BY "{role}" CASCADE')
        query(f'DROP ROLE "{role}"')


def positions_of_kept(rows: list[tuple]) -> list[tuple]:
    """The (log, offset, row) of each change kept in `rows` of a kept table (their ``change`` column,
    read in ``seq`` order), in their kept order: a row holds a run of changes."""
    found = []
    for (blob,) in rows:
        for change in decode_run(bytes(blob)):
            at = change.position
            found.append((at.log, at.offset, at.row) if at is not None else ("", 0, 0))
    return found


def kept_positions(server, database: str) -> list[tuple]:
    """The positions of the changes kept for `database`.bad (by pipelines with the default position
    table), in their kept order."""
    return positions_of_kept(server.query("SELECT `change` FROM setl.setl_position_kept WHERE target_table = %s"
                                          " ORDER BY seq", (f"{database}.bad",)))


def test_kill_9_during_quarantine_and_during_replay_ends_exact(mariadb_source, source_db, mariadb_target, mysql_db,
                                                               tmp_path):
    """`setl start` killed -9 while it keeps a quarantined table's changes (before COMMIT), then right
    after a batch that quarantined it (before its ack), then `setl resume --table` killed -9 inside
    its second replay transaction: the other tables end equal, nothing is kept twice or out of order
    (`setl check` names the table and what is kept), and the replay run again ends every table equal
    (a third run, with nothing quarantined, exits 2 saying so)."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    write(mariadb_source, source_db, 100, long_at=115)
    write(mariadb_source, source_db, 200)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}"}],
                       pipeline={"on_table_error": "quarantine", "create_tables": False,
                                 "batch": {"max_rows": 20, "max_wait_ms": 20},
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20}})
    setl.faults = json.dumps([{"stage": "quarantine_kept", "action": "crash"}])
    crashed = setl.start_until_caught_up()
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert kept_positions(mariadb_target, mysql_db) == []  # the quarantining transaction never committed
    setl.faults = json.dumps([{"stage": "termin", "action": "crash"}])
    crashed = setl.start_until_caught_up()
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert kept_positions(mariadb_target, mysql_db), "the batch that quarantined the table committed"
    setl.faults = None
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    rows = mysql_target_rows(mariadb_target, mysql_db)
    assert_equal(mariadb_source, source_db, rows, ("a", "b"))
    kept = kept_positions(mariadb_target, mysql_db)
    assert kept == sorted(kept) and len(kept) > 10, kept  # in stream order, none kept twice
    checked = setl.run("check", "--pipeline", setl.name)
    assert f"table {mysql_db}.bad is quarantined since" in checked.stdout, checked.stdout + checked.stderr
    assert f"{len(kept)} changes" in checked.stdout and "Data too long" in checked.stdout, checked.stdout

    mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad MODIFY v VARCHAR(20)")
    setl.faults = json.dumps([{"stage": "quarantine_replay", "action": "crash", "batch": 1}])
    crashed = setl.run("resume", "--pipeline", setl.name, "--table", f"{mysql_db}.bad", "--chunk-rows", "5")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    assert kept_positions(mariadb_target, mysql_db) == kept[5:]  # the first transaction only
    setl.faults = None
    resumed = setl.run("resume", "--pipeline", setl.name, "--table", f"{mysql_db}.bad", "--chunk-rows", "5")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    assert f"{mysql_db}.bad replayed ({len(kept) - 5} changes applied)" in resumed.stdout, resumed.stdout
    assert_equal(mariadb_source, source_db, rows)
    write(mariadb_source, source_db, 300)
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    assert_equal(mariadb_source, source_db, rows)
    assert kept_positions(mariadb_target, mysql_db) == []
    again = setl.run("resume", "--pipeline", setl.name, "--table", f"{mysql_db}.bad")
    assert again.returncode == 2 and f"target table {mysql_db}.bad is not quarantined" in again.stderr, again.stderr


def test_snapshot_of_a_quarantined_table_ends_its_quarantine_and_drops_what_was_kept(
        mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """`setl snapshot --table` is the other way back: after the fix, the table is copied again online,
    its quarantine ends at the copy's start with what was kept dropped, and every table ends equal,
    also after later changes."""
    make_source(mariadb_source, source_db)
    make_mysql_targets(mariadb_target, mysql_db)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 100, long_at=105)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}"}],
                       pipeline={"on_table_error": "quarantine", "create_tables": False,
                                 "batch": {"max_rows": 20, "max_wait_ms": 20}})
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    assert kept_positions(mariadb_target, mysql_db), "the table is quarantined"
    mariadb_target.query(f"ALTER TABLE `{mysql_db}`.bad MODIFY v VARCHAR(20)")
    asked = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.bad")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    write(mariadb_source, source_db, 200)
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quarantine ended by a re-copy" in done.stderr, done.stderr[-3000:]
    assert kept_positions(mariadb_target, mysql_db) == []
    assert_equal(mariadb_source, source_db, mysql_target_rows(mariadb_target, mysql_db))
    write(mariadb_source, source_db, 300)
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    assert_equal(mariadb_source, source_db, mysql_target_rows(mariadb_target, mysql_db))
