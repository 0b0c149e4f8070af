"""The deployment files (docs/deploy.md): the systemd unit passes `systemd-analyze verify` with its
setl path pointing at the installed setl, and the Dockerfile installs through the project's own steps."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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
