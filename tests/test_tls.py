"""TLS to the source and the SQL targets, against a MariaDB and a PostgreSQL that serve certificates
the test makes: replication over verified TLS, refusal by a server that requires TLS, and a wrong
CA or a server without TLS as one permanent error line."""

from __future__ import annotations

import contextlib
import ssl
import time

import attrs
import pymysql
import pytest
import yaml

from setl.config import SslConfig, load_pipeline
from setl.connectors import registry
from setl.errors import ConfigError
from setl.retry import Failure, classify
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.testing.servers import MariaDBServer, PostgresServer
from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target, postgres_target
from tests.e2e.test_bad_input import error_line
from tests.helpers.certs import Certificates, make_certificates

pytestmark = pytest.mark.timeout(300)

X509_USER = "setl_x509"  # an account the test servers admit only with a client certificate


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    """A CA, a server and a client certificate, and an unrelated CA."""
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_mariadb(certs):
    """A MariaDB that serves TLS with the test CA's certificate and refuses clients without it."""
    server = MariaDBServer(server_id=31, tls=certs.server, require_tls=True)
    try:
        server.start()
        server.query(f"CREATE USER {X509_USER}@'127.0.0.1' REQUIRE X509")
        server.query(f"GRANT ALL ON *.* TO {X509_USER}@'127.0.0.1'")
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def tls_postgres(certs):
    """A PostgreSQL that serves TLS and accepts TCP clients only over it (hostssl); role
    `X509_USER` only with a client certificate the test CA signed."""
    server = PostgresServer(tls=certs.server, hba=[
        "local all all trust",
        f"hostssl all {X509_USER} 127.0.0.1/32 trust clientcert=verify-ca",
        "hostssl all postgres 127.0.0.1/32 trust"])
    try:
        server.start()
        server.query(f"CREATE ROLE {X509_USER} LOGIN SUPERUSER")
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def source_table(tls_mariadb, request):
    """A database `src_N` with table `items` holding three rows, on the TLS MariaDB."""
    name = f"src_{abs(hash(request.node.name)) % 10**8}"
    with contextlib.closing(tls_mariadb.connect()) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cur.execute(f"CREATE DATABASE `{name}`")
        cur.execute(f"CREATE TABLE `{name}`.items (id INT PRIMARY KEY, v VARCHAR(20))")
        cur.execute(f"INSERT INTO `{name}`.items VALUES (1, 'one'), (2, 'two'), (3, 'three')")
    return name


def _ssl(certs: Certificates, *, client: bool = False, ca: str | None = None) -> dict:
    found = {"ca": ca or certs.ca}
    if client:
        found.update(cert=certs.client_cert, key=certs.client_key)
    return found


def _pipeline(tmp_path, server, source_db: str, target: dict, target_db: str, **source_extra) -> SetlProcess:
    head = server.query("SHOW MASTER STATUS")[0]
    return SetlProcess(tmp_path, source=mysql_source(server, server_id=3100, start={"file": head[0], "pos": 4},
                                                     **source_extra),
                       target=target, tables=[{"source": rf"{source_db}\.items", "target": f"{target_db}.items"}],
                       pipeline={"batch": {"max_wait_ms": 50},
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20}})


def test_source_and_mysql_target_replicate_over_verified_tls(tmp_path, certs, tls_mariadb, source_table):
    """setl start reads the binlog and writes a MariaDB target over verified TLS, with a client
    certificate, on a server that refuses clients without TLS."""
    target_db = source_table.replace("src_", "dst_")
    setl = _pipeline(tmp_path, tls_mariadb, source_table,
                     mysql_target(tls_mariadb, user=X509_USER, ssl=_ssl(certs, client=True)), target_db,
                     user=X509_USER, ssl=_ssl(certs, client=True))
    result = setl.start_until_caught_up()
    assert result.returncode == 0, result.stderr[-3000:]
    assert tls_mariadb.query(f"SELECT id, v FROM `{target_db}`.items ORDER BY id") == (
        [(1, "one"), (2, "two"), (3, "three")])


def test_relative_ssl_paths_resolve_against_the_conf_dir(tmp_path, certs):
    """`ssl` file paths relative to the conf dir load as absolute paths under it."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "tls").mkdir()
    (conf / "tls" / "ca.pem").write_bytes(open(certs.ca, "rb").read())
    (conf / "pipelines" / "p.yaml").write_text(yaml.safe_dump({
        "source": {"type": "mysql", "ssl": {"ca": "tls/ca.pem"}},
        "target": {"type": "postgresql", "ssl": {"ca": "tls/ca.pem", "verify": False}}}))
    config = load_pipeline(conf, "p", registry())
    assert config.source.ssl == SslConfig(ca=str((conf / "tls" / "ca.pem").absolute()), verify=True)
    assert config.target.ssl.ca == str((conf / "tls" / "ca.pem").absolute())
    assert config.target.ssl.verify is False


@pytest.mark.parametrize(("ssl", "message"), [
    ({"ca": "missing.pem"}, "source.ssl.ca: file not found"),
    ({"key": "k.pem"}, "source.ssl: key is set but cert is not"),
    ({"verify": "maybe"}, "source.ssl.verify: expected true or false"),
    ({"capath": "x"}, "source.ssl.capath: unknown key"),
])
def test_bad_ssl_config_names_the_file_and_key(tmp_path, ssl, message):
    """A bad `ssl` mapping is a ConfigError naming the pipeline file and the key path."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "pipelines" / "p.yaml").write_text(yaml.safe_dump({
        "source": {"type": "mysql", "ssl": ssl}, "target": {"type": "sqlite", "path": "t.db"}}))
    with pytest.raises(ConfigError) as caught:
        load_pipeline(conf, "p", registry())
    assert message in str(caught.value) and "p.yaml" in str(caught.value)


def test_sessions_setl_opens_are_encrypted(certs, tls_mariadb, tls_postgres):
    """The source's queries, the MariaDB target's and the PostgreSQL target's sessions report a
    TLS cipher (Ssl_cipher, pg_stat_ssl)."""
    tls = SslConfig(ca=certs.ca, cert=certs.client_cert, key=certs.client_key)
    source = MysqlBinlogSource.from_config(_with_ssl(tls_mariadb.source_config(), tls), pipeline="p")
    conn = source._connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW STATUS LIKE 'Ssl_cipher'")
            assert cur.fetchone()[1]
    finally:
        conn.close()
    mysql_load = MysqlLoad(_with_ssl(tls_mariadb.target_config(), tls), pipeline="p")
    conn = mysql_load.sql.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW STATUS LIKE 'Ssl_cipher'")
            assert cur.fetchone()[1]
    finally:
        conn.close()
    pg_load = PostgresqlLoad(_with_ssl(tls_postgres.target_config(), SslConfig(ca=certs.ca)), pipeline="p")
    with contextlib.closing(pg_load.sql.connect()) as pg:
        row = pg.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row[0] is True and row[1].startswith("TLS")


def _with_ssl(config, tls: SslConfig):
    return attrs.evolve(config, ssl=tls)


def test_postgresql_target_over_verified_tls(tmp_path, certs, tls_mariadb, tls_postgres, source_table):
    """setl start writes a PostgreSQL target that accepts only TLS clients (hostssl), verifying its certificate."""
    tls_postgres.query(f'CREATE SCHEMA IF NOT EXISTS "{source_table}"')
    setl = _pipeline(tmp_path, tls_mariadb, source_table,
                     {**postgres_target(tls_postgres, "postgres"), "user": X509_USER,
                      "ssl": _ssl(certs, client=True)}, source_table,
                     ssl=_ssl(certs))
    result = setl.start_until_caught_up()
    assert result.returncode == 0, result.stderr[-3000:]
    assert tls_postgres.query(f'SELECT id, v FROM "{source_table}".items ORDER BY id') == (
        [(1, "one"), (2, "two"), (3, "three")])


def _fails_at_once(setl: SetlProcess) -> str:
    """The one error line of a `setl start` that gives up within a minute (no retrying for ten)."""
    began = time.monotonic()
    line = error_line(setl.start_until_caught_up(timeout=120))
    assert time.monotonic() - began < 60, line
    return line


@pytest.mark.parametrize("side", ["source", "mysql target", "postgresql target"])
def test_server_requiring_a_client_certificate_refuses_setl_without_ssl(tmp_path, certs, tls_mariadb, tls_postgres,
                                                                       source_table, side):
    """An account the server admits only with a client certificate (REQUIRE X509, clientcert=verify-ca)
    refuses setl without `ssl`: one error line naming the pipeline and stage, no endless retrying."""
    targets = {"source": mysql_target(tls_mariadb, ssl=_ssl(certs)),
               "mysql target": mysql_target(tls_mariadb, user=X509_USER),
               "postgresql target": {**postgres_target(tls_postgres, "postgres"), "user": X509_USER}}
    source = {"user": X509_USER} if side == "source" else {"ssl": _ssl(certs)}
    setl = _pipeline(tmp_path, tls_mariadb, source_table, targets[side], "refused", **source)
    line = _fails_at_once(setl)
    stage = "select" if side == "source" else "load"
    assert f"pipeline={setl.name}" in line and f"stage={stage}" in line, line
    assert ("Access denied" in line) if side != "postgresql target" else ("client certificate" in line), line


@pytest.mark.parametrize("side", ["source", "mysql target", "postgresql target"])
def test_wrong_ca_is_one_permanent_error_line(tmp_path, certs, tls_mariadb, tls_postgres, source_table, side):
    """A server certificate the configured CA did not sign stops setl at once with one line naming
    the pipeline, the stage, the host and the cause."""
    wrong = _ssl(certs, ca=certs.other_ca)
    targets = {"source": mysql_target(tls_mariadb, ssl=_ssl(certs)),
               "mysql target": mysql_target(tls_mariadb, ssl=wrong),
               "postgresql target": {**postgres_target(tls_postgres, "postgres"), "ssl": wrong}}
    source = {"ssl": wrong if side == "source" else _ssl(certs)}
    setl = _pipeline(tmp_path, tls_mariadb, source_table, targets[side], "wrongca", **source)
    line = _fails_at_once(setl)
    host = f"{tls_postgres.host}:{tls_postgres.port}" if side == "postgresql target" else (
        f"{tls_mariadb.host}:{tls_mariadb.port}")
    stage = "select" if side == "source" else "load"
    assert f"pipeline={setl.name}" in line and f"stage={stage}" in line and host in line, line
    assert "certificate verify failed" in line and "over TLS" in line, line


def test_ssl_against_a_server_without_tls_is_refused(tmp_path, certs, mariadb_source, source_db):
    """With `ssl` set, a server that offers no TLS is refused (no fallback to clear text), at once."""
    setl = _pipeline(tmp_path, mariadb_source, source_db, {"type": "sqlite", "path": str(tmp_path / "t.db")},
                     "main", ssl=_ssl(certs))
    line = _fails_at_once(setl)
    assert f"pipeline={setl.name}" in line and "stage=select" in line and "over TLS" in line, line
    assert f"{mariadb_source.host}:{mariadb_source.port}" in line, line


def test_certificate_failures_are_permanent_and_dropped_tls_sessions_transient():
    """classify: a certificate verify failure or a refused client certificate pauses at once; a TLS
    session cut by the network is retried like any lost connection."""
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    try:
        try:
            raise verify
        except ssl.SSLError:
            raise pymysql.err.OperationalError(2003, "Can't connect to MySQL server") from None
    except pymysql.err.OperationalError as wrapped:
        wrapped.original_exception = verify  # what PyMySQL attaches
        assert classify(wrapped) is Failure.PERMANENT
    assert classify(pymysql.err.OperationalError(2026, "SSL is required but the server doesn't support it")) is (
        Failure.PERMANENT)
    try:
        try:
            raise ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
        except ssl.SSLError as cut:
            raise pymysql.err.OperationalError(2013, f"Lost connection to MySQL server ({cut})") from cut
    except pymysql.err.OperationalError as lost:
        assert classify(lost) is Failure.TRANSIENT


def test_verify_false_encrypts_without_checking_the_certificate(certs, tls_mariadb, tls_postgres):
    """`verify: false` connects over TLS to a server whose certificate the given CA did not sign."""
    unchecked = SslConfig(ca=certs.other_ca, verify=False)
    mysql_load = MysqlLoad(_with_ssl(tls_mariadb.target_config(), unchecked), pipeline="p")
    conn = mysql_load.sql.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW STATUS LIKE 'Ssl_cipher'")
            assert cur.fetchone()[1]
    finally:
        conn.close()
    pg_load = PostgresqlLoad(_with_ssl(tls_postgres.target_config(), unchecked), pipeline="p")
    with contextlib.closing(pg_load.sql.connect()) as pg:
        assert pg.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0] is True


def test_a_key_that_does_not_match_its_certificate_is_one_line(tmp_path, certs, tls_mariadb, source_table):
    """A client key that is not the certificate's stops `setl start` before connecting (exit 2),
    with one line naming the pipeline and `source.ssl`."""
    mismatched = {"ca": certs.ca, "cert": certs.client_cert, "key": certs.server_key}
    setl = _pipeline(tmp_path, tls_mariadb, source_table, {"type": "sqlite", "path": str(tmp_path / "t.db")},
                     "main", ssl=mismatched)
    line = error_line(setl.start_until_caught_up(), exit_code=2)
    assert setl.name in line and "source.ssl: cannot load the TLS files" in line, line


def test_without_ssl_the_drivers_encrypt_unverified_when_the_server_offers_tls(tls_mariadb, tls_postgres):
    """Without `ssl` the drivers' default holds (docs/tls.md): a server offering TLS gets an encrypted
    session, so `require_secure_transport` and `hostssl` admit setl; only `ssl` verifies anything."""
    mysql_load = MysqlLoad(tls_mariadb.target_config(), pipeline="p")
    conn = mysql_load.sql.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW STATUS LIKE 'Ssl_cipher'")
            assert cur.fetchone()[1]
    finally:
        conn.close()
    pg_load = PostgresqlLoad(tls_postgres.target_config(), pipeline="p")
    with contextlib.closing(pg_load.sql.connect()) as pg:
        assert pg.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0] is True
