"""The MySQL/MariaDB sink against a real MariaDB server."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import attrs
import pymysql.err
import pytest
from hypothesis import given
from hypothesis import strategies as st

from setl.errors import LoadError, TableRefused, TransientLoadError
from setl.model import DdlChange
from setl.sinks.mysql import MysqlLoad, MysqlTargetConfig
from setl.sinks.mysql_rows import MysqlRows
from setl.sinks.prepared import MAX_PREPARED
from setl.sinks.sql_failures import TargetTableMissing
from setl.testing.servers import MariaDBServer, free_port
from tests.e2e.replicate import PER_TABLE, replicate, table_rule, write_source
from tests.helpers.locks import mariadb_lock_waits

from .contract import Changes, SinkContract, Target, at, item, make_batch, model_settings, read, span


class MySQLTarget(Target):
    load_class = MysqlLoad
    generated_ddl = "CREATE TABLE {table} (id INT PRIMARY KEY, v INT, d INT AS (v * 2) VIRTUAL)"

    def __init__(self, server: MariaDBServer, database: str) -> None:
        self.server = server
        self.schema = database

    def execute(self, statement: str) -> None:
        self.server.query(statement)

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        return self.server.query(statement)

    def qualified(self, table: str) -> str:
        return f"`{self.schema}`.`{table}`"

    def rows(self, table: str, order: str = "1") -> list[tuple[Any, ...]]:
        return self.server.query(f"SELECT * FROM {self.qualified(table)} ORDER BY {order}")

    def position_table(self, suffix: str = "") -> str:
        return self.qualified("setl_position" + suffix)

    def columns(self, table: str) -> list[str]:
        return [r[0] for r in self.server.query(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
            " ORDER BY ordinal_position", (self.schema, table))]

    def config(self, unreachable: bool = False) -> MysqlTargetConfig:
        if unreachable:
            return MysqlTargetConfig(type="mysql", host="127.0.0.1", port=free_port())
        return self.server.target_config()

    def load_options(self) -> dict[str, Any]:
        return {"position_schema": self.schema}

    def session_id(self, load: MysqlLoad) -> int:
        return load.pool.idle[-1].thread_id()

    def kill(self, session: int) -> None:
        self.server.query(f"KILL CONNECTION {session}")

    @contextlib.contextmanager
    def short_lock_waits(self) -> Iterator[None]:
        (before,) = self.server.query("SELECT @@GLOBAL.innodb_lock_wait_timeout")[0]
        self.server.query("SET GLOBAL innodb_lock_wait_timeout = 1")
        try:
            yield
        finally:
            self.server.query(f"SET GLOBAL innodb_lock_wait_timeout = {int(before)}")

    def lock_row(self, table: str, key: int) -> Any:
        conn = self.server.connect()
        conn.autocommit(False)
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {self.qualified(table)} WHERE id = %s FOR UPDATE", (key,))
        return conn

    def read_in_transaction(self, qualified: str) -> Any:
        conn = self.server.connect()
        conn.autocommit(False)
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {qualified}")
        return conn

    def table_lock_waiters(self) -> int:
        return int(self.server.query("SELECT COUNT(*) FROM information_schema.processlist"
                                     " WHERE state LIKE 'Waiting for%lock'")[0][0])

    def session_alive(self, session: int) -> bool:
        return bool(self.server.query("SELECT 1 FROM information_schema.processlist WHERE id = %s", (session,)))

    def lock_waits(self, holder: Any) -> int:
        return mariadb_lock_waits(self.server, holder)

    def create_old_position_table(self, log: str, offset: int, epoch: int) -> None:
        self.execute(f"CREATE TABLE {self.position_table()} (`pipeline` VARCHAR(191) NOT NULL PRIMARY KEY,"
                     " `log` VARCHAR(512) NOT NULL, `offset` BIGINT NOT NULL, `gtid` TEXT NULL,"
                     " `batch_id` BIGINT NOT NULL, `epoch` BIGINT NOT NULL, `updated_at` TIMESTAMP(6) NOT NULL"
                     " DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)) ENGINE=InnoDB")
        self.execute(f"INSERT INTO {self.position_table()} (`pipeline`, `log`, `offset`, `batch_id`, `epoch`)"
                     f" VALUES ('p', '{log}', {offset}, 5, {epoch})")


class TestMySQLSink(SinkContract):
    """The shared SQL sink contract, on MariaDB."""

    @pytest.fixture
    def target(self, mariadb_target, mysql_db) -> MySQLTarget:
        return MySQLTarget(mariadb_target, mysql_db)

    @model_settings
    @given(data=st.data())
    def test_random_sequences_match_a_dict_model(self, target, items, load, data):
        """Random changes cut into random batches leave the table equal to a dict model."""
        self.check_random_sequences(target, items, load, data)

    def test_values_round_trip(self, target, load):
        """Bytes, decimals, dates, times, JSON and SET values arrive as the source sent them."""
        target.execute(f"CREATE TABLE {target.qualified('typed')} (id BIGINT PRIMARY KEY, b VARBINARY(16),"
                       " d DECIMAL(12,4), ts DATETIME(6), day DATE, t TIME(6), j JSON, f DOUBLE,"
                       " s SET('x','y','z'), u VARCHAR(16))")
        typed = Changes(target.schema, "typed")
        row = {"id": 2**40, "b": b"\x00\xff", "d": decimal.Decimal("12.3400"),
               "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, 600000), "day": datetime.date(2024, 2, 29),
               "t": datetime.timedelta(hours=-1, seconds=5), "j": {"k": [1, "é"]}, "f": 0.5,
               "s": {"z", "x"}, "u": "ünï"}
        load.load(make_batch([typed.insert(**row)]))
        (got,) = target.rows("typed")
        assert got[:6] == (2**40, b"\x00\xff", decimal.Decimal("12.3400"),
                           datetime.datetime(2024, 1, 2, 3, 4, 5, 600000), datetime.date(2024, 2, 29),
                           datetime.timedelta(hours=-1, seconds=5))
        assert got[6] == '{"k":[1,"é"]}' and got[7:] == (0.5, "x,z", "ünï")

    def test_text_with_every_escaped_character_arrives_as_sent(self, target):
        """Text holding each character the bulk statements escape (quote, double quote, backslash, NUL,
        newline, carriage return, Ctrl-Z), alone, together and next to plain text, arrives as sent."""
        target.execute(f"CREATE TABLE {target.qualified('texts')} (id INT PRIMARY KEY, v TEXT, b BLOB)")
        texts = Changes(target.schema, "texts")
        specials = ["'", '"', "\\", "\x00", "\n", "\r", "\x1a"]
        values = ["", "plain", "é ünï", *specials, "".join(specials), "a'b\\c\"d\x00e\nf\rg\x1ah", "\\'", "''",
                  "\\\\", "%s %%"]
        load = target.make_load(chunk_rows=3)
        try:
            load.load(make_batch([read(texts, {"id": i, "v": v, "b": v.encode()}) for i, v in enumerate(values)]))
        finally:
            load.close()
        assert target.rows("texts") == [(i, v, v.encode()) for i, v in enumerate(values)]

    def test_a_prepared_batch_is_sent_as_prepared_and_lands_as_unprepared(self, target, items, monkeypatch):
        """`prepare` merges a batch and builds its statements ahead; `load` of that batch object sends
        them without building any (the target then holds what an unprepared load leaves), and forgets
        them; a batch never loaded does not stay for ever."""
        load = target.make_load(chunk_rows=7)
        try:
            load.load(make_batch([read(items, item(1))]))  # a first load: the sink knows how to escape
            changes = [read(items, item(i, name=f"n'{i}\\")) for i in range(1, 60)]
            changes += [items.update(item(3), **item(3, name="upd")), items.delete(**item(4))]
            batch = make_batch(changes, id=2)
            load.prepare(batch)
            assert len(load.sql.rows.prepared) == 1
            built = []
            original = MysqlRows._texts
            monkeypatch.setattr(MysqlRows, "_texts", lambda *a, **k: built.append(1) or original(*a, **k))
            load.load(batch)
            assert built == [] and len(load.sql.rows.prepared) == 0
            for n in range(3, 3 + 12):  # prepared and never loaded (discarded): at most MAX_PREPARED kept
                load.prepare(make_batch([read(items, item(100 + n))], id=n))
            assert len(load.sql.rows.prepared) == MAX_PREPARED
        finally:
            load.close()
        expected = [(i, "upd" if i == 3 else f"n'{i}\\", 1, None) for i in range(1, 60) if i != 4]
        assert target.rows("items") == expected

    def test_statements_prepared_before_a_ddl_are_not_used_after_it(self, target):
        """A batch prepared before a DDL that makes a column generated is built again at its load
        (the generated column left out), and lands."""
        target.execute(f"CREATE TABLE {target.qualified('gen')} (id INT PRIMARY KEY, a INT, v INT)")
        gen = Changes(target.schema, "gen")
        load = target.make_load()
        try:
            load.load(make_batch([read(gen, {"id": 1, "a": 1, "v": 2})]))
            rows = make_batch([read(gen, {"id": i, "a": i, "v": 2 * i}) for i in range(2, 30)], id=3)
            load.prepare(rows)
            alter = DdlChange(target.schema, "gen", f"ALTER TABLE {target.qualified('gen')} DROP COLUMN v,"
                              " ADD COLUMN v INT AS (a * 2) VIRTUAL")
            load.load(make_batch([alter], id=2))
            load.load(rows)
        finally:
            load.close()
        assert target.rows("gen") == [(i, i, 2 * i) for i in range(1, 30)]

    def test_reads_past_one_statement_are_built_ahead_and_all_applied(self, target, items):
        """A snapshot chunk larger than one statement (`chunk_rows`) goes in several statements, each
        built by a helper thread while the one before runs; every row arrives, and the helper is gone."""
        load = target.make_load(chunk_rows=50)
        try:
            reads = [read(items, item(i, name=f"n{i}")) for i in range(1, 1001)]
            load.load(make_batch(reads))
            load.load(make_batch(reads, id=2))  # replayed: the same rows, no duplicates
        finally:
            load.close()
        rows = target.rows("items")
        assert len(rows) == 1000 and rows[0][:2] == (1, "n1") and rows[-1][:2] == (1000, "n1000")
        assert not [t for t in threading.enumerate() if t.name.endswith("-load-build")]

    def test_a_value_the_builder_cannot_write_fails_the_batch(self, target, items):
        """An error while a helper builds a later statement fails the batch as a LoadError naming the
        table; nothing of it is committed and the helper is gone."""
        load = target.make_load(chunk_rows=10)
        try:
            reads = [read(items, item(i)) for i in range(1, 40)] + [read(items, item(40, qty=float("nan")))]
            with pytest.raises(LoadError, match="items"):
                load.load(make_batch(reads))
        finally:
            load.close()
        assert target.rows("items") == []
        assert not [t for t in threading.enumerate() if t.name.endswith("-load-build")]

    def test_strict_mode_refuses_truncation(self, target, items, load):
        """A value too long for its column fails the batch instead of being truncated."""
        with pytest.raises(LoadError, match="(?i)too long"):
            load.load(make_batch([items.insert(id=1, name="x" * 65, qty=1, note=None)]))
        assert target.rows("items") == []

    def test_zero_id_stays_zero(self, target, load):
        """An AUTO_INCREMENT id of 0 from the source is kept, not replaced by a new id."""
        target.execute(f"CREATE TABLE {target.qualified('auto')} (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
        auto = Changes(target.schema, "auto")
        load.load(make_batch([auto.insert(id=0, v=1)]))
        assert target.rows("auto") == [(0, 1)]

    # -- DDL on MySQL, where every DDL commits

    def test_ddl_replay_after_a_crash_between_ddl_and_position(self, target, items, load):
        """A batch whose DDL committed but whose position did not is replayed: the DDL's
        'already done' error is recognised by the mark written before it, and the rows land."""
        ghosts = Changes(target.schema, "ghosts")
        add = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN extra INT")
        drop = DdlChange(target.schema, "old", f"DROP TABLE `{target.schema}`.`old`")
        target.execute(f"CREATE TABLE {target.qualified('old')} (id INT PRIMARY KEY)")
        batch = make_batch([add, drop, ghosts.insert(id=1), items.insert(**item(1), extra=2)], id=1)
        with pytest.raises(LoadError, match="ghosts"):
            load.load(batch)  # both DDLs committed, then the rows failed: a crash in effect
        assert target.columns("items")[-1] == "extra" and target.columns("old") == []
        assert load.committed() is None
        target.execute(f"CREATE TABLE {target.qualified('ghosts')} (id INT PRIMARY KEY)")
        load.load(batch)
        assert target.rows("items") == [(1, "n", 1, None, 2)] and target.rows("ghosts") == [(1,)]
        assert load.committed() == batch.end

    def test_fencing_without_the_right_to_kill_is_one_clear_line(self, target, items):
        """An account that may not kill the deposed writer's session fails the batch with one line
        naming the right to grant, and writes nothing."""
        user = f"weak_{target.schema}"[:32]
        target.server.query(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
        try:
            target.server.query(f"GRANT ALL ON `{target.schema}`.* TO '{user}'@'%'")
            old = target.make_load()
            old.token = "another-process"
            old.load(make_batch([items.insert(**item(1))], id=1, epoch=1))
            weak = MysqlLoad(attrs.evolve(target.config(), user=user, password="pw"), pipeline="p",
                             **target.load_options(), sleep=lambda seconds: None)
            try:
                with pytest.raises(LoadError, match=r"cannot kill session \d+ of a deposed writer to fence the "
                                                    r"target .*grant the target account CONNECTION ADMIN") as info:
                    weak.load(make_batch([items.insert(**item(2))], id=2, epoch=2))
                assert "\n" not in str(info.value) and info.value.context["pipeline"] == "p"
            finally:
                weak.close()
                old.close()
            assert [r[0] for r in target.rows("items")] == [1]
        finally:
            target.server.query(f"DROP USER '{user}'@'%'")

    def test_ddl_that_fails_without_a_replay_is_an_error(self, target, items, load):
        """Outside a replay, a DDL that cannot run (a column already there) fails its batch."""
        target.execute(f"ALTER TABLE {target.qualified('items')} ADD COLUMN extra INT")
        add = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN extra INT")
        with pytest.raises(LoadError, match="(?i)duplicate column") as info:
            load.load(make_batch([add], id=1))
        assert info.value.context["table"] == f"{target.schema}.items"

    def test_a_failing_position_write_sent_with_the_commit_rolls_the_part_back(self, target, items):
        """The table position write and the COMMIT go as one multi-statement: when the write fails
        the COMMIT does not run, the error is raised, the part's rows are rolled back, and the
        pooled connection loads the next part cleanly."""
        target.execute(f"INSERT INTO {target.qualified('items')} VALUES (1, 'n', 1, NULL)")
        load = target.make_load(max_attempts=1)
        try:
            load.load_part(span([], 4, 104))  # creates the position tables, takes the fence
            target.execute(f"CREATE TRIGGER {target.qualified('no_position')} BEFORE INSERT ON "
                           f"{target.position_table('_table')} FOR EACH ROW "
                           "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'position refused on purpose'")
            part = span([at(items.insert(**item(2)), 200), at(items.update(item(1), qty=5), 200)], 104, 200, id=2)
            with pytest.raises(LoadError, match="position refused on purpose") as info:
                load.load_part(part)
            assert info.value.context["table"] == f"{target.schema}.items"
            assert target.rows("items") == [(1, "n", 1, None)]
            assert target.query(f"SELECT COUNT(*) FROM {target.position_table('_table')}") == [(0,)]
            target.execute(f"DROP TRIGGER {target.qualified('no_position')}")
            load.load_part(part)
            assert target.rows("items") == [(1, "n", 5, None), (2, "n", 1, None)]
        finally:
            load.close()

    def test_a_failing_pipeline_position_write_leaves_the_batch_uncommitted(self, target, items, load):
        """ordered: the batch position write is sent with the COMMIT; when it fails nothing of the
        batch is committed and the error names the batch."""
        load.load(make_batch([items.insert(**item(1))], id=1))
        target.execute(f"CREATE TRIGGER {target.qualified('no_position')} BEFORE UPDATE ON "
                       f"{target.position_table()} FOR EACH ROW "
                       "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'position refused on purpose'")
        with pytest.raises(LoadError, match="position refused on purpose") as info:
            load.load(make_batch([items.insert(**item(2))], id=2))
        assert info.value.context["batch"] == 2
        assert [r[0] for r in target.rows("items")] == [1] and load.committed() == make_batch([], id=1).end

    def test_a_ddl_text_holding_two_statements_is_refused(self, target, items, load):
        """The sink's sessions take several statements at once, so a DDL text with a second
        statement after a semicolon is refused (nothing of it runs); one trailing semicolon is fine."""
        two = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN a INT;"
                                                f" DROP TABLE `{target.schema}`.`items`")
        with pytest.raises(LoadError, match="more than one statement") as info:
            load.load(make_batch([items.insert(**item(1)), two], id=1))
        assert info.value.context["table"] == f"{target.schema}.items"
        assert target.columns("items") == ["id", "name", "qty", "note"]
        one = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN a INT; ")
        load.load(make_batch([items.insert(**item(1)), one], id=1))
        assert target.columns("items")[-1] == "a" and [r[0] for r in target.rows("items")] == [1]


@pytest.mark.parametrize("code, kind", [
    (1213, TransientLoadError), (1205, TransientLoadError), (2013, TransientLoadError), (2006, TransientLoadError),
    (1927, TransientLoadError), (2003, TransientLoadError), (1053, TransientLoadError), (1040, TransientLoadError),
    (1077, TransientLoadError), (1080, TransientLoadError), (1158, TransientLoadError), (1161, TransientLoadError),
    (1146, TargetTableMissing), (1062, LoadError), (1406, TableRefused), (1452, LoadError), (1064, LoadError),
    (1045, LoadError), (1142, TableRefused), (4025, TableRefused), (1048, TableRefused), (1264, TableRefused),
    (1366, TableRefused),
])
def test_driver_errors_are_classified(code, kind):
    """Deadlocks, lock wait timeouts, refused or lost connections and a server shutting down are
    transient; a missing table is named; a value, a CHECK or a table privilege the target refuses is
    the table's (TableRefused: quarantine or pause); anything else (duplicate key, foreign key,
    syntax, login denied) fails the batch."""
    load = MysqlLoad(MysqlTargetConfig(type="mysql"), pipeline="p")
    assert load.sql.classify(pymysql.err.OperationalError(code, "message")) is kind


def test_a_closed_connection_and_a_refused_socket_are_transient():
    """A connection the client already closed, and a refused TCP connection, are transient."""
    load = MysqlLoad(MysqlTargetConfig(type="mysql"), pipeline="p")
    assert load.sql.classify(pymysql.err.InterfaceError(0, "")) is TransientLoadError
    assert load.sql.classify(ConnectionRefusedError()) is TransientLoadError
    assert load.sql.classify(ValueError("not the driver's")) is LoadError


def test_per_table_pipeline_with_a_part_failing_twice_keeps_a_keyless_table_exact(
        mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    """A real per_table pipeline: the keyed table's parts fail twice (a trigger) while the keyless
    table's parts commit; after the scheduler's retries both tables equal the source, no duplicates."""
    start = write_source(mariadb_source, source_db)
    db = f"`{mysql_db}`"
    for statement in (f"CREATE TABLE {db}.k (id INT PRIMARY KEY, v INT NOT NULL)",
                      f"CREATE TABLE {db}.loose (v INT NOT NULL)",
                      # MyISAM: the count survives the rollback of the transaction that fired the trigger
                      f"CREATE TABLE {db}.fails (n INT NOT NULL) ENGINE=MyISAM",
                      f"INSERT INTO {db}.fails VALUES (0)",
                      (f"CREATE TRIGGER {db}.fail_twice BEFORE INSERT ON {db}.k FOR EACH ROW BEGIN"
                       f" UPDATE {db}.fails SET n = n + 1;"
                       f" IF (SELECT n FROM {db}.fails) <= 2 THEN"
                       "  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'failing on purpose'; END IF; END")):
        mariadb_target.query(statement)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="pt", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.(k|loose)", f"{mysql_db}.{{table}}")], load,
              tmp_path, name="pt", settings=PER_TABLE)
    assert mariadb_target.query(f"SELECT n FROM {db}.fails")[0][0] > 2
    assert sorted(mariadb_target.query(f"SELECT * FROM {db}.k")) == \
        sorted(mariadb_source.query(f"SELECT * FROM `{source_db}`.k"))
    assert Counter(mariadb_target.query(f"SELECT v FROM {db}.loose")) == \
        Counter(mariadb_source.query(f"SELECT v FROM `{source_db}`.loose"))
