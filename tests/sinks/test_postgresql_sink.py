"""The PostgreSQL sink against a real PostgreSQL server."""

from __future__ import annotations

import contextlib
import datetime
import decimal
from collections import Counter
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from setl.errors import LoadError, RefusedLoadError, TableRefused, TransientLoadError
from setl.model import DdlChange, TableName
from setl.sinks.postgresql import PostgresqlLoad, PostgresqlTargetConfig
from setl.sinks.postgresql_ddl import pg_name
from setl.sinks.postgresql_rows import PostgresqlRows
from setl.sinks.sql_failures import TargetTableMissing
from setl.testing.servers import PostgresServer, free_port
from tests.e2e.replicate import PER_TABLE, replicate, table_rule, write_source
from tests.helpers.locks import postgres_lock_waits

from .contract import Changes, SinkContract, Target, item, make_batch, model_settings, parts, read


class PostgresTarget(Target):
    load_class = PostgresqlLoad
    generated_ddl = "CREATE TABLE {table} (id INT PRIMARY KEY, v INT, d INT GENERATED ALWAYS AS (v * 2) STORED)"

    def __init__(self, server: PostgresServer, database: str, schema: str = "app") -> None:
        self.server = server
        self.database = database
        self.schema = schema
        self.execute(f'CREATE SCHEMA "{schema}"')

    def execute(self, statement: str) -> None:
        self.server.query(statement, dbname=self.database)

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        return self.server.query(statement, dbname=self.database)

    def qualified(self, table: str) -> str:
        return f'"{self.schema}"."{table}"'

    def rows(self, table: str, order: str = "1") -> list[tuple[Any, ...]]:
        return self.server.query(f"SELECT * FROM {self.qualified(table)} ORDER BY {order}",
                                 dbname=self.database)

    def position_table(self, suffix: str = "") -> str:
        return "setl.setl_position" + suffix

    def columns(self, table: str) -> list[str]:
        return [r[0] for r in self.server.query(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
            " ORDER BY ordinal_position", (self.schema, table), dbname=self.database)]

    def config(self, unreachable: bool = False) -> PostgresqlTargetConfig:
        if unreachable:
            return PostgresqlTargetConfig(type="postgresql", port=free_port(), database=self.database)
        return self.server.target_config(self.database)

    def session_id(self, load: PostgresqlLoad) -> int:
        return load.pool.idle[-1].info.backend_pid

    def kill(self, session: int) -> None:
        assert self.server.query("SELECT pg_terminate_backend(%s)", (session,)) == [(True,)]

    @contextlib.contextmanager
    def short_lock_waits(self) -> Iterator[None]:
        self.server.query(f'ALTER DATABASE "{self.database}" SET lock_timeout = \'1s\'')
        try:
            yield
        finally:
            self.server.query(f'ALTER DATABASE "{self.database}" RESET lock_timeout')

    def lock_row(self, table: str, key: int) -> Any:
        conn = self.server.connect(dbname=self.database)
        conn.autocommit = False
        conn.execute(f"SELECT * FROM {self.qualified(table)} WHERE id = %s FOR UPDATE", (key,))
        return conn

    def read_in_transaction(self, qualified: str) -> Any:
        conn = self.server.connect(dbname=self.database)
        conn.autocommit = False
        conn.execute(f"SELECT * FROM {qualified}")
        return conn

    def table_lock_waiters(self) -> int:
        return int(self.server.query("SELECT COUNT(*) FROM pg_locks WHERE NOT granted AND locktype = 'relation'"
                                     " AND database = (SELECT oid FROM pg_database WHERE datname = %s)",
                                     (self.database,))[0][0])

    def session_alive(self, session: int) -> bool:
        return bool(self.server.query("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (session,)))

    def lock_waits(self, holder: Any) -> int:
        return postgres_lock_waits(self.server, holder)

    def create_old_position_table(self, log: str, offset: int, epoch: int) -> None:
        self.execute("CREATE SCHEMA IF NOT EXISTS setl")
        self.execute(f'CREATE TABLE {self.position_table()} (pipeline text PRIMARY KEY, log text NOT NULL,'
                     ' "offset" bigint NOT NULL, gtid text, batch_id bigint NOT NULL, epoch bigint NOT NULL,'
                     ' updated_at timestamptz NOT NULL DEFAULT now())')
        self.execute(f"INSERT INTO {self.position_table()} (pipeline, log, \"offset\", batch_id, epoch)"
                     f" VALUES ('p', '{log}', {offset}, 5, {epoch})")


class TestPostgresSink(SinkContract):
    """The shared SQL sink contract, on PostgreSQL."""

    @pytest.fixture
    def target(self, postgres_server, postgres_db) -> PostgresTarget:
        return PostgresTarget(postgres_server, postgres_db)

    @model_settings
    @given(data=st.data())
    def test_random_sequences_match_a_dict_model(self, target, items, load, data):
        """Random changes cut into random batches leave the table equal to a dict model."""
        self.check_random_sequences(target, items, load, data)

    def test_values_round_trip(self, target, load):
        """bytea, numeric, timestamps, dates, intervals, jsonb and text values arrive intact."""
        target.execute(f"CREATE TABLE {target.qualified('typed')} (id bigint PRIMARY KEY, b bytea,"
                       " d numeric(12,4), ts timestamp, tz timestamptz, day date, t interval, j jsonb,"
                       " f double precision, u text, flag boolean)")
        typed = Changes(target.schema, "typed")
        row = {"id": 2**40, "b": b"\x00\xff", "d": decimal.Decimal("12.3400"),
               "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, 600000),
               "tz": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
               "day": datetime.date(2024, 2, 29), "t": datetime.timedelta(hours=-1, seconds=5),
               "j": {"k": [1, "é"]}, "f": 0.5, "u": "ünï", "flag": True}
        load.load(make_batch([typed.insert(**row)]))
        (got,) = target.rows("typed")
        assert got == tuple(row.values())

    def test_a_prepared_batch_is_sent_as_prepared_and_lands_as_unprepared(self, target, items, monkeypatch):
        """`prepare` merges a batch and builds its ``COPY`` rows ahead; `load` of that batch object
        copies them without building any, the target holding what an unprepared load leaves (reads
        by ``COPY``, a small group by INSERT, an update and a delete), and forgets them."""
        load = target.make_load(copy_rows=20)
        try:
            changes = [read(items, item(i, name=f"n{i}")) for i in range(1, 60)]
            changes += [items.update(item(3, name="n3"), **item(3, name="upd")), items.delete(**item(4, name="n4")),
                        read(items, {"id": 70, "name": "short"})]  # another shape: a group of one
            batch = make_batch(changes)
            load.prepare(batch)
            assert len(load.sql.rows.prepared) == 1
            built = []
            original = PostgresqlRows._copy_rows
            monkeypatch.setattr(PostgresqlRows, "_copy_rows",
                                staticmethod(lambda *a: built.append(1) or original(*a)))
            load.load(batch)
            assert built == [] and len(load.sql.rows.prepared) == 0
            load.load(make_batch([read(items, item(i, name="again")) for i in range(80, 110)], id=2))
            assert built == [1]  # not prepared: built at its load
        finally:
            load.close()
        expected = [(i, "upd" if i == 3 else f"n{i}", 1, None) for i in range(1, 60) if i != 4]
        expected += [(70, "short", None, None)] + [(i, "again", 1, None) for i in range(80, 110)]
        assert target.rows("items") == expected

    def test_a_chunk_of_reads_is_copied_straight_into_its_table_and_a_replay_upserts(self, target, items,
                                                                                   monkeypatch):
        """A prepared batch of snapshot reads only goes by one ``COPY`` into the table (no staged
        upsert); the same batch replayed over its own rows meets them, is rolled back to its
        savepoint and upserted (nothing doubled, the newer values kept); the table is then not
        tried straight again. A batch mixing reads and other changes is staged as before."""
        load = target.make_load(copy_rows=20)
        staged = []
        original = PostgresqlRows._copy_upsert
        monkeypatch.setattr(PostgresqlRows, "_copy_upsert", lambda *a: staged.append(1) or original(*a))
        try:
            first = make_batch([read(items, item(i, name=f"n{i}")) for i in range(1, 41)])
            load.prepare(first)
            load.load(first)
            assert staged == [] and load.sql.rows.collided == set()
            again = make_batch([read(items, item(i, name=f"r{i}")) for i in range(1, 41)], id=2)
            load.prepare(again)
            load.load(again)
            assert staged == [1] and load.sql.rows.collided == {(target.schema, "items")}
            later = make_batch([read(items, item(i, name="later")) for i in range(50, 80)], id=3)
            load.prepare(later)
            load.load(later)
            assert staged == [1, 1]  # not tried straight again
        finally:
            load.close()
        expected = [(i, f"r{i}", 1, None) for i in range(1, 41)] + [(i, "later", 1, None) for i in range(50, 80)]
        assert target.rows("items") == expected
        mixed = target.make_load(copy_rows=20)
        staged.clear()
        try:
            batch = make_batch([read(items, item(i, name="m")) for i in range(100, 130)]
                               + [items.update(item(1, name="r1"), **item(1, name="u"))], id=4)
            mixed.prepare(batch)
            mixed.load(batch)
        finally:
            mixed.close()
        assert staged == [1]
        assert target.rows("items")[0] == (1, "u", 1, None) and len(target.rows("items")) == 100

    def test_per_table_parts_of_chunks_are_copied_straight_and_a_replayed_part_upserts(self, target, items,
                                                                                        monkeypatch):
        """load.mode per_table: a table's part of a chunk batch goes by one ``COPY`` straight into the
        table in its own transaction (no staged upsert); a part replayed over its rows is rolled back to
        its savepoint and upserted (nothing doubled, the newer values kept)."""
        load = target.make_load(copy_rows=20)
        staged = []
        original = PostgresqlRows._copy_upsert
        monkeypatch.setattr(PostgresqlRows, "_copy_upsert", lambda *a: staged.append(1) or original(*a))
        try:
            for n, (low, name) in enumerate([(1, "n"), (41, "n"), (21, "r")]):
                batch = make_batch([read(items, item(i, name=f"{name}{i}")) for i in range(low, low + 40)], id=1 + n)
                (part,) = parts(batch)
                load.load_part(part)
                load.mark_loaded(batch)
                assert staged == ([] if n < 2 else [1]), n
            assert load.committed() == batch.end
        finally:
            load.close()
        expected = [(i, f"n{i}" if i < 21 or i > 60 else f"r{i}", 1, None) for i in range(1, 81)]
        assert target.rows("items") == expected

    def test_only_a_plain_unique_index_on_exactly_the_key_allows_a_straight_copy(self, target):
        """The catalog check behind the straight ``COPY``: the primary key or a unique index on the key
        columns (in any order) counts; no index, a wider or partial one, or a deferrable key does not."""
        from setl.sinks.postgresql_copy import unique_on_key

        cases = {
            "pk": ("CREATE TABLE {t} (a int, b int, PRIMARY KEY (b, a))", True),
            "uniq": ("CREATE TABLE {t} (a int, b int); CREATE UNIQUE INDEX ON {t} (a, b)", True),
            "none": ("CREATE TABLE {t} (a int, b int)", False),
            "wider": ("CREATE TABLE {t} (a int, b int, c int, PRIMARY KEY (a, b, c))", False),
            "partial": ("CREATE TABLE {t} (a int, b int); CREATE UNIQUE INDEX ON {t} (a, b) WHERE a > 0", False),
            "deferred": ("CREATE TABLE {t} (a int, b int, PRIMARY KEY (a, b) DEFERRABLE INITIALLY DEFERRED)",
                         False),
        }
        for name, (ddl, _) in cases.items():
            for statement in ddl.format(t=target.qualified(name)).split("; "):
                target.execute(statement)
        target.execute(f'CREATE TABLE {target.qualified("mixed")} ("Y" int, "_x" int, PRIMARY KEY ("_x", "Y"))')
        with contextlib.closing(target.server.connect(dbname=target.database)) as conn:
            found = {name: unique_on_key(conn, target.qualified(name), ("a", "b")) for name in cases}
            # key names whose order differs between code points and a language collation
            assert unique_on_key(conn, target.qualified("mixed"), ("Y", "_x"))
        assert found == {name: expected for name, (_, expected) in cases.items()}

    def test_names_with_percent_dollar_and_quote_load_through_native_placeholders(self, target, load):
        """Keyed deletes and multi-row upserts (sent with $n placeholders) reach a table and columns
        whose names hold %, %s, $1 and a double quote."""
        table = 'odd%s$1"t'
        quoted = '"' + table.replace('"', '""') + '"'
        target.execute(f'CREATE TABLE "{target.schema}".{quoted} ("k%" int PRIMARY KEY, "v$1" text,'
                       ' "q""%%s" int)')
        odd = Changes(target.schema, table, key=("k%",))
        rows = [{"k%": i, "v$1": f"v{i}%s$1", "q\"%%s": i * 2} for i in range(5)]
        load.load(make_batch([odd.insert(**r) for r in rows], id=1))
        load.load(make_batch([odd.update(rows[1], **{**rows[1], "v$1": "new"}), odd.delete(**rows[2])], id=2))
        got = target.query(f'SELECT * FROM "{target.schema}".{quoted} ORDER BY 1')
        assert got == [(0, "v0%s$1", 0), (1, "new", 2), (3, "v3%s$1", 6), (4, "v4%s$1", 8)]

    def test_names_over_63_bytes_load_under_their_mapped_names(self, target):
        """Names longer than 63 bytes (`pg_name`: cut plus a hash), two of them equal in their first
        63 bytes: keyed upserts by COPY and by INSERT, updates and deletes, and a keyless table's
        COPY, INSERT and ctid deletes all reach the mapped table and columns."""
        table, first, second = "t" * 64, "k" * 63 + "1", "é" * 32 + "2"
        mapped = [pg_name(n) for n in (table, first, second)]
        assert len(set(mapped)) == 3 and all(len(m.encode()) <= 63 for m in mapped)
        for name, key in ((table, " PRIMARY KEY"), (table[:-1] + "u", "")):
            target.execute(f'CREATE TABLE "{target.schema}"."{pg_name(name)}" ("{mapped[1]}" int{key}, '
                           f'"{mapped[2]}" text, "{pg_name("k" * 63 + "2")}" int)')
        load = target.make_load(copy_rows=3)
        try:
            for base, name, key in ((0, table, (first,)), (3, table[:-1] + "u", ())):
                changes = Changes(target.schema, name, key=key)
                rows = [{first: i, second: f"v{i}", "k" * 63 + "2": -i} for i in range(6)]
                load.load(make_batch([read(changes, r) for r in rows], id=base + 1))
                load.load(make_batch([changes.insert(**{first: 9, second: "x", "k" * 63 + "2": 0})], id=base + 2))
                load.load(make_batch([changes.update(rows[1], **{second: "new"}), changes.delete(**rows[2])],
                                     id=base + 3))
                got = target.query(f'SELECT * FROM "{target.schema}"."{pg_name(name)}" ORDER BY 1')
                assert got == [(0, "v0", 0), (1, "new", -1), (3, "v3", -3), (4, "v4", -4), (5, "v5", -5), (9, "x", 0)]
        finally:
            load.close()

    def test_json_list_and_text_into_typed_columns(self, target, load):
        """A list goes to a jsonb column; strings reach int, uuid and date columns by the column's type."""
        target.execute(f"CREATE TABLE {target.qualified('mixed')} (id uuid PRIMARY KEY, n int, j jsonb, day date)")
        mixed = Changes(target.schema, "mixed")
        key = "8a3c3f1e-2b7c-4a39-9d2a-0c4e4d1b2a11"
        load.load(make_batch([mixed.insert(id=key, n="42", j=[1, 2], day="2024-03-01")], id=1))
        load.load(make_batch([mixed.delete(id=key, n="42", j=[1, 2], day="2024-03-01")], id=2))
        assert target.rows("mixed") == []

    def test_missing_schema_is_named(self, target, load):
        """A change for a schema that does not exist fails with an error naming schema and table."""
        nowhere = Changes("nowhere", "t")
        with pytest.raises(LoadError, match="nowhere.t"):
            load.load(make_batch([nowhere.insert(id=1)]))

    # -- DDL on PostgreSQL, translated and transactional

    def test_fencing_without_the_right_to_terminate_is_one_clear_line(self, target, items):
        """A role that may not terminate the deposed writer's backend (a superuser's) fails the batch
        with one line naming the right to grant, and writes nothing."""
        role = f"weak_{target.database}"[:60]
        old = target.make_load()
        old.token = "another-process"
        old.load(make_batch([items.insert(**item(1))], id=1, epoch=1))
        for statement in (f'CREATE ROLE "{role}" LOGIN', f'GRANT USAGE ON SCHEMA setl, app TO "{role}"',
                          f'GRANT ALL ON ALL TABLES IN SCHEMA setl, app TO "{role}"'):
            target.execute(statement)
        weak = PostgresqlLoad(attrs.evolve(target.config(), user=role), pipeline="p", sleep=lambda seconds: None)
        try:
            with pytest.raises(LoadError, match=r"cannot terminate the sessions of a deposed writer to fence "
                                                r"the target .*pg_signal_backend") as info:
                weak.load(make_batch([items.insert(**item(2))], id=2, epoch=2))
            assert "\n" not in str(info.value) and info.value.context["pipeline"] == "p"
        finally:
            weak.close()
            old.close()
            target.execute(f'DROP OWNED BY "{role}"')
            target.execute(f'DROP ROLE "{role}"')
        assert [r[0] for r in target.rows("items")] == [1]

    def test_ddl_rolls_back_with_its_batch(self, target, items, load):
        """A DDL runs inside its batch's transaction: when a later row fails, the DDL is undone."""
        add = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN extra INT")
        bad = items.insert(**item(2, name=None))
        with pytest.raises(LoadError):
            load.load(make_batch([items.insert(**item(1)), add, bad], id=1))
        assert target.columns("items") == ["id", "name", "qty", "note"] and target.rows("items") == []

    def test_create_table_maps_mysql_types(self, target, load):
        """CREATE TABLE arrives with each MySQL type mapped to its PostgreSQL counterpart."""
        load.load(make_batch([DdlChange(target.schema, "typed", (
            f"CREATE TABLE `{target.schema}`.`typed` (id BIGINT UNSIGNED NOT NULL, i INT UNSIGNED, "
            "t TINYINT, d DECIMAL(65,30), f FLOAT, x DOUBLE, day DATE, tm TIME(3), dt DATETIME(6), "
            "ts TIMESTAMP(6) NULL, y YEAR, c CHAR(3), b VARBINARY(9), e ENUM('a','b'), s SET('a','b'), "
            "bits BIT(5), j JSON, txt MEDIUMTEXT, PRIMARY KEY (id)) ENGINE=InnoDB"))]))
        types = dict(target.server.query(
            "SELECT column_name, format_type(atttypid, atttypmod) FROM information_schema.columns c"
            " JOIN pg_attribute a ON a.attrelid = %s::regclass AND a.attname = c.column_name"
            " WHERE table_schema = %s AND table_name = 'typed'",
            (f'"{target.schema}"."typed"', target.schema), dbname=target.database))
        assert types == {
            "id": "numeric(20,0)", "i": "bigint", "t": "smallint", "d": "numeric(65,30)", "f": "real",
            "x": "double precision", "day": "date", "tm": "interval", "dt": "timestamp(6) without time zone",
            "ts": "timestamp(6) with time zone", "y": "smallint", "c": "character varying(3)", "b": "bytea",
            "e": "text", "s": "text", "bits": "bigint", "j": "jsonb", "txt": "text"}

    def test_untranslatable_ddl_is_refused(self, target, items, load):
        """A DDL the translation does not handle fails naming the statement; nothing is applied."""
        ddl = DdlChange(target.schema, "items", f"ALTER TABLE `{target.schema}`.`items` ADD COLUMN g VECTOR(3)")
        with pytest.raises(LoadError, match="cannot translate .*VECTOR") as info:
            load.load(make_batch([items.insert(**item(1)), ddl]))
        assert info.value.context["table"] == f"{target.schema}.items"
        assert target.rows("items") == []


@pytest.mark.parametrize("error, kind", [
    (psycopg.errors.DeadlockDetected, TransientLoadError), (psycopg.errors.SerializationFailure, TransientLoadError),
    (psycopg.errors.LockNotAvailable, TransientLoadError), (psycopg.errors.AdminShutdown, TransientLoadError),
    (psycopg.errors.CrashShutdown, TransientLoadError), (psycopg.errors.CannotConnectNow, TransientLoadError),
    (psycopg.errors.TooManyConnections, TransientLoadError), (psycopg.errors.ConnectionFailure, TransientLoadError),
    (psycopg.errors.UndefinedTable, TargetTableMissing), (psycopg.errors.UniqueViolation, LoadError),
    (psycopg.errors.NotNullViolation, TableRefused), (psycopg.errors.InsufficientPrivilege, TableRefused),
    (psycopg.errors.CheckViolation, TableRefused), (psycopg.errors.StringDataRightTruncation, TableRefused),
    (psycopg.errors.NumericValueOutOfRange, TableRefused), (psycopg.errors.UndefinedColumn, TableRefused),
    (psycopg.errors.ForeignKeyViolation, LoadError),
    (psycopg.errors.SyntaxError, LoadError), (psycopg.errors.QueryCanceled, LoadError),
])
def test_driver_errors_are_classified(error, kind):
    """Deadlocks, serialization failures, lock timeouts, lost or refused connections and a server
    shutting down or starting up are transient; a missing table is named; a value, a constraint, a
    column or a privilege the target refuses is the table's (TableRefused: quarantine or pause);
    anything else (a foreign key, a duplicate key, syntax) fails the batch."""
    load = PostgresqlLoad(PostgresqlTargetConfig(type="postgresql"), pipeline="p")
    assert load.sql.classify(error("message")) is kind


def test_a_connection_lost_before_the_server_answered_is_transient():
    """An OperationalError without SQLSTATE (connection refused or broken) is transient."""
    load = PostgresqlLoad(PostgresqlTargetConfig(type="postgresql"), pipeline="p")
    assert load.sql.classify(psycopg.OperationalError("connection refused")) is TransientLoadError
    assert load.sql.classify(psycopg.errors.DataError("bad value")) is LoadError


def test_per_table_pipeline_with_a_part_failing_twice_keeps_a_keyless_table_exact(
        mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    """A real per_table pipeline into PostgreSQL: the keyed table's parts fail twice (a trigger)
    while the keyless table's parts commit; after the scheduler's retries both tables equal the
    source, no duplicates."""
    start = write_source(mariadb_source, source_db)
    for statement in ("CREATE SCHEMA app",
                      "CREATE TABLE app.k (id INT PRIMARY KEY, v INT NOT NULL)",
                      "CREATE TABLE app.loose (v INT NOT NULL)",
                      "CREATE SEQUENCE app.fails",  # nextval survives the rollback of its transaction
                      ("CREATE FUNCTION app.fail_twice() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                       " IF nextval('app.fails') <= 2 THEN RAISE EXCEPTION 'failing on purpose'; END IF;"
                       " RETURN NEW; END $$"),
                      "CREATE TRIGGER fail_twice BEFORE INSERT ON app.k FOR EACH ROW"
                      " EXECUTE FUNCTION app.fail_twice()"):
        postgres_server.query(statement, dbname=postgres_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="pt")
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.(k|loose)", "app.{table}")], load,
              tmp_path, name="pt", settings=PER_TABLE)
    assert postgres_server.query("SELECT last_value FROM app.fails", dbname=postgres_db)[0][0] > 2
    assert sorted(postgres_server.query("SELECT * FROM app.k", dbname=postgres_db)) == \
        sorted(mariadb_source.query(f"SELECT * FROM `{source_db}`.k"))
    assert Counter(postgres_server.query("SELECT v FROM app.loose", dbname=postgres_db)) == \
        Counter(mariadb_source.query(f"SELECT v FROM `{source_db}`.loose"))


def test_native_placeholders_number_each_s_and_undouble_percent():
    """`native` turns each %s into $1, $2, ... in order and %% into %, and refuses any other % placeholder."""
    from setl.sinks.postgresql import native

    assert native('INSERT INTO "a%%s" ("x%%") VALUES (%s, %s), (%s, %s)') == \
        'INSERT INTO "a%s" ("x%") VALUES ($1, $2), ($3, $4)'
    assert native("%%%s%%%%s") == "%$1%%s"
    with pytest.raises(ValueError):
        native("SELECT %d")


def test_a_switch_without_session_replication_role_refuses_a_table_a_foreign_key_refers_to(postgres_server,
                                                                                          postgres_db):
    """A role that may not set session_replication_role switches a re-copied table no foreign key
    refers to, and is refused with one line naming the table and position when one does (the switch's
    DELETE would fire the key's cascade): the table and its child keep their rows."""
    role = "r_no_replica_role"
    postgres_server.query(f'CREATE ROLE "{role}" LOGIN')
    try:
        postgres_server.query(f'GRANT CONNECT, CREATE ON DATABASE "{postgres_db}" TO "{role}"')
        with postgres_server.connect(dbname=postgres_db, user=role) as conn:
            conn.execute("CREATE SCHEMA app")
            conn.execute("CREATE TABLE app.parent (id INT PRIMARY KEY, v INT)")
            conn.execute("CREATE TABLE app.child (id INT PRIMARY KEY, pid INT REFERENCES app.parent ON DELETE CASCADE)")
            conn.execute("CREATE TABLE app.loose (id INT PRIMARY KEY, v INT)")
            conn.execute("INSERT INTO app.parent VALUES (1, 1)")
            conn.execute("INSERT INTO app.child VALUES (1, 1)")
            conn.execute("INSERT INTO app.loose VALUES (1, 1)")
        load = PostgresqlLoad(attrs.evolve(postgres_server.target_config(postgres_db), user=role), pipeline="p",
                              sleep=lambda seconds: None)
        load.open()
        try:
            for offset, name in ((0, "loose"), (3, "parent")):
                table = Changes("app", name)
                load.load(make_batch([DdlChange("app", name, f"TRUNCATE TABLE `app`.`{name}`", snapshot=True)],
                                     id=offset + 1))
                load.load(make_batch([read(table, {"id": 2, "v": 2})], id=offset + 2))
            load.load(make_batch([DdlChange.end_of_copy(TableName("app", "loose"), None)], id=3))
            assert postgres_server.query("SELECT * FROM app.loose", dbname=postgres_db) == [(2, 2)]
            with pytest.raises(RefusedLoadError) as refused:
                load.load(make_batch([DdlChange.end_of_copy(TableName("app", "parent"), None)], id=6))
        finally:
            load.close()
        line = str(refused.value)
        assert "a foreign key refers to it" in line and "table=app.parent" in line and "position=" in line, line
        assert "\n" not in line
        assert postgres_server.query("SELECT * FROM app.parent", dbname=postgres_db) == [(1, 1)]
        assert postgres_server.query("SELECT * FROM app.child", dbname=postgres_db) == [(1, 1)]
    finally:
        postgres_server.query(f'DROP OWNED BY "{role}" CASCADE', dbname=postgres_db)
        postgres_server.query(f'DROP ROLE "{role}"')
