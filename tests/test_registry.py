"""The one plugin registry (`setl.registry`): transforms, sources and targets report a clash, a
broken plugin and a blocked one the same way."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from setl.connectors import ConnectorRegistry
from setl.errors import PluginError
from setl.plugins import Registry, format_plugin_table
from setl.registry import PluginGroup


def fake_distribution(site: Path, name: str, group: str, entry_points: str, module: str, source: str) -> None:
    """A distribution `name` on `site` declaring `entry_points` in `group`, with one module."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry_points}")
    (site / f"{module}.py").write_text(textwrap.dedent(source))


def test_a_clash_reads_the_same_for_a_transform_and_a_target(tmp_path, monkeypatch):
    """A name two distributions register is one error naming both, in the same words, whatever the group."""
    fake_distribution(tmp_path / "a", "setl-fake-twin-a", "setl.transforms", "hash = fake_twin_a:h\n",
                      "fake_twin_a", "h = None\n")
    fake_distribution(tmp_path / "b", "setl-fake-twin-b", "setl.targets", "sqlite = fake_twin_b:c\n",
                      "fake_twin_b", "c = None\n")
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    with pytest.raises(PluginError) as transform:
        Registry().discover().get("hash")
    with pytest.raises(PluginError) as target:
        ConnectorRegistry().target("sqlite")
    for info, what, other in [(transform, "transform 'hash'", "setl-fake-twin-a 1.0"),
                              (target, "target type 'sqlite'", "setl-fake-twin-b 1.0")]:
        text = str(info.value)
        assert f"{what} is provided twice: by " in text and other in text and "setl 0.1.0" in text
        assert text.endswith("; uninstall or rename one of them") and info.value.context["plugin"] in what


def test_a_broken_plugin_reads_the_same_for_a_transform_and_a_source(tmp_path, monkeypatch):
    """An entry point whose module fails to import is an error naming the plugin, the entry point
    and the distribution, in the same words for every group, raised only when it is used."""
    fake_distribution(tmp_path / "a", "setl-fake-bad-a", "setl.transforms", "bad_t = fake_bad_a:t\n",
                      "fake_bad_a", "import no_such_module_a\n")
    fake_distribution(tmp_path / "b", "setl-fake-bad-b", "setl.sources", "bad_s = fake_bad_b:s\n",
                      "fake_bad_b", "import no_such_module_b\n")
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    transforms = Registry().discover()
    assert transforms.get("rename").name == "rename"
    with pytest.raises(PluginError) as transform:
        transforms.get("bad_t")
    with pytest.raises(PluginError) as source:
        ConnectorRegistry().source("bad_s")
    assert str(transform.value) == ("plugin=bad_t: cannot load entry point 'fake_bad_a:t' (setl.transforms) from "
                                    "setl-fake-bad-a 1.0: ModuleNotFoundError: No module named 'no_such_module_a'")
    assert str(source.value) == ("plugin=bad_s: cannot load entry point 'fake_bad_b:s' (setl.sources) from "
                                 "setl-fake-bad-b 1.0: ModuleNotFoundError: No module named 'no_such_module_b'")


def test_a_blocked_transform_is_refused_and_never_imported(tmp_path, monkeypatch):
    """A transform named in plugins.blocked is refused on use with the setl.yaml setting named, its
    module never imported; a blocked directory plugin is refused too; the others still load, and
    `setl plugins list` shows it as BLOCKED."""
    fake_distribution(tmp_path / "site", "setl-fake-unwanted", "setl.transforms", "unwanted = fake_unwanted:u\n",
                      "fake_unwanted", "raise RuntimeError('imported although blocked')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "tagger.py").write_text("from setl.plugins import transform\n"
                                      "@transform('tagger')\n"
                                      "def tagger(df, params, context):\n    return df\n")
    registry = Registry(blocked=["unwanted", "tagger", "mask"]).discover([folder])
    for name in ("unwanted", "tagger", "mask"):
        with pytest.raises(PluginError, match=f"transform '{name}' is blocked in setl.yaml \\(plugins.blocked\\)"):
            registry.get(name)
    assert registry.get("rename").name == "rename" and "mask" not in registry
    text = format_plugin_table(registry=registry)
    assert "imported although blocked" not in text
    assert any(line.startswith("unwanted ") and "BLOCKED: plugin=unwanted" in line for line in text.splitlines())


def test_plugin_group_loads_each_entry_point_once(tmp_path, monkeypatch):
    """A PluginGroup imports an entry point once, remembers its error too, and knows no unknown name."""
    fake_distribution(tmp_path, "setl-fake-counted", "setl.fake", "counted = fake_counted:obj\n", "fake_counted",
                      "obj = 'value'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    group = PluginGroup("setl.fake", "fake", lambda name, obj: seen.append(name) or obj.upper())
    assert group.names() == ["counted"]
    first, second = group.load("counted"), group.load("counted")
    assert first == second == ("VALUE", "setl-fake-counted 1.0 (entry point fake_counted:obj)")
    assert seen == ["counted"]
    assert group.load("missing") is None
    refused = group.load("counted", block=["counted"])
    assert isinstance(refused, PluginError) and "fake 'counted' is blocked" in str(refused)
