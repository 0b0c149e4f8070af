"""The MySQL/MariaDB sink against a real MariaDB server."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from setl.config import MysqlTargetConfig
from setl.errors import LoadError
from setl.sinks.mysql import MySQLLoad
from setl.stages.load import Load
from setl.testing.servers import MariaDBServer, free_port, wait_until

from .contract import Changes, SinkContract, Target, make_batch, model_settings


class MySQLTarget(Target):
    def __init__(self, server: MariaDBServer, database: str) -> None:
        self.server = server
        self.schema = database

    def execute(self, statement: str) -> None:
        self.server.query(statement)

    def qualified(self, table: str) -> str:
        return f"`{self.schema}`.`{table}`"

    def rows(self, table: str, order: str = "1") -> list[tuple[Any, ...]]:
        return self.server.query(f"SELECT * FROM {self.qualified(table)} ORDER BY {order}")

    def position_table(self) -> str:
        return self.qualified("setl_position")

    def make_load(self, pipeline: str = "p", unreachable: bool = False, **options: Any) -> MySQLLoad:
        config = self.server.target_config()
        if unreachable:
            config = MysqlTargetConfig(type="mysql", host="127.0.0.1", port=free_port())
        options.setdefault("sleep", lambda seconds: None)
        return MySQLLoad(config, pipeline=pipeline, position_schema=self.schema, **options)

    def kill_session(self, load: Load) -> None:
        thread_id = load._conn.thread_id()
        self.server.query(f"KILL CONNECTION {thread_id}")
        wait_until(lambda: not self.server.query(
            "SELECT 1 FROM information_schema.processlist WHERE id = %s", (thread_id,)),
            message="the killed session to disappear")


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

    def test_position_table_lives_in_the_target(self, target, items, load):
        """The position row holds the batch's end, id and epoch, written by the batch itself."""
        load.load(make_batch([items.insert(id=1, name="a", qty=None, note=None)], id=3, epoch=2))
        rows = target.server.query(
            f"SELECT pipeline, log, `offset`, gtid, batch_id, epoch FROM {target.position_table()}")
        assert rows == [("p", "mysql-bin.000001", 304, "0-1-3", 3, 2)]

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
