"""The HA supervision's state machine (`setl.node_elected.ElectedState`), driven without threads:
every decision the supervisor thread takes between two calls into the node or the election."""

from __future__ import annotations

import pytest

from setl.node_elected import ElectedState, Phase
from setl.scheduler import Outcome

CLEAR = {"reload_pending": False, "done": False, "lease_lost": False, "switch_requested": False, "stopping": False}


def test_a_leadership_announces_its_first_scheduler_only_and_ends_standing_by():
    """Elected, the first scheduler is announced and a second (after a reload) is not; when the
    leadership ends the pipeline stands by again, and the next leadership is announced afresh."""
    state = ElectedState("p")
    state.stand_by()
    state.elected()
    assert (state.phase, state.leaderships) == (Phase.LEADING, 1)
    assert state.scheduler_started() is True
    assert state.lead_again(Outcome.STOPPED, **{**CLEAR, "reload_pending": True}) is True
    assert state.phase is Phase.LEADING
    assert state.scheduler_started() is False
    assert state.lead_again(Outcome.STOPPED, **CLEAR) is False
    assert state.phase is Phase.STANDING_BY
    state.elected()
    assert state.leaderships == 2 and state.scheduler_started() is True


@pytest.mark.parametrize("blocker", ["done", "lease_lost", "switch_requested", "stopping"])
def test_a_reload_runs_under_the_same_lease_only_while_nothing_ends_the_leadership(blocker):
    """A scheduler stopped for a reload is followed by another under the same lease, unless the
    pipeline ended, the lease was lost, a switch was asked for or the node stops."""
    state = ElectedState("p")
    state.elected()
    state.scheduler_started()
    assert state.lead_again(Outcome.STOPPED, **{**CLEAR, "reload_pending": True, blocker: True}) is False
    assert state.phase is Phase.STANDING_BY


@pytest.mark.parametrize("outcome", [Outcome.LOST, Outcome.PAUSED, Outcome.CAUGHT_UP])
def test_only_a_stopped_scheduler_is_followed_by_a_reloaded_one(outcome):
    """A scheduler that ended any other way than stopped (lost, paused, caught up) ends the leadership."""
    state = ElectedState("p")
    state.elected()
    assert state.lead_again(outcome, **{**CLEAR, "reload_pending": True}) is False


def test_a_scheduler_whose_lease_was_lost_meanwhile_ended_lost():
    """Whatever a scheduler returned, it ended LOST if its lease was lost meanwhile."""
    assert ElectedState.scheduler_ended(Outcome.STOPPED, lease_lost=True) is Outcome.LOST
    assert ElectedState.scheduler_ended(Outcome.CAUGHT_UP, lease_lost=True) is Outcome.LOST
    assert ElectedState.scheduler_ended(Outcome.STOPPED, lease_lost=False) is Outcome.STOPPED


def test_an_election_stopped_or_a_stop_after_a_lost_leadership_is_a_plain_stop():
    """The pipeline's result becomes a plain stop when the election was stopped while standing by,
    or stopped before a new scheduler ran after a leadership lost earlier; not otherwise."""
    state = ElectedState("p")
    assert state.election_over(None, Outcome.LOST) is True
    assert state.election_over(Outcome.STOPPED, Outcome.LOST) is True
    assert state.election_over(Outcome.STOPPED, Outcome.STOPPED) is False
    assert state.election_over(Outcome.LOST, None) is False
    state.elected()
    state.election_over(Outcome.CAUGHT_UP, None)
    assert state.phase is Phase.STANDING_BY


def test_a_failed_start_waits_or_ends_the_supervision_for_good():
    """A failed start with a delay waits (retrying) and stands by again; without one the
    supervision is over, and no transition leaves that state."""
    state = ElectedState("p")
    assert state.start_failed(0.5) is True and state.phase is Phase.RETRYING
    state.pause()
    assert state.phase is Phase.PAUSED
    state.stand_by()
    assert state.start_failed(None) is False and state.phase is Phase.DONE
    with pytest.raises(RuntimeError, match="pipeline=p supervision has ended"):
        state.stand_by()
    with pytest.raises(RuntimeError):
        state.elected()
    state.finish()
    assert state.phase is Phase.DONE
