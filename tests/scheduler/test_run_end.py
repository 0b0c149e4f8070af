"""The end of a scheduler's run (`RunEnd`) driven step by step, without threads: outcome ranking,
the drain and halt deadlines, and the result."""

from __future__ import annotations

from setl.scheduler import Outcome
from setl.scheduler.ending import Phase, RunEnd


def test_a_pause_or_lost_leadership_outranks_a_stop_and_a_stop_never_outranks_them():
    """A stop asked first gives way to a pause; a later stop or caught-up leaves the pause; LOST replaces it."""
    end = RunEnd(5.0)
    assert end.phase is Phase.RUNNING and not end.stopping.is_set()
    end.ask(Outcome.STOPPED)
    assert end.phase is Phase.STOPPING and end.stopping.is_set() and end.outcome is Outcome.STOPPED
    error = RuntimeError("retries ran out")
    end.ask(Outcome.PAUSED, error)
    end.ask(Outcome.STOPPED)
    end.ask(Outcome.CAUGHT_UP)
    assert end.outcome is Outcome.PAUSED and end.error is error
    end.ask(Outcome.LOST)
    assert end.outcome is Outcome.LOST and end.error is error  # no new error: the last one stays


def test_stop_drains_in_flight_batches_until_the_drain_deadline():
    """A stop waits for batches in flight until `drain_timeout` after the closer began, and not for none."""
    end = RunEnd(5.0)
    end.ask(Outcome.STOPPED)
    end.drain_from(100.0)
    assert end.draining(104.9, in_flight=2, rolling_back=False)
    assert not end.draining(105.0, in_flight=2, rolling_back=False)
    assert not end.draining(101.0, in_flight=0, rolling_back=False)


def test_no_drain_for_a_pause_a_lost_leadership_or_a_rollback():
    """A pause or a lost leadership never waits for batches in flight, nor a stop once a batch failed while draining."""
    stopped = RunEnd(5.0)
    stopped.ask(Outcome.STOPPED)
    stopped.drain_from(0.0)
    assert not stopped.draining(1.0, in_flight=3, rolling_back=True)
    for outcome in (Outcome.PAUSED, Outcome.LOST):
        end = RunEnd(5.0)
        end.ask(outcome)
        end.drain_from(0.0)
        assert not end.draining(1.0, in_flight=3, rolling_back=False)


def test_halt_gives_tasks_the_drain_timeout_then_the_run_finishes():
    """After the halt, tasks get `drain_timeout` more; the result is set once torn down and `wait` returns."""
    end = RunEnd(2.0)
    end.ask(Outcome.STOPPED)
    end.halt(10.0)
    assert end.phase is Phase.HALTING
    assert not end.halt_over(11.9) and end.halt_over(12.0)
    assert not end.wait(0) and end.result is None
    end.finished(Outcome.STOPPED)
    assert end.phase is Phase.FINISHED and end.wait(0) and end.result is Outcome.STOPPED


def test_a_start_already_caught_up_finishes_without_stopping():
    """A run that ends at its start is finished with CAUGHT_UP and never asked to stop."""
    end = RunEnd(2.0)
    end.finished(Outcome.CAUGHT_UP)
    assert end.wait(0) and end.result is Outcome.CAUGHT_UP and not end.stopping.is_set()
