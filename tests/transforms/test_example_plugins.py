"""The example plugin packages under plugins/: they install, register by their entry point, pass their own tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
OFFLINE_HINTS = ("No matching distribution", "Could not find a version", "Failed to establish", "NewConnectionError")


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def _can_build_without_isolation() -> bool:
    """setuptools builds wheels by itself from 70.1; older ones need the wheel package."""
    if importlib.util.find_spec("wheel") is not None:
        return True
    major, minor = (int(p) for p in metadata.version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1)


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


@pytest.fixture(scope="module")
def installed_currency_plugin():
    """setl-currency installed in editable mode for the module, and uninstalled after unless it was there."""
    was_installed = _installed("setl-currency")
    args = ["install", "--no-deps", "-e", str(PLUGINS / "setl-currency")]
    if _can_build_without_isolation():
        result = pip(*args[:2], "--no-build-isolation", *args[2:])
    else:
        # The build backend must be fetched; a machine without an index cannot do that.
        result = pip(*args)
        if result.returncode != 0 and any(h in result.stdout + result.stderr for h in OFFLINE_HINTS):
            pytest.skip("cannot fetch setuptools/wheel to build the plugin offline")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    yield
    if not was_installed:
        pip("uninstall", "-y", "setl-currency")


def test_installed_plugin_is_discovered_through_its_entry_point(installed_currency_plugin):
    """After pip install, a fresh process finds 'currency' through the entry point, with its origin."""
    script = textwrap.dedent("""
        import json
        from setl.config import TransformStep
        from setl.plugins import Registry, format_plugin_table
        registry = Registry().discover()
        info = {i.name: i.origin for i in registry.list()}
        step = registry.validate(TransformStep("currency", {"columns": ["a"], "from": "USD", "to": "EUR"}))
        from setl_currency import load_rates
        print(json.dumps({"origin": info["currency"], "scale": step.params["scale"],
                          "usd": str(load_rates()["USD"]), "table": format_plugin_table(registry=registry)}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["origin"] == "setl-currency 0.1.0 (entry point setl_currency:currency)"
    assert found["scale"] == 2 and found["usd"] == "1.0850"
    assert "currency  " in found["table"]


def test_example_plugins_pass_their_own_tests(installed_currency_plugin):
    """Each example plugin's own test suite passes (run in one process, sharing one Spark)."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         str(PLUGINS / "setl-currency" / "tests"), str(PLUGINS / "setl-json-flatten" / "tests")],
        capture_output=True, text=True, timeout=280, cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
