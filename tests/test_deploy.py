"""The deployment files (docs/deploy.md): the systemd unit passes `systemd-analyze verify` with its
setl path pointing at the installed setl, and the Dockerfile installs through the project's own steps."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.helpers.wait import wait_until

UNIT = Path(__file__).resolve().parent.parent / "tools" / "deploy" / "setl@.service"
DOCKERFILE = UNIT.with_name("Dockerfile")


def test_the_systemd_unit_verifies(tmp_path):
    setl = shutil.which("setl") or str(Path(sys.executable).parent / "setl")
    assert Path(setl).exists(), "setl is not installed (pip install -e .)"
    text = UNIT.read_text()
    assert "/opt/setl/venv/bin/setl" in text
    unit = tmp_path / "setl@p1.service"
    unit.write_text(text.replace("/opt/setl/venv/bin/setl", setl))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ExecStartPre=" in text and " check --pipeline %i" in text and "RestartPreventExitStatus=2" in text

    broken = tmp_path / "setl@p2.service"  # the check does catch a broken unit
    broken.write_text(text.replace("/opt/setl/venv/bin/setl", str(tmp_path / "missing")))
    assert subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True, text=True,
                          timeout=60).returncode != 0


def test_the_dockerfile_installs_the_source_tree_and_runs_setl():
    text = DOCKERFILE.read_text()
    assert "pip install --no-cache-dir /opt/setl/src" in text and "default-jre-headless" in text
    assert '"/opt/setl/venv/bin/setl"' in text and "USER setl" in text


def _unit_settings(text: str) -> dict[str, list[str]]:
    """The unit's `Key=value` lines, by key (a key may repeat)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and not line.startswith("#") and key.strip() and " " not in key.strip():
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def _relocated(text: str, root: Path) -> str:
    """`text` with the unit's paths (/etc/setl, /var/lib/setl) moved under `root`."""
    return text.replace("/etc/setl", str(root / "etc/setl")).replace("/var/lib/setl", str(root / "var/lib/setl"))


@pytest.mark.timeout(240)
def test_the_units_command_lines_run_as_written_with_a_read_only_etc(tmp_path, mariadb_source, source_db,
                                                                     mariadb_target, mysql_db):
    """The unit's ExecStartPre and ExecStart, run as written (the unit's paths under a temp root, /etc
    read-only as ProtectSystem=full makes it, the working directory and SETL_CONF of the unit) with the
    recipe's files (tools/deploy/setl.yaml): the check passes, the node replicates, writes its meta
    store under /var/lib/setl only, and SIGTERM stops it with exit 0 within TimeoutStopSec."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to make /etc read-only for the unit's commands")
    setl = shutil.which("setl") or str(Path(sys.executable).parent / "setl")
    unit = _unit_settings(UNIT.read_text())
    root = tmp_path / "root"
    etc, var = root / "etc/setl", root / "var/lib/setl"
    (etc / "pipelines").mkdir(parents=True)
    var.mkdir(parents=True)
    # the recipe: the deploy config and a pipeline file copied into /etc/setl (docs/deploy.md)
    (etc / "setl.yaml").write_text(_relocated((UNIT.parent / "setl.yaml").read_text(), root))
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY, v TEXT)")
    mariadb_source.query(f"INSERT INTO `{source_db}`.t VALUES (1, 'one'), (2, 'two')")
    pipeline = {"source": {"type": "mysql", "host": mariadb_source.host, "port": mariadb_source.port,
                           "user": "root", "server_id": 1601, "start": "snapshot"},
                "target": {"type": "mysql", "host": mariadb_target.host, "port": mariadb_target.port, "user": "root"},
                "tables": [{"source": rf"{source_db}\.t", "target": f"{mysql_db}.t"}]}
    (etc / "pipelines" / "p1.yaml").write_text(yaml.safe_dump(pipeline))
    env = dict(os.environ)
    for assignment in unit["Environment"]:
        key, _, value = _relocated(assignment, root).partition("=")
        env[key] = value
    cwd = _relocated(unit["WorkingDirectory"][0], root)
    assert unit["ProtectSystem"] == ["full"] and _relocated(unit["ReadWritePaths"][0], root) == str(var)

    def command(line: str) -> list[str]:
        words = shlex.split(line.lstrip("-").replace("%i", "p1").replace("/opt/setl/venv/bin/setl", setl))
        # /etc read-only, as for the service (a private mount namespace: nothing else sees it)
        return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
                str(root / "etc"), *words]

    check = subprocess.run(command(unit["ExecStartPre"][0]), cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen(command(unit["ExecStart"][0]), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: mariadb_target.query(f"SELECT COUNT(*) FROM information_schema.tables WHERE "
                                                f"table_schema = '{mysql_db}' AND table_name = 't'")[0][0] == 1
                   and mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.t")[0][0] == 2,
                   timeout=90, interval=0.5, message="the copy on the target")
        mariadb_source.query(f"INSERT INTO `{source_db}`.t VALUES (3, 'three')")
        wait_until(lambda: mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.t")[0][0] == 3, timeout=60,
                   interval=0.5, message="a change followed")
        proc.send_signal(signal.SIGTERM)  # KillSignal
        code = proc.wait(int(unit["TimeoutStopSec"][0]))
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.stdout.read() if proc.stdout else ""
    assert code == 0, output[-3000:]
    assert (var / "setl-meta.db").exists(), "the meta store is under /var/lib/setl"
    assert sorted(p.name for p in (root / "etc/setl").rglob("*")) == ["p1.yaml", "pipelines", "setl.yaml"]


def test_check_exits_2_on_a_configuration_error_as_start_does(tmp_path):
    """`setl check` gives a configuration error exit 2, as `setl start` does, so the unit's
    RestartPreventExitStatus=2 holds for both."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(tmp_path / "m.db")}}))
    (conf / "pipelines" / "p1.yaml").write_text("source: {type: mysql, bogus_key: 1}\ntarget: {type: mysql}\n"
                                                "tables: []\n")
    setl = [sys.executable, "-m", "setl.cli", "--conf", str(conf)]
    check = subprocess.run([*setl, "check", "--pipeline", "p1"], capture_output=True, text=True, timeout=60)
    start = subprocess.run([*setl, "start", "--pipeline", "p1"], capture_output=True, text=True, timeout=60)
    assert (check.returncode, start.returncode) == (2, 2), check.stdout + check.stderr + start.stderr
    assert "bogus_key" in check.stdout


def test_the_deploy_config_keeps_every_written_path_under_var_lib_setl():
    """tools/deploy/setl.yaml (what the recipe copies to /etc/setl) puts the meta store under
    /var/lib/setl, the unit's one writable path and the container's volume."""
    from setl.config import load_node

    with tempfile.TemporaryDirectory() as conf:
        shutil.copy(UNIT.parent / "setl.yaml", Path(conf) / "setl.yaml")
        settings = load_node(Path(conf))
    assert str(settings.resolve(settings.meta.path)) == "/var/lib/setl/setl-meta.db"
    docker = DOCKERFILE.read_text()
    assert "WORKDIR /var/lib/setl" in docker and "SETL_CONF=/etc/setl" in docker
    deploy = (UNIT.parent.parent.parent / "docs" / "deploy.md").read_text()
    assert "tools/deploy/setl.yaml" in deploy and "cp conf/setl.yaml" not in deploy
