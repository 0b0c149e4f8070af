"""Alerts: JSON POSTs to a real local HTTP receiver, retried with backoff, never blocking the pipeline."""

from __future__ import annotations

import time

import pytest

from setl.alerts import QUEUE_SIZE, Alerts
from setl.config import AlertConfig
from setl.errors import ConfigError
from tests.helpers.receiver import Receiver
from tests.helpers.wait import wait_until
from tests.test_cli import Setup, make_stream


@pytest.fixture
def receiver():
    made = Receiver(failures=2)
    yield made
    made.close()


def test_a_paused_pipeline_alerts_with_its_error_after_the_webhook_failed_twice(tmp_path, receiver):
    setup = Setup(tmp_path, make_stream(300), attempts=2)
    conf = setup.conf / "setl.yaml"
    conf.write_text(conf.read_text() + f"alerts:\n  - webhook: {receiver.url}\n    events: [paused, caught_up]\n")
    result = setup.run("start", "--pipeline", "p", "--until-caught-up",
                       faults=[{"stage": "load", "batch": 3, "times": None}])
    assert result.returncode == 1
    (alert,) = receiver.bodies  # sent before the process exited, on the third try
    assert receiver.attempts == 3
    assert alert["pipeline"] == "p" and alert["event"] == "paused" and alert["node"]
    assert "injected load failure at batch 3" in alert["error"] and "stage=load" in alert["error"]
    assert "alert paused to" in result.stderr and "failed, next try in" in result.stderr


def test_an_operator_pause_alerts_once(tmp_path, receiver):
    """`setl pause` on a running pipeline sends `paused` ("paused by an operator"), once."""
    receiver.attempts = 2  # no failures here
    setup = Setup(tmp_path, make_stream(200), follow=True)
    conf = setup.conf / "setl.yaml"
    conf.write_text(conf.read_text() + f"alerts:\n  - webhook: {receiver.url}\n    events: [paused]\n")
    proc = setup.spawn("start", "--pipeline", "p")
    try:
        wait_until(lambda: setup.acked() is not None, timeout=60, message="a first ack")
        assert setup.run("pause", "--pipeline", "p").returncode == 0
        wait_until(lambda: receiver.bodies, timeout=30, message="the paused alert")
        time.sleep(2)  # the node keeps watching the pause: no second alert
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert [(a["pipeline"], a["event"], a["error"]) for a in receiver.bodies] == [
        ("p", "paused", "paused by an operator")]


def test_caught_up_alert_and_only_the_listed_pipelines(tmp_path, receiver):
    setup = Setup(tmp_path, make_stream(50))
    conf = setup.conf / "setl.yaml"
    conf.write_text(conf.read_text() + f"alerts:\n  - webhook: {receiver.url}\n    events: [caught_up]\n"
                    f"  - webhook: {receiver.url}\n    events: [caught_up]\n    pipelines: [other]\n")
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    assert [(a["pipeline"], a["event"]) for a in receiver.bodies] == [("p", "caught_up")]


def test_thresholds_alert_when_crossed_upwards_and_again_only_after_falling_back(receiver):
    receiver.attempts = 2  # no failures here
    alerts = Alerts([AlertConfig(webhook=receiver.url, events=("lag_seconds > 30", "rows_per_second >= 100"))], "n1")
    try:
        for lag in (1, 31, 45, 60, 12, 40):
            alerts.observe("p", {"lag_seconds": lag, "rows_per_second": 5})
        alerts.observe("p", {"lag_seconds": None, "rows_per_second": 100})
        alerts.observe("q", {"lag_seconds": 99})
    finally:
        alerts.close()
    sent = [(a["pipeline"], a["event"], a["status"], a["value"]) for a in receiver.bodies]
    assert sorted(sent) == sorted([("p", "lag_seconds > 30", "firing", 31), ("p", "lag_seconds > 30", "resolved", 12),
                                   ("p", "lag_seconds > 30", "firing", 40),
                                   ("p", "rows_per_second >= 100", "firing", 100),
                                   ("q", "lag_seconds > 30", "firing", 99)])
    assert all(a["threshold"] in (30, 100) and a["figure"] in ("lag_seconds", "rows_per_second")
               for a in receiver.bodies)


def test_an_unreachable_webhook_never_blocks_and_a_full_queue_drops_with_an_error(caplog):
    closed = Receiver()
    url = closed.url
    closed.close()  # nothing listens there now
    alerts = Alerts([AlertConfig(webhook=url, events=("paused",), max_elapsed_ms=1000, timeout_ms=200)], "n1")
    started = time.monotonic()
    for i in range(QUEUE_SIZE + 50):
        alerts.emit("p", "paused", error=f"e{i}")
    assert time.monotonic() - started < 2.0
    wait_until(lambda: any("dropped" in r.getMessage() for r in caplog.records), timeout=10)
    closing = time.monotonic()
    alerts.close(timeout=2.0)
    assert time.monotonic() - closing < 3.0  # a full queue of a dead webhook never holds up an exit
    assert any("alerts are waiting already" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bad, message", [
    ({"webhook": "ftp://x", "events": ["paused"]}, "not an http:// or https:// URL"),
    ({"webhook": "http://x", "events": ["lag > fast"]}, "unknown alert event 'lag > fast'"),
])
def test_bad_alert_config_names_the_key(tmp_path, bad, message):
    import yaml

    from setl.config import load_node

    (tmp_path / "setl.yaml").write_text(yaml.safe_dump({"alerts": [bad]}))
    with pytest.raises(ConfigError) as info:
        load_node(tmp_path)
    assert message in str(info.value) and "alerts" in str(info.value)
