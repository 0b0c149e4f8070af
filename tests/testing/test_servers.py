"""Throwaway servers: start, answer, restart, survive kill -9 with their data."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from setl.testing.servers import (
    MariaDBServer,
    PostgresServer,
    ServerError,
    ZooKeeperServer,
    free_port,
    open_server,
    pid_alive,
    wait_until,
)


def test_mariadb_source_has_row_binlog(mariadb_source):
    """The source server runs with the binlog settings setl's binlog reader requires."""
    (row,) = mariadb_source.query(
        "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@bind_address"
    )
    assert row == (1, "ROW", "FULL", "FULL", "127.0.0.1")
    assert mariadb_source.host == "127.0.0.1"
    assert mariadb_source.dsn().startswith(f"mysql://root@127.0.0.1:{mariadb_source.port}/")


def test_mariadb_binlog_starts_clean(mariadb_factory):
    """A fresh server's binlog holds no row or query events from its own setup."""
    server = mariadb_factory(password="pw")
    (log_name, *_), = server.query("SHOW BINARY LOGS")
    events = server.query(f"SHOW BINLOG EVENTS IN '{log_name}'")
    kinds = {row[2] for row in events}
    assert kinds <= {"Format_desc", "Gtid_list", "Binlog_checkpoint"}, events


def test_mariadb_keeps_committed_data_after_kill_9(mariadb_factory):
    """A MariaDB server killed with SIGKILL restarts on the same port with its committed rows."""
    server = mariadb_factory(password="secret")
    server.query("CREATE DATABASE d")
    server.query("CREATE TABLE d.t (id INT PRIMARY KEY)")
    server.query("INSERT INTO d.t VALUES (1), (2)")
    pid, port = server.pid, server.port
    server.kill()
    assert not pid_alive(pid) and not server.running
    server.start()
    assert server.port == port and server.pid != pid
    assert server.query("SELECT id FROM d.t ORDER BY id") == [(1,), (2,)]
    server.restart()
    assert server.query("SELECT COUNT(*) FROM d.t") == [(2,)]


def test_mariadb_password_and_options_apply(mariadb_factory):
    """A server started with options and a password uses both."""
    server = mariadb_factory(password="pw", options={"binlog_format": "STATEMENT"})
    assert server.query("SELECT @@binlog_format") == [("STATEMENT",)]
    import pymysql

    with pytest.raises(pymysql.err.OperationalError):
        pymysql.connect(**server.connect_args(password="wrong"))


def test_mariadb_failed_start_reports_log_tail(tmp_path):
    """A server that cannot start raises ServerError carrying its log tail, and leaves nothing running."""
    server = MariaDBServer(tmp_path / "bad", options={"no_such_option": 1}, startup_timeout=20)
    with pytest.raises(ServerError, match="no_such_option"):
        server.start()
    assert not server.running
    server.cleanup()


def test_connect_defaults_to_autocommit_and_takes_overrides(mariadb_source, postgres_server):
    """`connect()` autocommits by default; `autocommit=False` (an override) gives a transaction."""
    with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@autocommit")
        assert cur.fetchone() == (1,)
    with contextlib.closing(mariadb_source.connect(autocommit=False)) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@autocommit")
        assert cur.fetchone() == (0,)
    with postgres_server.connect() as conn:
        assert conn.autocommit
    with postgres_server.connect(autocommit=False) as conn:
        assert not conn.autocommit


def test_postgres_restart_and_kill_keep_data(postgres_server):
    """PostgreSQL answers, survives a clean restart and a SIGKILL with its committed rows."""
    postgres_server.query("CREATE TABLE IF NOT EXISTS survive (id int PRIMARY KEY)")
    postgres_server.query("INSERT INTO survive VALUES (1) ON CONFLICT DO NOTHING")
    postgres_server.restart()
    assert postgres_server.query("SELECT id FROM survive") == [(1,)]
    pid = postgres_server.pid
    postgres_server.kill()
    assert not pid_alive(pid)
    postgres_server.start()
    assert postgres_server.query("SELECT id FROM survive") == [(1,)]
    postgres_server.query("DROP TABLE survive")


def test_zookeeper_answers_and_restarts(zookeeper_server):
    """ZooKeeper answers ruok, and comes back on the same port after SIGKILL and after stop."""
    assert zookeeper_server.four_letter_word("ruok") == "imok"
    port = zookeeper_server.port
    zookeeper_server.kill()
    assert not zookeeper_server.running
    zookeeper_server.start()
    assert zookeeper_server.port == port
    zookeeper_server.restart()
    assert "Mode: standalone" in zookeeper_server.four_letter_word("srvr")


def test_zookeeper_keeps_znodes_across_restart(zookeeper_server):
    """A znode written before a restart is still there after it."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    try:
        client.ensure_path("/setl-test/keep")
        client.set("/setl-test/keep", b"v")
    finally:
        client.stop()
        client.close()
    zookeeper_server.restart()
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    try:
        assert client.get("/setl-test/keep")[0] == b"v"
        client.delete("/setl-test", recursive=True)
    finally:
        client.stop()
        client.close()


def test_context_manager_cleans_up():
    """Leaving the with-block stops the server and removes its temp dir."""
    with ZooKeeperServer() as server:
        pid, base = server.pid, server.base_dir
        assert pid_alive(pid)
    assert not pid_alive(pid)
    assert not base.exists()


def test_postgres_refuses_a_dir_its_os_user_cannot_reach(tmp_path):
    """Run as root, PostgreSQL in a dir the postgres OS user cannot reach fails with a clear error."""
    if os.geteuid() != 0:
        pytest.skip("only root switches to the postgres OS user")
    tmp_path.chmod(0o700)
    server = PostgresServer(tmp_path / "pg")
    with pytest.raises(ServerError, match="cannot write"):
        server.start()
    server.cleanup()


def test_open_server_finds_a_server_by_its_dir():
    """A second handle opened on a base dir sees, and can stop, a server another handle started."""
    base = Path(tempfile.mkdtemp(prefix="setl-test-"))
    base.chmod(0o755)  # the postgres OS user must reach its data dir
    first = PostgresServer(base / "pg")
    try:
        first.start()
        second = open_server(base / "pg")
        assert isinstance(second, PostgresServer)
        assert second.port == first.port and second.running
        second.stop()
        wait_until(lambda: not first.running, timeout=10, message="postgres to stop")
    finally:
        first.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def test_mariadb_on_a_port_another_mariadb_answers_fails(mariadb_source, tmp_path):
    """A second MariaDB given a port an existing server answers on is not taken for started."""
    second = MariaDBServer(tmp_path / "second", port=mariadb_source.port, startup_timeout=30)
    try:
        with pytest.raises(ServerError, match="mariadb"):
            second.start()
    finally:
        second.cleanup()
    assert mariadb_source.query("SELECT 1") == [(1,)]


def test_port_in_use_is_reported(tmp_path):
    """A server asked for a port that is taken fails with a clear error instead of hanging."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = ZooKeeperServer(tmp_path / "zk", port=holder.getsockname()[1], startup_timeout=20)
        with pytest.raises(ServerError, match="zookeeper"):
            server.start()
        server.cleanup()
    assert free_port() > 0


def _run_python(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_failed_test_report_carries_server_log_and_session_leaves_nothing(tmp_path):
    """A failing test's report shows the log tail of the server it used; the session stops it."""
    pid_file = tmp_path / "pid"
    test_file = tmp_path / "test_fails.py"
    test_file.write_text(
        "def test_fails(zookeeper_server):\n"
        f"    open({str(pid_file)!r}, 'w').write(str(zookeeper_server.pid))\n"
        "    assert False, 'on purpose'\n"
    )
    done = _run_python("-m", "pytest", "-p", "setl.testing.fixtures", "-p", "no:cacheprovider",
                       "-q", str(test_file), "--rootdir", str(tmp_path), "-c", "/dev/null")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "zookeeper log tail" in done.stdout
    # Some ZooKeeper log line (its log4j pattern) follows the heading; which lines make the
    # 40-line tail depends on timing (a readiness probe may add a stack trace), so match the format.
    section = done.stdout.split("zookeeper log tail", 1)[1]
    assert re.search(r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARN) +\[", section, re.MULTILINE), section
    assert not pid_alive(int(pid_file.read_text()))


def test_servers_die_with_a_killed_parent(tmp_path):
    """A server started by a process that is SIGKILLed does not outlive it."""
    script = ("import sys, time\n"
              "from setl.testing.servers import ZooKeeperServer\n"
              f"server = ZooKeeperServer({str(tmp_path / 'zk')!r}).start()\n"
              "print(server.pid, flush=True)\n"
              "time.sleep(600)\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(proc.stdout.readline())
        assert pid_alive(server_pid)
    finally:
        proc.kill()
        proc.wait()
    wait_until(lambda: not pid_alive(server_pid), timeout=10, message="the orphaned server to die")


def test_server_programs_come_from_the_environment(tmp_path):
    """SETL_MARIADBD names the server program: a MariaDB starts through the one it names."""
    marker = tmp_path / "used"
    wrapper = tmp_path / "mariadbd"
    wrapper.write_text(f"#!/bin/sh\ntouch {marker}\nexec /usr/sbin/mariadbd \"$@\"\n")
    wrapper.chmod(0o755)
    code = ("from setl.testing.servers import MariaDBServer\n"
            "with MariaDBServer() as server:\n"
            "    print(server.query('SELECT 1')[0][0])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SETL_MARIADBD": str(wrapper)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"
    assert marker.exists()
