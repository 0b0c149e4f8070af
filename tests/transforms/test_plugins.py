"""Plugin declaration, discovery (entry points, plugin directories) and startup validation."""

from __future__ import annotations

import textwrap
from typing import Literal

import pytest

from setl.config import TransformStep
from setl.errors import PluginError
from setl.plugins import (
    Param,
    ParamError,
    Registry,
    TransformPlugin,
    check_type,
    format_plugin_table,
    transform,
)
from setl.testing.spark import run_transform

BUILTINS = {"rename", "drop_columns", "keep_columns", "cast", "filter", "add_column", "mask", "hash", "sql", "lookup"}


@transform("greet", params={
    "column": Param(str, help="column to write"),
    "times": Param(int, default=1),
    "style": Param(Literal["plain", "loud"], default="plain"),
    "ratio": Param(float, required=False),
    "names": Param(list[str], default=[]),
})
def greet(df, params, context):
    """Write a greeting into a column."""
    from pyspark.sql import functions as F

    text = "hello" * params["times"]
    return df.withColumn(params["column"], F.lit(text.upper() if params["style"] == "loud" else text))


class Shout(TransformPlugin):
    """Upper-case a column."""

    name = "shout"
    params = {"column": Param(str)}

    def check(self, params):
        if params["column"].startswith("_"):
            raise ParamError("column", "column must not start with '_'")

    def apply(self, df, params, context):
        from pyspark.sql import functions as F

        return df.withColumn(params["column"], F.upper(F.col(params["column"])))


@pytest.fixture
def local():
    """A registry with two test transforms and no entry points."""
    registry = Registry()
    registry.register(greet, "test")
    registry.register(Shout, "test")
    return registry


def write_plugin_dir(root, name="plugindir"):
    folder = root / name
    (folder / "pkgplugin").mkdir(parents=True)
    (folder / "single.py").write_text(textwrap.dedent("""
        from setl.plugins import Param, transform
        from setl.transforms.builtins import rename  # imported, not defined here: not registered again

        @transform("tag", params={"value": Param(str, default="t")})
        def tag(df, params, context):
            from pyspark.sql import functions as F
            return df.withColumn("tag", F.lit(params["value"]))
    """))
    (folder / "pkgplugin" / "__init__.py").write_text("from .impl import double\n")
    (folder / "pkgplugin" / "impl.py").write_text(textwrap.dedent("""
        from setl.plugins import transform

        @transform("double", params={"column": str})
        def double(df, params, context):
            from pyspark.sql import functions as F
            return df.withColumn(params["column"], F.col(params["column"]) * 2)
    """))
    (folder / "notes.txt").write_text("not a plugin")
    return folder


def test_builtins_register_through_entry_points(registry):
    """Every built-in is found through the setl.transforms entry points of the setl distribution."""
    listed = {info.name: info.origin for info in registry.list()}
    assert BUILTINS <= set(listed)
    assert all(listed[name].startswith("setl ") and "entry point" in listed[name] for name in BUILTINS)


def test_validate_fills_defaults(local):
    """A valid step is bound with its defaults filled in."""
    step = local.validate(TransformStep("greet", {"column": "g"}))
    assert step.params == {"column": "g", "times": 1, "style": "plain", "ratio": None, "names": []}
    assert step.may_drop_deletes is False


def test_unknown_plugin_lists_the_known_ones(local):
    """An unknown transform name is an error listing the known names."""
    with pytest.raises(PluginError, match=r"unknown transform 'gret' \(known: greet, shout\)") as info:
        local.validate(TransformStep("gret", {}))
    assert info.value.context["plugin"] == "gret"


@pytest.mark.parametrize("params, param, message", [
    ({}, "column", "required parameter 'column' is missing"),
    ({"column": "g", "colour": 1}, "colour", "unknown parameter 'colour'"),
    ({"column": 3}, "column", "expected str, got 3"),
    ({"column": "g", "times": "2"}, "times", "expected int"),
    ({"column": "g", "times": True}, "times", "expected int"),
    ({"column": "g", "style": "quiet"}, "style", "expected 'plain' | 'loud'"),
    ({"column": "g", "names": ["a", 2]}, "names", "expected list of str"),
    ({"column": "g", "may_drop_deletes": "yes"}, "may_drop_deletes", "true or false"),
])
def test_bad_params_name_plugin_and_param(local, params, param, message):
    """Missing, unknown and mistyped parameters are PluginErrors naming the plugin and the parameter."""
    with pytest.raises(PluginError, match=message) as info:
        local.validate(TransformStep("greet", params), pipeline="p1")
    assert info.value.context["plugin"] == "greet"
    assert info.value.context["param"] == param
    assert info.value.context["pipeline"] == "p1"
    assert f"plugin=greet param={param}" in str(info.value)


def test_ints_are_accepted_for_floats(local):
    """An integer is a valid float parameter."""
    assert local.validate(TransformStep("greet", {"column": "g", "ratio": 2})).params["ratio"] == 2


def test_check_hook_names_the_parameter(local):
    """A plugin's own check raising ParamError names the parameter."""
    with pytest.raises(PluginError, match="must not start") as info:
        local.validate(TransformStep("shout", {"column": "_x"}))
    assert info.value.context["param"] == "column"


def test_check_type_rules():
    """Parameter type checks follow YAML: no bools as ints, nested lists and mappings checked."""
    assert check_type({"a": "b"}, dict[str, str]) and not check_type({"a": 1}, dict[str, str])
    assert check_type(None, str | None) and not check_type(None, str)
    assert check_type(1, float) and not check_type(False, float)


def test_class_plugin_runs(spark, local):
    """A TransformPlugin subclass registers and runs like a decorated function."""
    out = run_transform("shout", [{"id": 1, "name": "ann"}], {"column": "name"}, primary_key=["id"],
                        registry=local, spark=spark)
    assert out == [{"id": 1, "name": "ANN"}]


def test_plugin_directory_discovery(spark, tmp_path):
    """Modules and packages in a plugin directory register the transforms they define."""
    folder = write_plugin_dir(tmp_path)
    registry = Registry().discover([folder])
    origins = {info.name: info.origin for info in registry.list()}
    assert origins["tag"] == f"file {folder / 'single.py'}"
    assert origins["double"] == f"file {folder / 'pkgplugin'}"
    assert origins["rename"].startswith("setl ")
    out = run_transform("double", [{"id": 1, "n": 21}], {"column": "n"}, primary_key=["id"],
                        registry=registry, spark=spark)
    assert out == [{"id": 1, "n": 42}]


def test_discovering_a_directory_twice_is_not_a_clash(tmp_path):
    """The same definition found twice is one plugin, not a clash."""
    folder = write_plugin_dir(tmp_path)
    registry = Registry().discover([folder, folder])
    assert "tag" in registry


def test_name_clash_between_directories(tmp_path):
    """Two plugin directories defining the same name is an error naming both when the name is used."""
    one, two = write_plugin_dir(tmp_path, "one"), write_plugin_dir(tmp_path, "two")
    registry = Registry().discover([one, two], entry_points=False)
    with pytest.raises(PluginError, match="provided twice") as info:
        registry.get("tag")
    assert str(one) in str(info.value) and str(two) in str(info.value)
    assert "tag" not in registry and "tag" in registry.broken()


def test_name_clash_with_a_builtin(tmp_path):
    """A directory plugin reusing a built-in's name clashes with the entry point."""
    folder = tmp_path / "clash"
    folder.mkdir()
    (folder / "myrename.py").write_text(
        "from setl.plugins import transform\n"
        "@transform('rename')\n"
        "def rename(df, params, context):\n"
        "    return df\n"
    )
    registry = Registry().discover([folder])
    with pytest.raises(PluginError, match="'rename' is provided twice: by setl ") as info:
        registry.get("rename")
    assert info.value.context["plugin"] == "rename"
    assert registry.get("hash").name == "hash"  # the other built-ins still load


def test_broken_plugin_file_is_reported(tmp_path):
    """A plugin module that fails to import is a PluginError naming the file."""
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "bad.py").write_text("import does_not_exist_anywhere\n")
    with pytest.raises(PluginError, match="bad.py.*ModuleNotFoundError"):
        Registry().discover([folder], entry_points=False)


def test_missing_plugin_directory_is_reported(tmp_path):
    """A configured plugin directory that does not exist is an error."""
    with pytest.raises(PluginError, match="does not exist"):
        Registry().discover([tmp_path / "nope"], entry_points=False)


def fake_distribution(site, name, entry_points, module_name, source):
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[setl.transforms]\n" + entry_points)
    (site / f"{module_name}.py").write_text(source)


def test_entry_point_of_an_installed_distribution(spark, tmp_path, monkeypatch):
    """A distribution on sys.path with a setl.transforms entry point is discovered with its origin."""
    fake_distribution(tmp_path, "setl-fake-shouter", "shouter = fake_shouter:shouter\n", "fake_shouter",
                      "from setl.plugins import transform\n"
                      "@transform('shouter', params={'column': str})\n"
                      "def shouter(df, params, context):\n"
                      "    from pyspark.sql import functions as F\n"
                      "    return df.withColumn(params['column'], F.upper(params['column']))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry().discover()
    origin = {i.name: i.origin for i in registry.list()}["shouter"]
    assert origin == "setl-fake-shouter 1.0 (entry point fake_shouter:shouter)"
    out = run_transform("shouter", [{"id": 1, "s": "x"}], {"column": "s"}, registry=registry, spark=spark)
    assert out == [{"id": 1, "s": "X"}]


def test_entry_point_that_is_not_a_transform(tmp_path, monkeypatch):
    """An entry point naming an undeclared function is refused, with its distribution, when it is used."""
    fake_distribution(tmp_path, "setl-fake-plain", "plain = fake_plain:plain\n", "fake_plain",
                      "def plain(df, params, context):\n    return df\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry().discover()
    with pytest.raises(PluginError, match="setl-fake-plain 1.0 is not declared"):
        registry.get("plain")


def test_entry_point_clash_between_distributions(tmp_path, monkeypatch):
    """A distribution claiming a built-in's name is a clash naming both distributions."""
    fake_distribution(tmp_path, "setl-fake-clash", "hash = fake_clash:h\n", "fake_clash",
                      "from setl.plugins import transform\n"
                      "@transform('hash')\n"
                      "def h(df, params, context):\n    return df\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry().discover()
    with pytest.raises(PluginError, match="transform 'hash' is provided twice") as info:
        registry.get("hash")
    assert "setl-fake-clash 1.0" in str(info.value) and "setl 0.1.0" in str(info.value)
    assert registry.get("rename").name == "rename"  # a clash fails only the name it is about


def test_format_plugin_table_lists_names_origins_and_params(tmp_path):
    """The plugins table shows every transform with its origin and parameters."""
    folder = write_plugin_dir(tmp_path)
    text = format_plugin_table([str(folder)])
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "ORIGIN"]
    assert any(line.startswith("tag ") and str(folder / "single.py") in line for line in lines)
    assert "- keep_last: int = 4" in text
    assert "- condition: str (required)" in text


def test_plain_function_runs_in_run_transform(spark):
    """run_transform accepts an undeclared function, for quick experiments."""
    def passthrough(df, params, context):
        return df.withColumnRenamed("a", "b")

    assert run_transform(passthrough, [{"a": 1}], spark=spark) == [{"b": 1}]


def test_reserved_param_name_is_refused():
    """A plugin cannot declare the reserved may_drop_deletes parameter."""
    with pytest.raises(PluginError, match="reserved"):
        transform("x", params={"may_drop_deletes": bool})(lambda df, p, c: df)
