"""The public API is stated once: `setl.__all__` and `PUBLIC_MODULES` agree with docs/python-api.md."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import setl

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def test_every_exported_name_exists_and_is_documented():
    """Each name in `setl.__all__` is importable from setl and named in docs/python-api.md, which names no other."""
    text = API_DOC.read_text(encoding="utf-8")
    exported_section = text.split("## Public modules")[0]
    documented = set(re.findall(r"`([A-Za-z_]+)`", exported_section)) - {"setl", "__all__", "PUBLIC_MODULES"}
    documented |= {"PUBLIC_MODULES"}
    assert all(hasattr(setl, name) for name in setl.__all__)
    assert documented == set(setl.__all__)


def test_every_public_module_imports_and_is_documented():
    """Each public module imports and has a row on docs/python-api.md, and the page lists no other module."""
    text = API_DOC.read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(setl\.[a-z_.]+)` \|", text, re.MULTILINE))
    assert rows == set(setl.PUBLIC_MODULES)
    for name in setl.PUBLIC_MODULES:
        assert importlib.import_module(name).__doc__


def test_package_ships_py_typed():
    """py.typed is in the package and declared as package data."""
    root = Path(setl.__file__).parent
    assert (root / "py.typed").is_file()
    assert "setl = py.typed" in (root.parent / "setup.cfg").read_text(encoding="utf-8")


def test_control_api_page_lists_every_route() -> None:
    """docs/api.md's action table has one row per route of `setl.observe.api.ROUTES` (method and
    path, ``{P}`` for a pipeline's prefix), and no other."""
    from setl.observe.api import ROUTES, P

    text = (API_DOC.parent / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\|[^|]*\| `(GET|POST) ([^`]+)` \|", text, re.MULTILINE))
    assert documented == {(route.method, route.path.replace(P, "{P}")) for route in ROUTES}
