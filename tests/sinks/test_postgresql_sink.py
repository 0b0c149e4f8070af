"""The PostgreSQL sink against a real PostgreSQL server."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from setl.config import PostgresqlTargetConfig
from setl.errors import LoadError
from setl.sinks.postgresql import PostgresLoad
from setl.stages.load import Load
from setl.testing.servers import PostgresServer, free_port, wait_until

from .contract import Changes, SinkContract, Target, make_batch, model_settings


class PostgresTarget(Target):
    def __init__(self, server: PostgresServer, database: str, schema: str = "app") -> None:
        self.server = server
        self.database = database
        self.schema = schema
        self.execute(f'CREATE SCHEMA "{schema}"')

    def execute(self, statement: str) -> None:
        self.server.query(statement, dbname=self.database)

    def qualified(self, table: str) -> str:
        return f'"{self.schema}"."{table}"'

    def rows(self, table: str, order: str = "1") -> list[tuple[Any, ...]]:
        return self.server.query(f"SELECT * FROM {self.qualified(table)} ORDER BY {order}",
                                 dbname=self.database)

    def position_table(self) -> str:
        return "setl.setl_position"

    def make_load(self, pipeline: str = "p", unreachable: bool = False, **options: Any) -> PostgresLoad:
        config = self.server.target_config(self.database)
        if unreachable:
            config = PostgresqlTargetConfig(type="postgresql", port=free_port(), database=self.database)
        options.setdefault("sleep", lambda seconds: None)
        return PostgresLoad(config, pipeline=pipeline, **options)

    def kill_session(self, load: Load) -> None:
        pid = load._conn.info.backend_pid
        assert self.server.query("SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
        wait_until(lambda: not self.server.query("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)),
                   message="the killed backend to exit")


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

    def test_position_table_lives_in_the_target(self, target, items, load):
        """The position row in setl.setl_position holds the batch's end, id and epoch."""
        load.load(make_batch([items.insert(id=1, name="a", qty=None, note=None)], id=3, epoch=2))
        rows = target.server.query('SELECT pipeline, log, "offset", gtid, batch_id, epoch FROM setl.setl_position',
                                   dbname=target.database)
        assert rows == [("p", "mysql-bin.000001", 304, "0-1-3", 3, 2)]

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
