"""The runbook's fix for a wrong certificate (docs/runbook.md, "Wrong certificate"), performed as an
operator would: the error line names `ssl.ca` as the cause; pointing it at the CA that signed the
server's certificate and starting again (`setl resume` first if the pipeline shows `paused`)
replicates, and `setl status` stops showing the error."""

from __future__ import annotations

import pytest

from tests.e2e.setl_process import mysql_target
from tests.test_tls import _pipeline, _ssl, certs, source_table, tls_mariadb  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(300)


def test_a_wrong_ca_is_fixed_by_pointing_ssl_ca_at_the_right_one(tmp_path, certs, tls_mariadb,  # noqa: F811
                                                                  source_table) -> None:  # noqa: F811
    """A source whose `ssl.ca` did not sign the server's certificate stops at once with the runbook's
    line; with `ssl.ca` pointed at the right CA the next start replicates every row."""
    target_db = source_table.replace("src_", "dst_")
    setl = _pipeline(tmp_path, tls_mariadb, source_table, mysql_target(tls_mariadb, ssl=_ssl(certs)), target_db,
                     ssl=_ssl(certs, ca=certs.other_ca))
    failed = setl.start_until_caught_up(timeout=120)
    assert failed.returncode == 1, failed.stderr[-3000:]
    [line] = [line for line in failed.stderr.splitlines() if line.startswith("setl: error:")]
    assert f"pipeline={setl.name} stage=select" in line and "over TLS" in line, line
    assert "certificate verify failed" in line and "(see source.ssl)" in line, line
    status = setl.status()
    assert "certificate verify failed" in (status["error"] or ""), status

    setl.config["source"]["ssl"]["ca"] = certs.ca  # the server's CA
    setl.write_config()
    if status["status"] == "paused":
        assert setl.run("resume", "--pipeline", setl.name).returncode == 0
    started = setl.start_until_caught_up(timeout=120)
    assert started.returncode == 0, started.stderr[-3000:]
    assert tls_mariadb.query(f"SELECT id, v FROM `{target_db}`.items ORDER BY id") == (
        tls_mariadb.query(f"SELECT id, v FROM `{source_table}`.items ORDER BY id"))
    assert setl.status()["error"] is None, setl.status()
