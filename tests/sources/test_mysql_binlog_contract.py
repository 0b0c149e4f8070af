"""The connector kit's Select contract, on the MySQL binlog source against a real MariaDB."""

from __future__ import annotations

import contextlib

import pytest

from setl.connectors import BuildContext, registry
from setl.model import Op, Position, RowChange, Transaction
from setl.testing.connectors import SelectContract, SourceProbe, TableSpec
from tests.sources.binlog import next_server_id

pytestmark = pytest.mark.timeout(120)



class BinlogProbe(SourceProbe):
    """One fresh database on the shared source server, read from the binlog position before it."""

    def __init__(self, server, database):
        self.server, self.database = server, database
        log, offset = server.query("SHOW MASTER STATUS")[0][:2]
        self.start = str(Position(log, int(offset)))

    @property
    def schema(self):
        return self.database

    def create(self, table: TableSpec):
        self.server.query(f"CREATE TABLE `{table.schema}`.`{table.name}` "
                          "(id INT PRIMARY KEY, name VARCHAR(64), qty INT)")

    def write(self, transactions):
        with contextlib.closing(self.server.connect(autocommit=False)) as conn, conn.cursor() as cur:
            for tx in transactions:
                for change in tx:
                    self._execute(cur, change)
                conn.commit()

    @staticmethod
    def _execute(cur, change: RowChange):
        table = f"`{change.schema}`.`{change.table}`"
        if change.op is Op.INSERT:
            columns = ", ".join(change.after)
            cur.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(change.after))})",
                        tuple(change.after.values()))
        elif change.op is Op.UPDATE:
            assignments = ", ".join(f"{column} = %s" for column in change.after)
            cur.execute(f"UPDATE {table} SET {assignments} WHERE id = %s",
                        (*change.after.values(), change.before["id"]))
        else:
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (change.before["id"],))

    def make_select(self, pipeline="p"):
        config = self.server.source_config(next_server_id(), self.start)
        return registry().source("mysql").create(config, BuildContext(pipeline))

    def owns(self, tx: Transaction) -> bool:
        return any(isinstance(c, RowChange) and c.schema == self.database for c in tx.changes)


class TestBinlogSelectContract(SelectContract):
    """setl's Select contract suite, run against the binlog source."""

    @pytest.fixture
    def probe(self, mariadb_source, source_db):
        return BinlogProbe(mariadb_source, source_db)
