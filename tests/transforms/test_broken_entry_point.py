"""A broken third-party entry point fails only the pipelines that use it."""

from __future__ import annotations

from importlib import metadata

import pytest

from setl.errors import PluginError
from setl.plugins import Registry


def test_broken_entry_point_is_reported_when_used_and_does_not_hide_builtins(monkeypatch):
    """An entry point whose module is missing raises PluginError on use; built-ins still load."""
    broken = metadata.EntryPoint(name="broken_plugin", value="no_such_module_xyz:fn", group="setl.transforms")
    real = metadata.entry_points

    def entry_points(**kwargs):
        found = list(real(**kwargs))
        return found + [broken] if kwargs.get("group") == "setl.transforms" else real(**kwargs)

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    registry = Registry().discover()
    assert registry.get("rename").name == "rename"
    with pytest.raises(PluginError, match=r"plugin=broken_plugin.*cannot load entry point 'no_such_module_xyz:fn'"):
        registry.get("broken_plugin")
