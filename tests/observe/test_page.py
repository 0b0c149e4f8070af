"""The status page in a real browser (Debian's chromium, headless, driven by Playwright) against a
real `setl start`: it loads without console errors, shows the node's pipeline, its lag graph moves
under load, and a paused pipeline shows its error."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from setl.testing.servers import wait_until

from .observed import PAUSE_SOON, ObservedNode, Writer

pytestmark = pytest.mark.timeout(240)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


@pytest.fixture
def browser_page() -> Iterator[tuple[Page, list[str]]]:
    """A fresh headless chromium page, and the console errors and page errors it reports."""
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
                    if msg.type == "error" else None)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            yield page, problems
        finally:
            browser.close()


def _card(page: Page, name: str) -> Any:
    return page.locator(f'article.card[data-pipeline="{name}"]')


def test_page_shows_the_pipeline_and_its_lag_graph_moves_under_load(tmp_path, browser_page, mariadb_source,
                                                                     source_db, mariadb_target, mysql_db):
    """The page loads with no console errors, shows the running pipeline with its state, position,
    lag and rate, and under load its lag and throughput graphs gain points and change."""
    page, problems = browser_page
    node = ObservedNode(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db).start()
    try:
        node.source_exec("CREATE TABLE load_t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(16))")
        page.goto(node.url + "/")
        card = _card(page, node.name)
        card.wait_for(timeout=15_000)
        wait_until(lambda: card.get_attribute("data-state") == "running", 15, 0.2, message="state running")
        assert page.locator("#health").inner_text().lower() == "healthy"
        assert "obs-node" in page.locator("#node").inner_text()
        lag_line = page.locator(f'#lag-graph polyline[data-pipeline="{node.name}"]')
        with Writer(node, "load_t", 300):
            wait_until(lambda: lag_line.count() > 0, 20, 0.2, message="a lag line for the pipeline")
            before = lag_line.first.get_attribute("points")
            points_before = int(page.locator("#lag-graph").get_attribute("data-points") or 0)
            time.sleep(4.5)  # two history polls
            after = lag_line.first.get_attribute("points")
            points_after = int(page.locator("#lag-graph").get_attribute("data-points") or 0)
            wait_until(lambda: float(page.locator("#rate-graph").get_attribute("data-max") or 0) >= 10, 20, 0.5,
                       message="the throughput graph to show the load")
            text = card.inner_text()
            with contextlib.suppress(Exception):
                page.screenshot(path=str(tmp_path / "running.png"), full_page=True)
        assert points_after > points_before and after != before
        assert "rows/s" in text and node.name in text
        assert "lag" in text.lower() and "position" in text
        assert problems == [], problems
        node.stop()  # the node dies with the page open: no badge keeps saying healthy or running
        wait_until(lambda: page.locator("#error").is_visible(), 15, 0.2, message="cannot reach the node")
        wait_until(lambda: page.locator("#health").inner_text().lower() == "unknown", 5, 0.2,
                   message="the node badge to turn unknown")
        assert card.get_attribute("data-state") == "unknown"
        assert [b.lower() for b in page.locator(".badge").all_inner_texts()] == ["unknown"] * page.locator(
            ".badge").count()
    finally:
        node.stop()


def test_paused_pipeline_shows_its_error(tmp_path, browser_page, mariadb_source, source_db, mariadb_factory):
    """When the target stays down past the retry budget the pipeline pauses: its card turns
    paused and shows the error, the node's badge turns unhealthy, and /healthz answers 503."""
    page, problems = browser_page
    target = mariadb_factory(server_id=43)
    target.query("CREATE DATABASE dst")
    node = ObservedNode(tmp_path, mariadb_source, source_db, target, "dst",
                        retry=PAUSE_SOON).start()
    try:
        node.source_exec("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
        wait_until(lambda: node.target_has("t") and node.target_rows("t") == 1, 60, 0.2, message="rows in the target")
        page.goto(node.url + "/")
        card = _card(page, node.name)
        card.wait_for(timeout=15_000)
        target.stop()
        node.source_exec("INSERT INTO t VALUES (2)")
        wait_until(lambda: card.get_attribute("data-state") == "paused", 60, 0.3, message="the card to say paused")
        error = card.locator('[data-role="error"]')
        wait_until(lambda: error.count() == 1, 10, 0.2, message="the error box")
        assert node.name in error.inner_text() or "connect" in error.inner_text().lower()
        assert page.locator("#health").inner_text().lower() == "unhealthy"
        assert node.get("/healthz")[0] == 503
        with contextlib.suppress(Exception):
            page.screenshot(path=str(tmp_path / "paused.png"))
        assert problems == [], problems
    finally:
        node.stop()


def test_snapshot_progress_bars_show_each_copied_table(tmp_path, browser_page, mariadb_source, source_db,
                                                      mariadb_target, mysql_db):
    """A pipeline started with `start: snapshot` shows a progress bar per copied table, full when done."""
    page, problems = browser_page
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE copied (id INT PRIMARY KEY, v VARCHAR(16))")
        cur.executemany("INSERT INTO copied VALUES (%s, %s)", [(i, f"v{i}") for i in range(3000)])
        conn.commit()
    node = ObservedNode(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db, start="snapshot").start()
    try:
        page.goto(node.url + "/")
        card = _card(page, node.name)
        card.wait_for(timeout=15_000)
        bar = card.locator(".snapshot .bar")
        label = card.locator(".snapshot .mono")
        # Every row read is not the copy done: that comes with the ack of its last chunk's batch, a
        # refresh or more later (a CI run read "3000 / 3000 rows (100%) copying" once, right after
        # the bar filled). Wait for both.
        wait_until(lambda: bar.count() == 1 and bar.get_attribute("aria-valuenow") == "100"
                   and label.inner_text().endswith("done"), 60, 0.5,
                   message=lambda: f"a full snapshot bar, done: {label.all_inner_texts()}")
        assert f"{source_db}.copied: 3000 / " in label.inner_text(), label.inner_text()
        assert node.target_rows("copied") == 3000
        assert not problems, problems
    finally:
        node.stop()


def test_a_quarantined_table_shows_on_its_pipelines_card(tmp_path, browser_page, mariadb_source, source_db,
                                                          mariadb_target, mysql_db):
    """Under ``on_table_error: quarantine`` a table whose value the target refuses shows on its
    pipeline's card, in the browser: the table, the first position, the changes kept, the cause and
    the command that replays it, while the card stays running and the other table goes on."""
    page, problems = browser_page
    node = ObservedNode(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db)
    node.setl.config["pipeline"]["on_table_error"] = "quarantine"
    node.setl.write_config()
    node.start()
    try:
        node.source_exec("CREATE TABLE q (id INT PRIMARY KEY, v VARCHAR(16))", "CREATE TABLE t (id INT PRIMARY KEY)",
                         "INSERT INTO q VALUES (1, 'a')")
        wait_until(lambda: node.target_has("q") and node.target_rows("q") == 1, 60, 0.2, message="q copied")
        mariadb_target.query(f"ALTER TABLE `{mysql_db}`.q MODIFY v VARCHAR(2)")  # the target refuses long values
        node.source_exec("INSERT INTO q VALUES (2, 'much too long'), (3, 'b')", "INSERT INTO t VALUES (1)")
        page.goto(node.url + "/")
        card = _card(page, node.name)
        card.wait_for(timeout=15_000)
        box = card.locator('[data-role="quarantined"]')
        wait_until(lambda: box.count() == 1, 60, 0.3, message="the quarantine box on the card")
        text = box.inner_text()
        assert f"{mysql_db}.q quarantined since " in text and "Data too long" in text, text
        assert "2 changes" in text and f"setl resume --pipeline {node.name} --table {mysql_db}.q" in text, text
        assert card.get_attribute("data-state") == "running"
        wait_until(lambda: node.target_has("t") and node.target_rows("t") == 1, 30, 0.2, message="t goes on")
        assert problems == [], problems
    finally:
        node.stop()
