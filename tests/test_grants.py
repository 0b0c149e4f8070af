"""The grants docs/grants.md lists are enough: least-privilege accounts made on the real servers run
a pipeline (binlog, DDL, rows, position tables) and fence a deposed writer of another account, and
the source fails with one line when a listed grant is missing."""

from __future__ import annotations

import contextlib
import uuid

import attrs
import pymysql
import pytest

from setl.errors import LoadError
from setl.model import Op, RowChange
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.testing.connectors import make_batch
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, postgres_target
from tests.e2e.test_bad_input import error_line

pytestmark = pytest.mark.timeout(300)

PASSWORD = "Least-priv1"

# What docs/grants.md gives each account (MariaDB 10.5+ names).
SOURCE_GRANTS = ("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO {user}",
                 "GRANT SELECT ON `{db}`.* TO {user}")
TARGET_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, CREATE TEMPORARY TABLES"
TARGET_GRANTS = (f"GRANT {TARGET_PRIVILEGES} ON `setl`.* TO {{user}}",
                 f"GRANT {TARGET_PRIVILEGES} ON `{{db}}`.* TO {{user}}")
FENCING_GRANT = "GRANT CONNECTION ADMIN ON *.* TO {user}"


@contextlib.contextmanager
def mysql_account(server, grants, **names):
    """A fresh account `u_...`@'%' with `grants` (formatted with `user` and `names`); dropped after."""
    name = f"u_{uuid.uuid4().hex[:10]}"
    user = f"'{name}'@'%'"
    server.query(f"CREATE USER {user} IDENTIFIED BY '{PASSWORD}'")
    try:
        for grant in grants:
            server.query(grant.format(user=user, **names))
        yield name
    finally:
        server.query(f"DROP USER {user}")


@contextlib.contextmanager
def postgres_role(server, database: str, *statements: str):
    """A fresh LOGIN role with CREATE on `database` and `statements` (formatted with `role`)."""
    role = f"r_{uuid.uuid4().hex[:10]}"
    server.query(f'CREATE ROLE "{role}" LOGIN PASSWORD \'{PASSWORD}\'')
    try:
        server.query(f'GRANT CONNECT, CREATE ON DATABASE "{database}" TO "{role}"')
        for statement in statements:
            server.query(statement.format(role=f'"{role}"'), dbname=database)
        yield role
    finally:
        server.query(f'DROP OWNED BY "{role}" CASCADE', dbname=database)
        server.query(f'REVOKE ALL ON DATABASE "{database}" FROM "{role}"')
        server.query(f'DROP ROLE "{role}"')


def write_source(server, db: str) -> None:
    """A table created, filled, altered and updated on the source: DDL and rows to replicate."""
    with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE `{db}`.items (id INT PRIMARY KEY, v VARCHAR(20))")
        cur.executemany(f"INSERT INTO `{db}`.items VALUES (%s, %s)", [(i, f"v{i}") for i in range(1, 6)])
        cur.execute(f"ALTER TABLE `{db}`.items ADD COLUMN n INT")
        cur.execute(f"UPDATE `{db}`.items SET n = id * 10 WHERE id <= 2")
        cur.execute(f"DELETE FROM `{db}`.items WHERE id = 5")


EXPECTED = [(1, "v1", 10), (2, "v2", 20), (3, "v3", None), (4, "v4", None)]


def pipeline(tmp_path, source: dict, target: dict, source_db: str, target_db: str) -> SetlProcess:
    return SetlProcess(tmp_path, source=source, target=target,
                       tables=[{"source": rf"{source_db}\..*", "target": f"{target_db}.{{table}}"}],
                       pipeline={"batch": {"max_wait_ms": 50},
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20}})


def test_least_privileged_source_account_replicates(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """A source account with only REPLICATION SLAVE, BINLOG MONITOR and SELECT on the replicated
    schema reads the binlog, DDL and rows included."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    with mysql_account(mariadb_source, SOURCE_GRANTS, db=source_db) as user:
        source = mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset}, user=user,
                              password=PASSWORD)
        setl = pipeline(tmp_path, source, mysql_target(mariadb_target), source_db, mysql_db)
        result = setl.start_until_caught_up()
        assert result.returncode == 0, result.stderr[-3000:]
    assert mariadb_target.query(f"SELECT id, v, n FROM `{mysql_db}`.items ORDER BY id") == EXPECTED


@pytest.mark.parametrize(("left_out", "message"), [
    ("REPLICATION SLAVE", "REPLICATION SLAVE"),
    ("BINLOG MONITOR", "BINLOG MONITOR"),
])
def test_source_account_missing_a_grant_fails_with_one_line(tmp_path, mariadb_source, source_db, left_out,
                                                            message):
    """Each global grant of the source account is needed: without it `setl start` stops with one
    line naming the pipeline, the select stage and the privilege."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    grants = [g.replace(f"{left_out}, ", "").replace(f", {left_out}", "") for g in SOURCE_GRANTS]
    with mysql_account(mariadb_source, grants, db=source_db) as user:
        source = mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset}, user=user,
                              password=PASSWORD)
        setl = pipeline(tmp_path, source, {"type": "sqlite", "path": str(tmp_path / "t.db")}, source_db, "main")
        line = error_line(setl.start_until_caught_up())
    assert f"pipeline={setl.name}" in line and "stage=select" in line and message in line, line


def test_least_privileged_mysql_target_account_loads_ddl_and_rows(tmp_path, mariadb_source, mariadb_target,
                                                                  source_db, mysql_db):
    """A MariaDB target account with table privileges on `setl` and the target schema only creates
    the position tables and the replicated table, applies DDL and rows."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    mariadb_target.query(f"DROP DATABASE `{mysql_db}`")  # the replicated CREATE TABLE makes it
    with mysql_account(mariadb_target, TARGET_GRANTS, db=mysql_db) as user:
        source = mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset})
        target = mysql_target(mariadb_target, user=user, password=PASSWORD)
        setl = pipeline(tmp_path, source, target, source_db, mysql_db)
        result = setl.start_until_caught_up()
        assert result.returncode == 0, result.stderr[-3000:]
    assert mariadb_target.query(f"SELECT id, v, n FROM `{mysql_db}`.items ORDER BY id") == EXPECTED


def _insert(schema: str, id: int) -> RowChange:
    return RowChange(Op.INSERT, schema, "items", ("id",), None, {"id": id, "v": f"v{id}"})


def test_mysql_target_accounts_fence_each_other_with_connection_admin(mariadb_target, mysql_db):
    """A node's target account with CONNECTION ADMIN kills the session of a deposed writer that
    uses another account; the deposed writer's next batch is refused."""
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.items (id INT PRIMARY KEY, v VARCHAR(20))")
    grants = (*TARGET_GRANTS, FENCING_GRANT)
    with mysql_account(mariadb_target, grants, db=mysql_db) as old_user, \
            mysql_account(mariadb_target, grants, db=mysql_db) as new_user:
        config = mariadb_target.target_config()
        old = MysqlLoad(attrs.evolve(config, user=old_user, password=PASSWORD), pipeline="fence",
                        sleep=lambda seconds: None)
        old.token = "another-process"
        new = MysqlLoad(attrs.evolve(config, user=new_user, password=PASSWORD), pipeline="fence",
                        sleep=lambda seconds: None)
        try:
            old.load(make_batch([_insert(mysql_db, 1)], id=1, epoch=1, pipeline="fence"))
            new.load(make_batch([_insert(mysql_db, 2)], id=2, epoch=2, pipeline="fence"))
            with pytest.raises(LoadError, match="older than epoch 2"):
                old.load(make_batch([_insert(mysql_db, 3)], id=3, epoch=1, pipeline="fence"))
        finally:
            old.close()
            new.close()
            with contextlib.suppress(pymysql.MySQLError):
                mariadb_target.query("DELETE FROM setl.setl_position_session WHERE pipeline = 'fence'")
    assert mariadb_target.query(f"SELECT id FROM `{mysql_db}`.items ORDER BY id") == [(1,), (2,)]


def test_least_privileged_postgresql_target_role_loads_ddl_and_rows(tmp_path, mariadb_source, postgres_server,
                                                                    source_db, postgres_db):
    """A PostgreSQL role with only CONNECT and CREATE on its database creates the setl schema, the
    target schema and table, applies DDL and rows."""
    start = binlog_head(mariadb_source)
    write_source(mariadb_source, source_db)
    with postgres_role(postgres_server, postgres_db) as role:
        source = mysql_source(mariadb_source, start={"file": start.log, "pos": start.offset})
        target = {**postgres_target(postgres_server, postgres_db), "user": role, "password": PASSWORD}
        setl = pipeline(tmp_path, source, target, source_db, "replica")
        result = setl.start_until_caught_up()
        assert result.returncode == 0, result.stderr[-3000:]
        rows = postgres_server.query("SELECT id, v, n FROM replica.items ORDER BY id", dbname=postgres_db)
    assert rows == EXPECTED


def test_postgresql_target_roles_fence_each_other_with_pg_signal_backend(postgres_server, postgres_db):
    """A role granted pg_signal_backend terminates the backend of a deposed writer that uses another
    role; the deposed writer's next batch is refused."""
    postgres_server.query("CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, v text)",
                          dbname=postgres_db)
    table_grants = ('GRANT USAGE ON SCHEMA app TO {role}',
                    'GRANT SELECT, INSERT, UPDATE, DELETE ON app.items TO {role}', 'GRANT pg_signal_backend TO {role}')
    with postgres_role(postgres_server, postgres_db, *table_grants) as old_role, \
            postgres_role(postgres_server, postgres_db, *table_grants) as new_role:
        # The first role creates schema setl; the other needs the rights of a second node's role on it.
        config = attrs.evolve(postgres_server.target_config(postgres_db), password=PASSWORD)
        old = PostgresqlLoad(attrs.evolve(config, user=old_role), pipeline="fence", sleep=lambda seconds: None)
        old.token = "another-process"
        new = PostgresqlLoad(attrs.evolve(config, user=new_role), pipeline="fence", sleep=lambda seconds: None)
        try:
            old.load(make_batch([_insert("app", 1)], id=1, epoch=1, pipeline="fence"))
            for statement in (f'GRANT USAGE ON SCHEMA setl TO "{new_role}"',
                              f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA setl TO "{new_role}"'):
                postgres_server.query(statement, dbname=postgres_db)
            new.load(make_batch([_insert("app", 2)], id=2, epoch=2, pipeline="fence"))
            with pytest.raises(LoadError, match="older than epoch 2"):
                old.load(make_batch([_insert("app", 3)], id=3, epoch=1, pipeline="fence"))
        finally:
            old.close()
            new.close()
        assert postgres_server.query("SELECT id FROM app.items ORDER BY id", dbname=postgres_db) == [(1,), (2,)]
