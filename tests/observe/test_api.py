"""The HTTP control API (`/api/v1`) of a real `setl start` (MariaDB to MariaDB), with a viewer and
an operator token: refusals change nothing, actions act through the meta store as the CLI's do,
operations are polled and streamed, replays are answered once, and `setl --node URL` goes through it."""

from __future__ import annotations

import http.client
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from setl.observe.api import PREFIX, ROUTES, openapi
from setl.testing.servers import wait_until

from .observed import ObservedNode

pytestmark = pytest.mark.timeout(240)

OPERATOR = "op-" + "o" * 29
VIEWER = "view-" + "v" * 27
CLI = "cli-" + "c" * 28


class ApiNode:
    """An `ObservedNode` with ``http.api`` on: tokens in a file of the conf directory, an audit log."""

    def __init__(self, node: ObservedNode) -> None:
        self.node = node
        self.conf = node.setl.conf
        self.audit = node.setl.root / "audit.jsonl"
        settings = yaml.safe_load((self.conf / "setl.yaml").read_text())
        settings["http"]["api"] = {"tokens_file": "tokens", "audit_log": str(self.audit), "max_body_bytes": 4096,
                                   "timeout_s": 2}
        (self.conf / "setl.yaml").write_text(yaml.safe_dump(settings))
        node.setl.config["pipeline"]["on_table_error"] = "quarantine"  # a refused table is set aside
        node.setl.write_config()
        (self.conf / "tokens").write_text(f"# name role token\nalice operator {OPERATOR}\nbob viewer {VIEWER}\n"
                                          f"ci operator {CLI}\n")

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = OPERATOR,
             headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, Any, dict[str, str]]:
        """One request; the status, the JSON answer and the headers."""
        conn = http.client.HTTPConnection("127.0.0.1", self.node.port, timeout=30)
        try:
            sent = dict(headers or {})
            if token is not None:
                sent["Authorization"] = f"Bearer {token}"
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            if data is not None:
                sent.setdefault("Content-Type", "application/json")
            conn.request(method, PREFIX + path, body=data, headers=sent)
            response = conn.getresponse()
            text = response.read()
            content_type = response.getheader("Content-Type") or ""
            found = json.loads(text) if text and content_type.startswith("application/json") else text
            return response.status, found, dict(response.getheaders())
        finally:
            conn.close()

    def status(self) -> str:
        return str(self.call("GET", f"/pipelines/{self.node.name}", token=VIEWER)[1]["status"])

    def audited(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines()] if self.audit.exists() else []

    def meta_state(self) -> tuple[str, str | None]:
        with sqlite3.connect(self.node.setl.meta_path) as db:
            found = db.execute("SELECT status, error FROM pipeline_state WHERE pipeline = ?",
                               (self.node.name,)).fetchone()
        return found[0], found[1]

    def position(self) -> Any:
        return self.call("GET", f"/pipelines/{self.node.name}/position", token=VIEWER)[1]["position"]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, mariadb_source: Any, mariadb_target: Any) -> Iterator[ApiNode]:
    """One node for the module, its pipeline copying table ``t`` with 20 rows."""
    source_db, target_db = f"s_api_{os.getpid()}", f"t_api_{os.getpid()}"
    mariadb_source.query(f"CREATE DATABASE `{source_db}`")
    mariadb_target.query(f"CREATE DATABASE `{target_db}`")
    node = ObservedNode(tmp_path_factory.mktemp("api"), mariadb_source, source_db, mariadb_target, target_db)
    served = ApiNode(node)
    node.start()
    try:
        node.source_exec("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(16))",
                         "INSERT INTO t VALUES " + ", ".join(f"({i}, 'a')" for i in range(20)))
        wait_until(lambda: node.target_has("t") and node.target_rows("t") == 20, 60, 0.2, message="rows copied")
        yield served
    finally:
        node.stop()
        mariadb_source.query(f"DROP DATABASE IF EXISTS `{source_db}`")
        mariadb_target.query(f"DROP DATABASE IF EXISTS `{target_db}`")


def test_openapi_document_is_the_route_table(api: ApiNode) -> None:
    """/api/v1/openapi.json, served without a token, lists every route of the table with its method
    and role and no other, and every route's handler exists."""
    status, served, _ = api.call("GET", "/openapi.json", token=None)
    assert status == 200 and served == openapi() and served["openapi"].startswith("3.")
    documented = {(path, method.upper(), item["x-role"]) for path, methods in served["paths"].items()
                  for method, item in methods.items()}
    assert documented == {(route.path, route.method, route.role) for route in ROUTES}
    from setl.observe.api import Api

    for route in ROUTES:
        assert callable(getattr(Api, "_" + route.handler)), route.handler
        assert route.role in (None, "viewer", "operator")
        assert (route.role == "viewer") == (route.method == "GET" and route.role is not None), route.path


def test_refused_requests_are_clear_4xx_and_change_nothing(api: ApiNode) -> None:
    """No token, a wrong token, a viewer's action, malformed or non-object JSON, unknown keys, an
    oversized body and a reset without force each get a 4xx JSON error; the pipeline still runs at
    the same state, and each POST is in the audit log under its token's name (never the token)."""
    name = api.node.name
    before = api.meta_state()
    audited = len(api.audited())
    cases = [
        (dict(token=None), 401, "no token"),
        (dict(token="x" * 32), 401, "not known"),
        (dict(token=VIEWER), 403, "needs operator"),
        (dict(raw=b'{"oops": '), 400, "not JSON"),
        (dict(raw=b'[1, 2]'), 400, "JSON object"),
        (dict(body={"force": True}), 400, "unknown key"),
        (dict(raw=b"{" + b" " * 5000 + b"}"), 413, "at most 4096"),
    ]
    for kwargs, code, words in cases:
        status, body, _ = api.call("POST", f"/pipelines/{name}/pause", **kwargs)  # type: ignore[arg-type]
        assert status == code and words in body["error"], (kwargs, status, body)
    status, body, _ = api.call("POST", f"/pipelines/{name}/position/reset", {"start": True})
    assert status == 409 and "looks running" in body["error"] and "--force" in body["error"]
    status, body, _ = api.call("GET", f"/pipelines/{name}", token=None)
    assert status == 401
    status, body, _ = api.call("POST", "/pipelines/nosuch/pause")
    assert status == 400 and "unknown pipeline 'nosuch'" in body["error"]
    status, body, _ = api.call("DELETE", f"/pipelines/{name}/pause")
    assert status == 501 or status == 405
    assert api.meta_state() == before == ("running", None) and api.status() == "running"
    entries = api.audited()[audited:]
    assert [e["status"] for e in entries] == [401, 401, 403, 400, 400, 400, 413, 409, 400]
    assert [e["token"] for e in entries] == [None, None, "bob", "alice", "alice", "alice", "alice", "alice", "alice"]
    text = api.audit.read_text()
    assert OPERATOR not in text and VIEWER not in text


def test_a_slow_client_is_cut_off(api: ApiNode) -> None:
    """A client that connects and sends nothing is disconnected after http.api.timeout_s (2 s)."""
    with socket.create_connection(("127.0.0.1", api.node.port), timeout=10) as sock:
        began = time.monotonic()
        assert sock.recv(100) == b""
        assert 1.5 < time.monotonic() - began < 8


def test_pause_and_resume_act_as_the_cli_does(api: ApiNode) -> None:
    """An operator's pause stops the pipeline (status paused, rows written meanwhile not applied);
    resume runs it again and the rows arrive; both answers carry the CLI's message and are audited."""
    name = api.node.name
    status, body, _ = api.call("POST", f"/pipelines/{name}/pause")
    assert status == 200 and body["changed"] and body["message"].startswith(f"{name} paused")
    wait_until(lambda: api.meta_state()[0] == "paused" and not api.call(
        "GET", f"/pipelines/{name}", token=VIEWER)[1]["running_here"], 30, 0.2, message="the pipeline to stop")
    api.node.source_exec("INSERT INTO t VALUES (100, 'p')")
    time.sleep(1.0)  # long enough for a running pipeline to apply it: a paused one must not
    assert api.node.target_rows("t") == 20
    status, body, _ = api.call("POST", f"/pipelines/{name}/pause")
    assert status == 200 and not body["changed"] and "already paused" in body["message"]
    status, body, _ = api.call("POST", f"/pipelines/{name}/resume")
    assert status == 200 and body["changed"] and body["message"].startswith(f"{name} resumed")
    wait_until(lambda: api.node.target_rows("t") == 21, 60, 0.2, message="the row written while paused")
    assert [(e["path"].rsplit("/", 1)[1], e["token"], e["status"]) for e in api.audited()[-3:]] == [
        ("pause", "alice", 200), ("pause", "alice", 200), ("resume", "alice", 200)]


def test_verify_is_an_operation_polled_streamed_and_replayed_once(api: ApiNode) -> None:
    """POST verify answers 202 with an operation id; its events stream as JSON lines to an ``end``
    with the equal report, which polling and GET verify agree on; the same Idempotency-Key gives the
    same operation back without a second verify, and that key on another request is refused (422)."""
    name = api.node.name
    wait_until(lambda: api.node.target_rows("t") >= 20, 30, 0.2)
    key = {"Idempotency-Key": "verify-once-1"}
    status, started, headers = api.call("POST", f"/pipelines/{name}/verify", {"tables": [f"{api.node.source_db}.t"]},
                                        headers=key)
    assert status == 202 and started["state"] == "running" and headers["Location"] == f"{PREFIX}/operations/" \
        + started["id"]
    again = api.call("POST", f"/pipelines/{name}/verify", {"tables": [f"{api.node.source_db}.t"]}, headers=key)
    assert again[0] == 202 and again[1]["id"] == started["id"] and again[2].get("Idempotent-Replayed") == "true"
    conn = http.client.HTTPConnection("127.0.0.1", api.node.port, timeout=60)
    conn.request("GET", f"{PREFIX}/operations/{started['id']}/events", headers={"Authorization": f"Bearer {VIEWER}"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "application/x-ndjson"
    events = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    conn.close()
    assert events[-1]["event"] == "end" and events[-1]["state"] == "done", events[-1]
    assert events[-1]["result"]["equal"] is True and any(e.get("table") for e in events[:-1])
    polled = api.call("GET", f"/operations/{started['id']}", token=VIEWER)[1]
    assert polled["state"] == "done" and polled["result"]["tables"] == events[-1]["result"]["tables"]
    verifies = [op for op in api.call("GET", "/operations", token=VIEWER)[1]["operations"] if op["kind"] == "verify"]
    assert [op["id"] for op in verifies] == [started["id"]]
    stored = api.call("GET", f"/pipelines/{name}/verify", token=VIEWER)[1]["verify"]
    assert stored is not None and stored["equal"] is True
    status, body, _ = api.call("POST", f"/pipelines/{name}/pause", headers=key)
    assert status == 422 and "another request" in body["error"] and api.meta_state()[0] == "running"
    assert api.call("GET", "/operations/nosuch", token=VIEWER)[0] == 404


def test_snapshot_operation_copies_the_table_again(api: ApiNode) -> None:
    """POST snapshot of a table: an operation that follows the copy to done; a row deleted from the
    target behind setl's back is there again."""
    name = api.node.name
    api.node.target.query(f"DELETE FROM `{api.node.target_db}`.t WHERE id = 3")
    status, started, _ = api.call("POST", f"/pipelines/{name}/snapshot", {"tables": [f"{api.node.source_db}.t"]})
    assert status == 202, started

    def finished() -> dict[str, Any] | None:
        op = api.call("GET", f"/operations/{started['id']}", token=VIEWER)[1]
        return op if op["state"] != "running" else None

    op = wait_until(finished, 60, 0.2, message="the snapshot operation to end")
    assert op["state"] == "done" and op["result"]["done"] and op["result"]["tables"][0]["status"] == "done", op
    assert api.node.target.query(f"SELECT v FROM `{api.node.target_db}`.t WHERE id = 3") == [("a",)]
    status, body, _ = api.call("POST", f"/pipelines/{name}/snapshot", {"tables": ["other.x"]})
    assert status == 400 and "no table rule selects other.x" in body["error"]


def _setl(api: ApiNode, *args: str, node: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "SETL_API_TOKEN": CLI}
    argv = [sys.executable, "-m", "setl.cli", *(("--node", api.node.url) if node else ("--conf", str(api.conf))),
            *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_cli_gives_the_same_answers_through_the_node(api: ApiNode, tmp_path: Path) -> None:
    """`setl --node URL` status, position show, pause and resume print what the same commands print
    on the meta store, and act the same; a wrong token file is a clear exit 2."""
    name = api.node.name
    direct = json.loads(_setl(api, "position", "show", "--pipeline", name, "--json", node=False).stdout)
    through = _setl(api, "position", "show", "--pipeline", name, "--json", node=True)
    assert through.returncode == 0, through.stderr
    assert json.loads(through.stdout)["position"] == direct["position"] and direct["position"] is not None
    shown = _setl(api, "status", "--json", node=True)
    assert shown.returncode == 0, shown.stderr
    assert [(row["pipeline"], row["status"]) for row in json.loads(shown.stdout)] == [(name, "running")]
    paused = _setl(api, "pause", "--pipeline", name, node=True)
    assert paused.returncode == 0 and paused.stdout.startswith(f"{name} paused"), paused.stderr
    assert api.meta_state()[0] == "paused"
    again = _setl(api, "pause", "--pipeline", name, node=False)
    assert again.returncode == 0 and again.stdout.strip() == f"{name} is already paused"
    resumed = _setl(api, "resume", "--pipeline", name, node=True)
    assert resumed.returncode == 0 and resumed.stdout.startswith(f"{name} resumed"), resumed.stderr
    wait_until(lambda: api.status() == "running", 30, 0.2, message="running again")
    assert api.audited()[-1]["token"] == "ci"
    (tmp_path / "token").write_text("y" * 40 + "\n")
    refused = subprocess.run([sys.executable, "-m", "setl.cli", "--node", api.node.url, "--token-file",
                              str(tmp_path / "token"), "pause", "--pipeline", name], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "answered 401: the token is not known" in refused.stderr
    assert api.status() == "running"
    unsupported = _setl(api, "schema", "--pipeline", name, node=True)
    assert unsupported.returncode == 2 and "does not act through --node" in unsupported.stderr


def test_page_actions_for_an_operator_only(api: ApiNode) -> None:
    """In Chromium: without a token and with a viewer's the page has no action button; an
    operator's shows them, each asks for confirmation (a dismissed one changes nothing), and pause,
    resume, re-copy and verify run with their progress and the verify report shown."""
    from playwright.sync_api import sync_playwright

    from .test_page import ARGS, CHROMIUM

    name = api.node.name
    answers = {"confirm": False}
    problems: list[str] = []

    def dialog(d: Any) -> None:
        if d.type == "prompt":
            d.accept(f"{api.node.source_db}.t")
        elif answers["confirm"]:
            d.accept()
        else:
            d.dismiss()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("dialog", dialog)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(api.node.url + "/")
            card = page.locator(f'article.card[data-pipeline="{name}"]')
            card.wait_for(timeout=15_000)
            buttons = page.locator("button[data-action]")
            assert buttons.count() == 0
            for token, role in ((VIEWER, "viewer"), (OPERATOR, "operator")):
                page.fill("#token", token)
                page.click("#signin button")
                wait_until(lambda role=role: page.locator("#role").inner_text() == role, 10, 0.1)
                page.wait_for_timeout(1200)  # a status poll re-renders the cards meanwhile
                if role == "viewer":
                    assert buttons.count() == 0 and page.locator("body").get_attribute("data-role") == "viewer"
            wait_until(lambda: card.locator("button[data-action=pause]").count() == 1, 10, 0.1)
            assert card.locator("button[data-action=verify]").count() == 1
            card.locator("button[data-action=pause]").click()  # dismissed
            page.wait_for_timeout(1500)
            assert api.meta_state()[0] == "running" and page.locator(".operation").count() == 0
            answers["confirm"] = True
            card.locator("button[data-action=pause]").click()
            op = page.locator(".operation").first
            wait_until(lambda: op.get_attribute("data-state") == "done", 15, 0.1, message="the pause to answer")
            assert op.inner_text().startswith(f"pause {name}") and f"{name} paused" in op.inner_text()
            wait_until(lambda: card.get_attribute("data-state") == "paused", 15, 0.2, message="the card paused")
            assert api.meta_state()[0] == "paused"
            card.locator("button[data-action=resume]").click()
            wait_until(lambda: page.locator(".operation").first.get_attribute("data-state") == "done"
                       and api.meta_state()[0] != "paused", 15, 0.1, message="the resume")
            rows = api.node.target_rows("t")
            api.node.source_exec("INSERT INTO t VALUES (200, 'r')")
            wait_until(lambda: api.node.target_rows("t") == rows + 1, 60, 0.2, message="a row after the resume")
            card.locator("button[data-action=snapshot]").click()
            wait_until(lambda: page.locator(".operation").first.get_attribute("data-state") == "done", 60, 0.2,
                       message=lambda: f"the re-copy, got {page.locator('.operation').first.inner_text()}")
            assert page.locator(".operation").first.inner_text().startswith(f"re-copy {api.node.source_db}.t")
            card.locator("button[data-action=verify]").click()
            wait_until(lambda: page.locator(".operation").first.get_attribute("data-state") == "done", 60, 0.2,
                       message=lambda: f"the verify, got {page.locator('.operation').first.inner_text()}")
            report = page.locator(".operation").first.locator("[data-role=report]").inner_text()
            assert f"{api.node.source_db}.t" in report and "equal" in report and "DIFFERENT" not in report
            assert problems == []
        finally:
            browser.close()
    assert [e["path"].rsplit("/", 1)[1] for e in api.audited()[-4:]] == ["pause", "resume", "snapshot", "verify"]


def test_position_reset_through_the_api_and_the_cli_keeps_the_guard(api: ApiNode) -> None:
    """While paused, a reset to the acked position is taken through the API (and `setl --node`),
    marked as set by reset; resumed, the pipeline applies what the source writes next."""
    name = api.node.name
    assert api.call("POST", f"/pipelines/{name}/pause")[0] == 200
    assert api.meta_state()[0] == "paused"  # the guard refuses RUNNING only, as the CLI's
    acked = api.position()
    to = f"{acked['log']}:{acked['offset']}"
    status, body, _ = api.call("POST", f"/pipelines/{name}/position/reset", {"to": to, "force": "yes"})
    assert status == 400 and "force must be true or false" in body["error"]
    status, body, _ = api.call("POST", f"/pipelines/{name}/position/reset", {"to": to, "start": True})
    assert status == 400 and "exactly one" in body["error"]
    status, body, _ = api.call("POST", f"/pipelines/{name}/position/reset", {"to": to})
    assert status == 200 and body["message"].startswith(f"{name}: position reset to {to}"), body
    shown = api.call("GET", f"/pipelines/{name}/position?history=2", token=VIEWER)[1]
    assert shown["reset"] is True and shown["position"]["log"] == acked["log"]
    assert shown["position"]["offset"] == acked["offset"]
    through = _setl(api, "position", "reset", "--pipeline", name, "--to", to, node=True)
    assert through.returncode == 0 and through.stdout.startswith(f"{name}: position reset to {to}"), through.stderr
    assert api.call("POST", f"/pipelines/{name}/resume")[0] == 200
    rows = api.node.target_rows("t")
    api.node.source_exec("INSERT INTO t VALUES (300, 'z')")
    wait_until(lambda: api.node.target_rows("t") == rows + 1, 60, 0.2, message="a row after the reset and resume")


def _operation_end(api: ApiNode, op_id: str, timeout: float = 60) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        op = api.call("GET", f"/operations/{op_id}", token=VIEWER)[1]
        return op if op["state"] != "running" else None

    return wait_until(ended, timeout, 0.2, message=f"operation {op_id} to end")


def test_stop_ends_once_nothing_runs_the_pipeline_and_holds_until_resumed(api: ApiNode) -> None:
    """POST stop is an operation that ends done only once the node runs the pipeline no more (the
    status row says so at that moment), and fails with one line when given no time to (paused all
    the same); a row written while stopped is not applied until resume; a viewer's stop is refused;
    `setl --node` and `setl` stop a stopped pipeline again at once."""
    name = api.node.name
    assert api.call("POST", f"/pipelines/{name}/stop", {}, token=VIEWER)[0] == 403
    status, early, _ = api.call("POST", f"/pipelines/{name}/stop", {"timeout_s": 0})  # no time to stop in
    assert status == 202, early
    failed = _operation_end(api, early["id"])
    assert failed["state"] == "failed" and f"{name} is paused but its node still runs it" in failed["error"], failed
    assert api.meta_state()[0] == "paused"  # as a pause: it stops once its batches in flight end
    assert api.call("POST", f"/pipelines/{name}/resume")[0] == 200
    wait_until(lambda: api.call("GET", f"/pipelines/{name}", token=VIEWER)[1]["running_here"], 30, 0.2,
               message="running again after the first stop")
    status, started, _ = api.call("POST", f"/pipelines/{name}/stop", {"timeout_s": 30})
    assert status == 202 and started["kind"] == "stop", started
    op = _operation_end(api, started["id"])
    assert op["state"] == "done" and op["result"]["message"].startswith(f"{name} stopped"), op
    assert op["events"][0]["message"].startswith(f"{name} paused")
    row = api.call("GET", f"/pipelines/{name}", token=VIEWER)[1]
    assert row["running_here"] is False and api.meta_state()[0] == "paused", row
    rows = api.node.target_rows("t")
    api.node.source_exec("INSERT INTO t VALUES (400, 's')")
    time.sleep(1.0)  # long enough for a running pipeline to apply it: a stopped one must not
    assert api.node.target_rows("t") == rows
    for node in (True, False):
        again = _setl(api, "stop", "--pipeline", name, "--timeout", "20", node=node)
        assert again.returncode == 0 and again.stdout.strip().endswith(f"`setl resume --pipeline {name}`"), again
    assert api.call("POST", f"/pipelines/{name}/resume")[0] == 200
    wait_until(lambda: api.node.target_rows("t") == rows + 1, 60, 0.2, message="the row written while stopped")
    wait_until(lambda: api.status() == "running", 30, 0.2, message="running again")


def test_quarantined_table_listed_and_replayed_through_the_api(api: ApiNode) -> None:
    """A table the target refuses is listed by GET quarantine while the others go on; a replay
    before the fix fails and keeps everything; unknown tables and viewers are refused; after the
    fix, `setl --node URL resume --table` replays it and the target table equals the source's."""
    name, source_db, target_db = api.node.name, api.node.source_db, api.node.target_db
    assert api.call("GET", f"/pipelines/{name}/quarantine", token=VIEWER)[1] == {"pipeline": name,
                                                                                  "quarantined": []}
    api.node.source_exec("CREATE TABLE q (id INT PRIMARY KEY, v VARCHAR(16))", "INSERT INTO q VALUES (1, 'a')")
    wait_until(lambda: api.node.target_has("q") and api.node.target_rows("q") == 1, 60, 0.2, message="q copied")
    api.node.target.query(f"ALTER TABLE `{target_db}`.q MODIFY v VARCHAR(2)")  # the target now refuses long values
    api.node.source_exec("INSERT INTO q VALUES (2, 'much too long'), (3, 'b')", "UPDATE q SET v = 'c' WHERE id = 1")
    rows = api.node.target_rows("t")
    api.node.source_exec("INSERT INTO t VALUES (500, 'q')")
    wait_until(lambda: api.node.target_rows("t") == rows + 1, 60, 0.2, message="t goes on")

    def listed() -> list[dict[str, Any]]:
        return list(api.call("GET", f"/pipelines/{name}/quarantine", token=VIEWER)[1]["quarantined"])

    [kept] = wait_until(listed, 60, 0.2, message="q quarantined")
    table = f"{target_db}.q"
    assert kept["table"] == table and "Data too long" in kept["cause"] and kept["changes"] >= 2, kept
    assert api.call("POST", f"/pipelines/{name}/quarantine/{table}/replay", {}, token=VIEWER)[0] == 403
    status, body, _ = api.call("POST", f"/pipelines/{name}/quarantine/{target_db}.t/replay", {})
    assert status == 400 and f"{target_db}.t is not quarantined (quarantined: {table})" in body["error"], body
    status, started, _ = api.call("POST", f"/pipelines/{name}/quarantine/{table}/replay", {"chunk_rows": 1})
    assert status == 202, started
    failed = _operation_end(api, started["id"])
    assert failed["state"] == "failed" and "Data too long" in failed["error"], failed
    assert listed() == [kept] and api.node.target_rows("q") == 1
    api.node.target.query(f"ALTER TABLE `{target_db}`.q MODIFY v VARCHAR(16)")
    replayed = _setl(api, "resume", "--pipeline", name, "--table", table, "--chunk-rows", "1", node=True)
    assert replayed.returncode == 0, replayed.stderr
    assert f"{table} replayed ({kept['changes']} changes applied)" in replayed.stdout, replayed.stdout
    assert listed() == []
    expected = api.node.source.query(f"SELECT id, v FROM `{source_db}`.q ORDER BY id")
    assert api.node.target.query(f"SELECT id, v FROM `{target_db}`.q ORDER BY id") == expected
    assert expected == [(1, "c"), (2, "much too long"), (3, "b")]
    api.node.source_exec("INSERT INTO q VALUES (4, 'd')")  # it follows the stream again
    wait_until(lambda: api.node.target_rows("q") == 4, 60, 0.2, message="q follows the stream")


def test_cli_reload_switch_and_cluster_go_through_the_node(api: ApiNode) -> None:
    """`setl --node URL reload` follows the node's reload operation to its answer (the rules are
    unchanged); switch and cluster drain/move/status reach the node, which refuses them on a node
    without HA with a clear exit 2 and changes nothing."""
    name = api.node.name
    reloaded = _setl(api, "reload", "--pipeline", name, "--timeout", "30", node=True)
    assert reloaded.returncode == 0, reloaded.stderr
    assert reloaded.stdout.strip().endswith(f"{name}: reload unchanged: the table rules are unchanged"), reloaded
    audited = len(api.audited())
    for args, words in ((("switch", "--pipeline", name), "setl switch needs HA"),
                        (("cluster", "drain", "--node", "obs-node"), "setl cluster drain needs HA"),
                        (("cluster", "move", "--pipeline", name, "--to", "x"), "setl cluster move needs HA"),
                        (("cluster", "status"), "answered 404: this node is not in a cluster")):
        refused = _setl(api, *args, node=True)
        assert refused.returncode == 2 and words in refused.stderr, (args, refused)
    assert [e["status"] for e in api.audited()[audited:]] == [400, 400, 400]
    assert api.meta_state() == ("running", None)


def test_repair_is_an_operation_that_restores_a_row_and_verifies(api: ApiNode) -> None:
    """A row changed and one deleted in the target behind setl's back: POST repair verifies first,
    copies those keys again through the pipeline and ends done with an equal report; `setl --node
    URL repair` then finds nothing to repair (exit 0); a report of another pipeline is a 400."""
    name, source_db, target_db = api.node.name, api.node.source_db, api.node.target_db
    wait_until(lambda: api.status() == "running", 30, 0.2)
    api.node.target.query(f"DELETE FROM `{target_db}`.t WHERE id = 5")
    api.node.target.query(f"UPDATE `{target_db}`.t SET v = 'wrong' WHERE id = 6")
    status, body, _ = api.call("POST", f"/pipelines/{name}/repair", {"report": {"pipeline": "other", "tables": []}})
    assert status == 400 and "a report of pipeline 'other'" in body["error"], body
    status, started, _ = api.call("POST", f"/pipelines/{name}/repair", {"tables": [f"{source_db}.t"],
                                                                        "timeout_s": 60})
    assert status == 202 and started["kind"] == "repair", started
    op = _operation_end(api, started["id"], 120)
    assert op["state"] == "done" and op["result"]["state"] == "verified" and op["result"]["equal"] is True, op
    assert any("verifying first" in e.get("message", "") for e in op["events"]), op["events"]
    expected = api.node.source.query(f"SELECT id, v FROM `{source_db}`.t ORDER BY id")
    assert api.node.target.query(f"SELECT id, v FROM `{target_db}`.t ORDER BY id") == expected
    assert (5, "a") in expected and (6, "a") in expected
    again = _setl(api, "repair", "--pipeline", name, "--table", f"{source_db}.t", node=True)
    assert again.returncode == 0 and f"{name}: nothing to repair" in again.stdout, again
