"""Scheduled checks (`verify:` in the pipeline file): the node running the pipeline checks it on its
own, and a drift injected into the target shows on `setl status`, `/api/status`, the metrics and as
a ``verify_failed`` alert; equal tables raise nothing."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request

import pytest

from setl.testing.servers import free_port
from tests.e2e.setl_process import mysql_target, postgres_target
from tests.helpers.receiver import Receiver
from tests.helpers.wait import wait_until
from tests.verify.test_verify import fill, make_setl, running

pytestmark = pytest.mark.timeout(180)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _metric(text: str, name: str, pipeline: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'{name}{{pipeline="{pipeline}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def _page_verify_text(url: str, pipeline: str) -> str:
    """What the status page (headless chromium) shows of the pipeline's last check."""
    from playwright.sync_api import sync_playwright

    from tests.observe.test_page import ARGS, CHROMIUM

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(url)
            box = page.locator(f'article.card[data-pipeline="{pipeline}"] [data-role="verify"]')
            box.wait_for(timeout=15_000)
            return box.inner_text()
        finally:
            browser.close()


def test_scheduled_check_finds_drift(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """A check every 2 s finds the tables equal (no alert), then an injected drift: the status row, the
    status endpoint, `setl status`, the metrics and a verify_failed alert all report it."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2221)
    setl.config["verify"] = {"every": "2s", "tables": [f"{source_db}.types", f"{source_db}.bag"],
                             "wait_timeout": "30s"}
    setl.write_config()
    receiver = Receiver()
    port = free_port()
    conf = setl.conf / "setl.yaml"
    conf.write_text(conf.read_text() + f"http:\n  listen: 127.0.0.1:{port}\n"
                    f"alerts:\n  - webhook: {receiver.url}\n    events: [verify_failed]\n")
    try:
        with running(setl, mariadb_source):
            copied = time.time()  # caught up, the copies done: a check from now on must find the tables equal

            def checked() -> dict | None:
                found = setl.status().get("verify")
                return found if found and found["time"] > copied else None

            first = wait_until(checked, timeout=60, interval=0.3, message=lambda: f"a check: {setl.logs()[-3000:]}")
            assert first["equal"] and first["error"] is None, first
            assert {t["table"] for t in first["tables"]} == {f"{source_db}.types", f"{source_db}.bag"}
            assert first["rows"] == 80 and first["differences"] == 0
            injected = time.time()
            conn = mariadb_target.connect()
            with contextlib.closing(conn), conn.cursor() as cur:
                cur.execute(f"DELETE FROM `{mysql_db}`.types WHERE id = 3")
                cur.execute(f"UPDATE `{mysql_db}`.types SET i = 7 WHERE id = 4")
                cur.execute(f"INSERT INTO `{mysql_db}`.bag VALUES (1, 'y1')")

            def drifted() -> dict | None:
                found = setl.status().get("verify")
                return found if found and found["time"] > injected and not found["equal"] else None

            result = wait_until(drifted, timeout=90, interval=0.3, message=lambda: setl.logs()[-3000:])
            assert result["differences"] == 3 and result["error"] is None, result
            tables = {t["table"]: t for t in result["tables"]}
            assert tables[f"{source_db}.types"]["missing"] == 1 and tables[f"{source_db}.types"]["different"] == 1
            assert tables[f"{source_db}.bag"]["extra"] == 1
            alert = wait_until(lambda: next((b for b in receiver.bodies if b["event"] == "verify_failed"), None),
                               timeout=30, interval=0.2, message="a verify_failed alert")
            assert alert["pipeline"] == setl.name and alert["differences"] == 3
            assert sorted(alert["tables"]) == [f"{source_db}.bag", f"{source_db}.types"]
            assert len([b for b in receiver.bodies if b["event"] == "verify_failed"]) >= 1
            metrics = _get(f"http://127.0.0.1:{port}/metrics")
            assert _metric(metrics, "setl_verify_differences", setl.name) == 3.0, metrics
            assert (_metric(metrics, "setl_verify_rows_checked_total", setl.name) or 0) >= 160
            api = json.loads(_get(f"http://127.0.0.1:{port}/api/status"))
            row = next(r for r in api["pipelines"] if r["pipeline"] == setl.name)
            assert row["verify"]["differences"] >= 3 and not row["verify"]["equal"]
            text = setl.run("status").stdout
            assert f"{setl.name}: last check" in text and "difference(s) in" in text, text
            assert "difference(s) in" in _page_verify_text(f"http://127.0.0.1:{port}/", setl.name)
    finally:
        receiver.close()


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_scheduled_check_finds_drift_in_a_postgresql_target(tmp_path, mariadb_source, postgres_server, source_db,
                                                           postgres_db, engine):
    """Into PostgreSQL, chunks hashed here or by Spark tasks (`verify.engine`): a check finds the tables equal,
    then a drift written into the PostgreSQL target shows in `setl status --json`, `/api/status` and the
    `setl_verify_differences` metric."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                     f"{source_db}.{{table}}", server_id=2222)
    setl.config["verify"] = {"every": "2s", "tables": [f"{source_db}.types", f"{source_db}.docs",
                                                       f"{source_db}.bag"], "wait_timeout": "30s", "chunk_rows": 15,
                             "engine": engine}
    setl.write_config()
    port = free_port()
    conf = setl.conf / "setl.yaml"
    conf.write_text(conf.read_text() + f"http:\n  listen: 127.0.0.1:{port}\n")
    with running(setl, mariadb_source):
        copied = time.time()

        def checked() -> dict | None:
            found = setl.status().get("verify")
            return found if found and found["time"] > copied else None

        first = wait_until(checked, timeout=120, interval=0.3, message=lambda: f"a check: {setl.logs()[-3000:]}")
        assert first["equal"] and first["error"] is None and first["rows"] == 120, first
        spark_tasks = "types 3 chunk(s) hashed on the target by" in setl.logs()
        assert spark_tasks == (engine == "spark"), setl.logs()[-3000:]
        injected = time.time()
        for statement in (f'DELETE FROM "{source_db}".types WHERE id = 3',
                          f'UPDATE "{source_db}".types SET dt = dt + interval \'1 microsecond\' WHERE id = 4',
                          f'UPDATE "{source_db}".docs SET j = \'{{"n": 0}}\'::jsonb WHERE id = 5',
                          f"INSERT INTO \"{source_db}\".bag VALUES (1, 'y1')"):
            postgres_server.query(statement, dbname=postgres_db)

        def drifted() -> dict | None:
            found = setl.status().get("verify")
            return found if found and found["time"] > injected and not found["equal"] else None

        result = wait_until(drifted, timeout=90, interval=0.3, message=lambda: setl.logs()[-3000:])
        assert result["differences"] == 4 and result["error"] is None, result
        tables = {t["table"]: t for t in result["tables"]}
        assert (tables[f"{source_db}.types"]["missing"], tables[f"{source_db}.types"]["different"]) == (1, 1)
        assert tables[f"{source_db}.docs"]["different"] == 1 and tables[f"{source_db}.bag"]["extra"] == 1
        api = json.loads(_get(f"http://127.0.0.1:{port}/api/status"))
        row = next(r for r in api["pipelines"] if r["pipeline"] == setl.name)
        assert row["verify"]["differences"] == 4 and not row["verify"]["equal"], row["verify"]
        metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert _metric(metrics, "setl_verify_differences", setl.name) == 4.0, metrics
        assert (_metric(metrics, "setl_verify_rows_checked_total", setl.name) or 0) >= 240
