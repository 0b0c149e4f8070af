"""setl.retry: which failures are transient, permanent or other, and how long each is retried."""

from __future__ import annotations

import pymysql
import pytest

from setl.errors import ConfigError, LoadError, PositionPurged, RefusedLoadError, SourceError, TransientLoadError
from setl.meta import SqliteMetaStore, Status
from setl.retry import Backoff, Failure, classify, record_retrying


def caused(outer: Exception, cause: BaseException) -> Exception:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize("error, kind", [
    (caused(SourceError("binlog read failed"), pymysql.err.OperationalError(2003, "Can't connect")), Failure.TRANSIENT),
    (caused(LoadError("apply failed"), pymysql.err.OperationalError(1213, "Deadlock found")), Failure.TRANSIENT),
    (caused(LoadError("apply failed"), pymysql.err.OperationalError(1205, "Lock wait timeout")), Failure.TRANSIENT),
    (TransientLoadError("lost connection"), Failure.TRANSIENT),
    (ConnectionRefusedError(111, "refused"), Failure.TRANSIENT),
    (caused(SourceError("cannot connect"), pymysql.err.OperationalError(1045, "Access denied")), Failure.PERMANENT),
    (caused(LoadError("apply failed"), pymysql.err.ProgrammingError(1146, "Table doesn't exist")), Failure.PERMANENT),
    (RefusedLoadError("DDL refused"), Failure.PERMANENT),
    (caused(PositionPurged("binlog purged"), pymysql.err.OperationalError(1236, "purged")), Failure.PERMANENT),
    (ConfigError("bad key"), Failure.PERMANENT),
    (caused(LoadError("apply failed"), pymysql.err.DataError(1406, "Data too long")), Failure.OTHER),
    (RuntimeError("a plugin's bug"), Failure.OTHER),
])
def test_classify(error, kind):
    """Each failure, looked at through its causes, is of the kind its retry policy expects."""
    assert classify(error) is kind


def test_transient_failures_are_retried_for_the_time_budget_not_the_attempts():
    """A transient failure pauses only once the run of failures has lasted max_elapsed; attempts do not count."""
    now = [1000.0]
    backoff = Backoff(initial=0.1, maximum=1.0, max_attempts=2, max_elapsed=60.0, clock=lambda: now[0])
    error = TransientLoadError("lost connection")
    for attempt in range(1, 50):
        now[0] += 1.0
        verdict = backoff.decide(error, attempt)
        assert not verdict.pause and verdict.since == 1001.0
    now[0] = 1061.0
    assert backoff.decide(error, 50).pause
    # A new run of failures (attempt 1 again, after an ack) starts a new budget.
    assert not backoff.decide(error, 1).pause and backoff.decide(error, 2).since == 1061.0


def test_other_failures_pause_after_max_attempts_and_permanent_ones_at_once():
    """OTHER failures get max_attempts attempts; PERMANENT ones pause at the first."""
    backoff = Backoff(initial=0.1, maximum=1.0, max_attempts=3)
    assert [backoff.decide(RuntimeError("x"), n).pause for n in (1, 2, 3)] == [False, False, True]
    assert backoff.decide(RefusedLoadError("refused"), 1).pause


def test_delay_is_capped_however_many_attempts():
    """The backoff grows to `maximum` and stays there, even after very many attempts."""
    backoff = Backoff(initial=0.2, maximum=30.0, max_attempts=1)
    assert backoff.delay(1) == pytest.approx(0.2)
    assert backoff.delay(10_000) == 30.0


def test_record_retrying_leaves_an_operators_pause_alone(tmp_path):
    """The retrying mark is written on a running pipeline, never over a pause written meanwhile."""
    meta = SqliteMetaStore(tmp_path / "m.db")
    record_retrying(meta, "p", TransientLoadError("target away"), 5.0, "n1")
    assert meta.state("p").retrying and meta.state("p").error == "target away"
    meta.set_state("p", Status.PAUSED)
    record_retrying(meta, "p", TransientLoadError("target away"), 5.0, "n1")
    assert meta.state("p").status is Status.PAUSED and not meta.state("p").retrying


def test_postgresql_connect_failures_are_told_apart_by_the_servers_words(postgres_server):
    """No SQLSTATE from psycopg at connect: an unknown role or database is permanent, a refused connection transient."""
    import psycopg

    def failure(**overrides) -> Failure:
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(**{**postgres_server.connect_args(), "connect_timeout": 5, **overrides})
        return classify(caught.value)

    assert failure(user="nobody") is Failure.PERMANENT
    assert failure(dbname="no_such_db") is Failure.PERMANENT
    assert failure(port=1) is Failure.TRANSIENT
