"""Every MySQL connection setl opens ends its handshake in time: a port that accepts and never
answers, or a frozen (SIGSTOPped) server, gives a clear error within the connect timeout."""

from __future__ import annotations

import os
import signal
import time

import pymysql
import pytest

from setl.dial import mysql_connection
from tests.helpers.silent import SilentListener

pytestmark = pytest.mark.timeout(120)


def test_a_port_that_never_answers_fails_within_the_timeout() -> None:
    """A listener that accepts and never sends a greeting fails the connect in about the timeout,
    naming the server and the wait (PyMySQL alone waits for ever)."""
    with SilentListener() as silent:
        began = time.monotonic()
        with pytest.raises(pymysql.err.OperationalError) as raised:
            mysql_connection(host=silent.host, port=silent.port, user="root", connect_timeout=1.0)
        waited = time.monotonic() - began
        assert 0.9 <= waited < 5
        assert raised.value.args[0] == 2013
        assert f"{silent.host}:{silent.port}" in raised.value.args[1] and "within 1s" in raised.value.args[1]


def test_a_frozen_server_fails_within_the_timeout_and_serves_again_once_thawed(mariadb_factory) -> None:
    """A SIGSTOPped MariaDB (TCP accepted by its kernel, no greeting) fails the connect in time;
    once it runs again, the same call connects."""
    server = mariadb_factory()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        with pytest.raises(pymysql.err.OperationalError, match="did not finish the handshake"):
            mysql_connection(host=server.host, port=server.port, user="root", connect_timeout=1.5)
        assert time.monotonic() - began < 6
    finally:
        os.kill(pid, signal.SIGCONT)
    conn = mysql_connection(host=server.host, port=server.port, user="root", connect_timeout=5, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_a_closed_port_fails_at_once() -> None:
    """Nothing listening: the connect fails at once with PyMySQL's can't-connect error (2003)."""
    with SilentListener() as silent:
        port = silent.port
    with pytest.raises(pymysql.err.OperationalError) as raised:
        mysql_connection(host="127.0.0.1", port=port, user="root", connect_timeout=5)
    assert raised.value.args[0] == 2003


def test_a_slow_query_after_the_handshake_is_not_cut(mariadb_source) -> None:
    """The handshake's limit ends with the handshake: a query longer than it still completes."""
    conn = mysql_connection(host=mariadb_source.host, port=mariadb_source.port, user="root", connect_timeout=1,
                            autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT SLEEP(1.5), 7")
            assert cur.fetchone() == (0, 7)
    finally:
        conn.close()
