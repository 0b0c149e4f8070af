"""Pytest fixtures that start real servers (MariaDB, PostgreSQL, ZooKeeper, Spark) in temp dirs.

Loaded as a plugin (``pytest_plugins = ["setl.testing.fixtures"]``). Importing it starts
nothing: each session-scoped server starts the first time a test asks for it and stops at the
end of the session. Function-scoped helpers give every test a fresh database. When a test
fails, the log tails of the servers it used are added to its report.

* ``mariadb_source``: MariaDB with a ROW binlog, for the binlog source (server_id 1).
* ``mariadb_target``: a second MariaDB, for the MySQL sink (server_id 2).
* ``postgres_server``: PostgreSQL 15; ``postgres_server.connect()`` gives an autocommit client.
* ``zookeeper_server``: standalone ZooKeeper; ``zookeeper_server.hosts`` is kazoo's hosts string.
* ``spark_standalone``: a Spark standalone master with one worker (1 core, 1 GB);
  ``spark_standalone.master_url`` is the ``spark.master`` to run on it.
* ``mysql_db``: a fresh database on ``mariadb_target`` (its name), dropped after the test.
* ``source_db``: the same on ``mariadb_source``.
* ``postgres_db``: a fresh database on ``postgres_server`` (its name), dropped after the test.
* ``postgres_ascii_db``, ``mysql_latin1_db``: the same in ``SQL_ASCII`` (what ``initdb`` without
  ``-E UTF8`` makes) and with a latin1 default charset: targets that are not UTF-8.
* ``compressing_mariadb``: a MariaDB of its own per test module that writes compressed binlog
  events (``log_bin_compress=ON``, from 10 bytes).
* ``mariadb_factory``: ``mariadb_factory(**kwargs)`` starts an extra `MariaDBServer` (for
  example ``options={"binlog_format": "STATEMENT"}``) that is removed after the test.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from setl.testing.servers import (
    MariaDBServer,
    PostgresServer,
    Server,
    SparkStandalone,
    ZooKeeperServer,
)


def _unique_name(request: pytest.FixtureRequest, prefix: str) -> str:
    """A database name that says which test made it, unique within the server."""
    stem = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40]
    return f"{prefix}_{stem}_{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def mariadb_source() -> Iterator[MariaDBServer]:
    """A MariaDB server with a ROW-format binlog, for reading changes from."""
    server = MariaDBServer(server_id=1)
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def mariadb_target() -> Iterator[MariaDBServer]:
    """A MariaDB server to load into (separate from the source)."""
    server = MariaDBServer(server_id=2)
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server (superuser postgres, trust auth on loopback)."""
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper server (tickTime 500 ms)."""
    server = ZooKeeperServer()
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def spark_standalone() -> Iterator[SparkStandalone]:
    """A Spark standalone cluster on loopback: one master, one worker."""
    server = SparkStandalone()
    try:
        yield server.start()
    finally:
        server.cleanup()


def _mysql_database(server: MariaDBServer, name: str, options: str = "") -> Iterator[str]:
    server.query(f"CREATE DATABASE `{name}`{options}")
    try:
        yield name
    finally:
        if server.running:
            with contextlib.suppress(Exception):
                server.query(f"DROP DATABASE IF EXISTS `{name}`")


def _postgres_database(server: PostgresServer, name: str, options: str = "") -> Iterator[str]:
    server.query(f'CREATE DATABASE "{name}"{options}')
    try:
        yield name
    finally:
        if server.running:
            with contextlib.suppress(Exception):
                server.query(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def mysql_db(request: pytest.FixtureRequest, mariadb_target: MariaDBServer) -> Iterator[str]:
    """A fresh database on `mariadb_target`; yields its name."""
    yield from _mysql_database(mariadb_target, _unique_name(request, "t"))


@pytest.fixture
def source_db(request: pytest.FixtureRequest, mariadb_source: MariaDBServer) -> Iterator[str]:
    """A fresh database on `mariadb_source`; yields its name."""
    yield from _mysql_database(mariadb_source, _unique_name(request, "s"))


@pytest.fixture
def postgres_db(request: pytest.FixtureRequest, postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database on `postgres_server`; yields its name."""
    yield from _postgres_database(postgres_server, _unique_name(request, "t"))


@pytest.fixture
def postgres_ascii_db(request: pytest.FixtureRequest, postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh ``SQL_ASCII`` database on `postgres_server` (psycopg hands its text back as bytes
    unless the client encoding is UTF8); yields its name."""
    yield from _postgres_database(postgres_server, _unique_name(request, "a"),
                                  " ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")


@pytest.fixture
def mysql_latin1_db(request: pytest.FixtureRequest, mariadb_target: MariaDBServer) -> Iterator[str]:
    """A fresh database on `mariadb_target` whose default charset is latin1; yields its name."""
    yield from _mysql_database(mariadb_target, _unique_name(request, "l"), " DEFAULT CHARACTER SET latin1")


@pytest.fixture(scope="module")
def compressing_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDBServer]:
    """A MariaDB that writes compressed binlog events (``log_bin_compress=ON``), every query and
    rows event of 10 bytes or more; one per test module."""
    server = MariaDBServer(tmp_path_factory.mktemp("compressing"),
                           options={"log_bin_compress": "ON", "log_bin_compress_min_len": 10})
    server.start()
    try:
        yield server
    finally:
        server.stop()


class ServerFactory:
    """Starts extra servers for one test and cleans them all up afterwards."""

    def __init__(self, cls: type[Server]) -> None:
        self.cls = cls
        self.servers: list[Server] = []

    def __call__(self, **kwargs: Any) -> Any:
        server = self.cls(**kwargs)
        self.servers.append(server)
        return server.start()

    def cleanup(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.cleanup()


@pytest.fixture
def mariadb_factory() -> Iterator[Callable[..., MariaDBServer]]:
    """``mariadb_factory(**kwargs)`` starts an extra MariaDBServer, removed after the test."""
    factory = ServerFactory(MariaDBServer)
    try:
        yield factory
    finally:
        factory.cleanup()


def _servers_used(item: pytest.Item) -> list[Server]:
    found: list[Server] = []
    for value in getattr(item, "funcargs", {}).values():
        candidates = [value, *getattr(value, "servers", ())] if not isinstance(value, str) else []
        for candidate in candidates:
            if isinstance(candidate, Server) and candidate not in found:
                found.append(candidate)
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """On a failure, attach the log tails of the servers the test used to its report."""
    report = yield
    if report.failed and call.when != "teardown":
        for server in _servers_used(item):
            tail = server.tail_log(40)
            if tail:
                report.sections.append((f"{server.kind} log tail ({server.log_path})", tail))
    return report
