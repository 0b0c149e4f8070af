"""The control API over HTTPS (`http.tls`), and an API that would have no token: the node's real
endpoint and meta store, with no pipeline running."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from setl.config import load_node
from setl.errors import ConfigError
from setl.meta.sqlite import SqliteMetaStore
from setl.observe import NodeObserver
from setl.observe.api import PREFIX, Api
from setl.observe.server import StatusServer
from tests.helpers.certs import make_certificates

pytestmark = pytest.mark.timeout(120)

TOKEN = "tls-operator-" + "t" * 20


def _conf(tmp_path: Path, api: dict, tls: dict | None) -> Path:
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    http = {"listen": "127.0.0.1:0", "api": api, **({"tls": tls} if tls else {})}
    (conf / "setl.yaml").write_text(yaml.safe_dump({"node": {"id": "tls-node"}, "http": http,
                                                    "meta": {"store": "sqlite", "path": str(tmp_path / "meta.db")}}))
    return conf


def test_api_serves_https_with_the_http_tls_files(tmp_path: Path) -> None:
    """With http.tls the endpoint speaks HTTPS only: a client trusting the CA gets answers (and
    `setl --node https://...` works), a plain HTTP request gets no answer."""
    certs = make_certificates(tmp_path / "certs")
    conf = _conf(tmp_path, {"audit_log": str(tmp_path / "audit.jsonl")},
                 {"cert": certs.server_cert, "key": certs.server_key})
    os.environ["SETL_API_TOKENS"] = f"ops operator {TOKEN}"
    try:
        settings = load_node(conf)
        meta = SqliteMetaStore(tmp_path / "meta.db")
        observer = NodeObserver("tls-node", [], meta, lambda: {}, metrics=False)
        server = StatusServer(observer, "127.0.0.1:0", api=Api(settings, meta, observer.status),
                              tls=settings.http.tls, timeout=5)
    finally:
        del os.environ["SETL_API_TOKENS"]
    server.start()
    try:
        port = server.address[1]
        assert server.url == f"https://127.0.0.1:{port}/"
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                           context=ssl.create_default_context(cafile=certs.ca))
        conn.request("POST", f"{PREFIX}/pipelines/nosuch/pause", body=b"{}",
                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 400 and "unknown pipeline 'nosuch'" in json.loads(answer.read())["error"]
        conn.close()
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            plain.request("GET", f"{PREFIX}/openapi.json")
            plain.getresponse().read()
        plain.close()
        cli = subprocess.run([sys.executable, "-m", "setl.cli", "--node", f"https://127.0.0.1:{port}", "status"],
                             env={**os.environ, "SETL_API_TOKEN": TOKEN, "SSL_CERT_FILE": certs.ca},
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0 and cli.stdout.strip() == "no pipelines configured or known", cli.stderr
        untrusted = subprocess.run([sys.executable, "-m", "setl.cli", "--node", f"https://127.0.0.1:{port}", "status"],
                                   env={**os.environ, "SETL_API_TOKEN": TOKEN, "SSL_CERT_FILE": certs.other_ca},
                                   capture_output=True, text=True, timeout=60)
        assert untrusted.returncode == 1 and "cannot reach the node" in untrusted.stderr
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    finally:
        server.stop()
        meta.close()


def test_an_api_without_tokens_is_refused(tmp_path: Path) -> None:
    """http.api with no token file and an empty environment variable is a ConfigError naming both."""
    conf = _conf(tmp_path, {"tokens_env": "SETL_TEST_NO_TOKENS"}, None)
    settings = load_node(conf)
    meta = SqliteMetaStore(tmp_path / "meta.db")
    try:
        with pytest.raises(ConfigError, match=r"no token is given \(http.api.tokens_file, or \$SETL_TEST_NO_TOKENS\)"):
            Api(settings, meta, lambda: {"pipelines": []})
    finally:
        meta.close()
