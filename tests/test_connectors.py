"""Sources and targets as plugins: entry-point registration, config validation, broken plugins,
capabilities, `setl plugins list`, and a third-party target (plugins/setl-jsonl-target) run by `setl start`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import attrs
import pytest

import setl.connectors
from setl.config import load_node, load_pipeline
from setl.connectors import BuildContext, ConnectorRegistry, TargetConnector, registry
from setl.errors import ConfigError, PluginError
from setl.sources.file import encode_transaction
from setl.stages.load import LoadCapabilities
from setl.testing.harness import reference_state
from tests.test_cli import make_stream

REPO = Path(__file__).resolve().parents[1]
BUILTIN_TARGETS = {"sqlite", "mysql", "postgresql", "parquet"}


def write_conf(root: Path, target: str, *, extra: str = "", txs: list | None = None) -> Path:
    """A conf dir with pipeline p: a file source of `txs` and `target` (a YAML flow mapping)."""
    conf = root / "conf"
    (conf / "pipelines").mkdir(parents=True)
    stream = root / "stream.jsonl"
    stream.write_text("".join(encode_transaction(tx) for tx in txs or []), encoding="utf-8")
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {root / 'meta.db'}}}\n")
    (conf / "pipelines" / "p.yaml").write_text(textwrap.dedent(f"""\
        source: {{type: file, path: {stream}, follow: false}}
        target: {target}
        pipeline:
          batch: {{max_rows: 20, max_wait_ms: 5}}
        """) + extra)
    return conf


def setl_cli(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), *args],
                          capture_output=True, text=True, timeout=120, check=False)


def fake_distribution(site: Path, name: str, group: str, entry_points: str, module: str, source: str) -> None:
    """A distribution `name` on `site` declaring `entry_points` in `group`, with one module."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry_points}")
    (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def fresh_registry(monkeypatch):
    """The process registry forgotten, so entry points added by the test are read."""
    monkeypatch.setattr(setl.connectors, "_registry", None)
    yield
    setl.connectors._registry = None


def test_builtins_come_through_the_entry_points():
    """Every built-in source and target is registered by setl's own entry points, with its config class."""
    connectors = ConnectorRegistry()
    assert {"file", "mysql"} <= set(connectors.names("source"))
    assert BUILTIN_TARGETS <= set(connectors.names("target"))
    sqlite = connectors.target("sqlite")
    assert sqlite.origin == "setl 0.1.0 (entry point setl.connectors:sqlite_target)"
    assert sqlite.config.__module__ == "setl.sinks.sqlite"
    assert sqlite.capabilities == LoadCapabilities(per_table=True, stores_position=True, creates_tables=True)
    assert connectors.target("parquet").capabilities == LoadCapabilities(creates_tables=True)
    assert connectors.target("mysql").ddl_task_actions is not None


def test_unknown_type_names_the_known_ones(tmp_path):
    """An unknown target type is a config error at `target.type` naming every known type."""
    conf = write_conf(tmp_path, "{type: kafka, path: x}")
    with pytest.raises(ConfigError) as info:
        load_pipeline(conf, "p", registry())
    known = ", ".join(registry().names("target"))
    assert str(info.value) == f"{conf / 'pipelines' / 'p.yaml'}: target.type: expected one of {known}, got 'kafka'"


@pytest.mark.parametrize(("target", "expected"), [
    ("{type: mysql, port: x}", "target.port: expected an integer, got 'x'"),
    ("{type: sqlite}", "target.path: required key is missing"),
    ("{type: postgresql, colour: red}", ("target.colour: unknown key (known keys: database, host, "
                                         "invalid_dates, nul_in_text, partitions, password, port, spatial, ssl, "
                                         "type, user)")),
])
def test_builtin_config_errors_keep_file_and_key_path(tmp_path, target, expected):
    """A built-in connector's config is validated with the file and the key path, as before."""
    conf = write_conf(tmp_path, target)
    with pytest.raises(ConfigError) as info:
        load_pipeline(conf, "p", registry())
    assert str(info.value) == f"{conf / 'pipelines' / 'p.yaml'}: {expected}"


def test_plugin_config_errors_keep_file_and_key_path(tmp_path, monkeypatch, fresh_registry):
    """A third-party connector's config class gets the same file and key-path errors."""
    fake_distribution(tmp_path / "site", "setl-fake-kafka", "setl.targets", "kafka = fake_kafka:connector\n",
                      "fake_kafka", """\
        from typing import Literal
        import attrs
        from setl.connectors import TargetConnector

        @attrs.frozen
        class KafkaConfig:
            type: Literal["kafka"]
            brokers: tuple[str, ...]
            acks: int = 1

        connector = TargetConnector("kafka", KafkaConfig, lambda config, context: None)
        """)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    conf = write_conf(tmp_path, "{type: kafka, brokers: [a, b], acks: all}")
    with pytest.raises(ConfigError) as info:
        load_pipeline(conf, "p", registry())
    assert str(info.value) == f"{conf / 'pipelines' / 'p.yaml'}: target.acks: expected an integer, got 'all'"
    (conf / "pipelines" / "p.yaml").write_text((conf / "pipelines" / "p.yaml").read_text().replace("all", "2"))
    assert load_pipeline(conf, "p", registry()).target.brokers == ("a", "b")


def test_broken_plugin_is_reported_when_used(tmp_path, monkeypatch, fresh_registry):
    """A target plugin that fails to import stops only the pipeline using it, with an error naming
    the plugin and its entry point; other targets still load."""
    fake_distribution(tmp_path / "site", "setl-fake-broken", "setl.targets", "broken = fake_broken:connector\n",
                      "fake_broken", "import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    ok = write_conf(tmp_path / "ok", f"{{type: sqlite, path: {tmp_path / 't.db'}}}")
    assert load_pipeline(ok, "p", registry()).target.type == "sqlite"
    conf = write_conf(tmp_path / "bad", "{type: broken}")
    with pytest.raises(PluginError) as info:
        load_pipeline(conf, "p", registry())
    text = str(info.value)
    assert "plugin=broken" in text and "'fake_broken:connector'" in text and "setl-fake-broken 1.0" in text
    assert "ModuleNotFoundError" in text and str(conf / "pipelines" / "p.yaml") in text


@pytest.mark.parametrize(("source", "message"), [
    ("connector = 42\n", "is not a setl.connectors.TargetConnector"),
    (("from setl.connectors import TargetConnector\n"
      "import attrs\n"
      "@attrs.frozen\n"
      "class C:\n"
      "    type: str = 'other'\n"
      "connector = TargetConnector('other', C, lambda c, x: None)\n"), "declares type 'other'"),
    (("from setl.connectors import TargetConnector\n"
      "import attrs\n"
      "@attrs.frozen\n"
      "class C:\n"
      "    path: str = ''\n"
      "connector = TargetConnector('odd', C, lambda c, x: None)\n"), "has no 'type' field"),
])
def test_invalid_declaration_is_refused_at_registration(tmp_path, monkeypatch, source, message):
    """An entry point that does not declare a usable connector is refused when loaded, naming it."""
    module = f"fake_odd_{len(source)}"  # one module name per case: imports are cached
    fake_distribution(tmp_path, "setl-fake-odd", "setl.targets", f"odd = {module}:connector\n", module, source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=message) as info:
        ConnectorRegistry().target("odd")
    assert info.value.context["plugin"] == "odd" and "setl-fake-odd 1.0" in str(info.value)


def test_one_type_from_two_distributions_is_a_clash(tmp_path, monkeypatch):
    """A distribution claiming a built-in's type name is refused, naming both distributions."""
    fake_distribution(tmp_path, "setl-fake-sqlite", "setl.targets", "sqlite = fake_sqlite:connector\n",
                      "fake_sqlite", "connector = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="provided twice") as info:
        ConnectorRegistry().target("sqlite")
    assert "setl 0.1.0" in str(info.value) and "setl-fake-sqlite 1.0" in str(info.value)


def test_declared_capabilities_reach_the_built_load(tmp_path):
    """A Load built by its connector carries the connector's declared capabilities."""
    connectors = ConnectorRegistry()
    connector = connectors.target("sqlite")
    load = connector.create(connector.config("sqlite", str(tmp_path / "t.db")), BuildContext("p"))
    assert load.capabilities == connector.capabilities
    plain = TargetConnector("plain", connector.config, connector.build)
    connectors.register(plain)
    assert connectors.target("plain").create(connector.config("sqlite", "x.db"),
                                              BuildContext("p")).capabilities == LoadCapabilities()


def test_a_sink_built_by_hand_declares_what_its_connector_declares(tmp_path):
    """Built-in sinks carry their capabilities as a class attribute, the same the registry declares."""
    from setl.sinks.mysql import MysqlLoad
    from setl.sinks.parquet import ParquetLoad
    from setl.sinks.postgresql import PostgresqlLoad
    from setl.sinks.sqlite import SqliteLoad

    connectors = ConnectorRegistry()
    by_hand = {"sqlite": SqliteLoad(tmp_path / "t.db", pipeline="p"), "parquet": ParquetLoad(tmp_path / "lake"),
               "mysql": MysqlLoad, "postgresql": PostgresqlLoad}
    for name, load in by_hand.items():
        assert load.capabilities == connectors.target(name).capabilities, name
    sql = LoadCapabilities(per_table=True, stores_position=True, copy_end=True, quarantine=True)
    assert PostgresqlLoad.capabilities == sql
    assert MysqlLoad.capabilities == LoadCapabilities(per_table=True, stores_position=True, sequences=True,
                                                      copy_end=True, quarantine=True)


def test_ddl_tasks_need_a_target_with_actions(tmp_path):
    """Batch DDL tasks on a target without declared pre-write actions stop at start, naming the supported ones."""
    conf = write_conf(tmp_path, f"{{type: sqlite, path: {tmp_path / 't.db'}}}",
                      extra="  ddl_tasks: {signal_table: ops.signals}\n", txs=make_stream(3))
    result = setl_cli(conf, "start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 2
    assert "target.type sqlite has no pre-write actions (supported: mysql)" in result.stderr


@pytest.fixture(scope="module")
def jsonl_plugin():
    """plugins/setl-jsonl-target, installed (CI installs it with pip install --no-deps -e)."""
    try:
        return metadata.distribution("setl-jsonl-target")
    except metadata.PackageNotFoundError:
        pytest.fail("install the example plugin first: pip install --no-deps -e plugins/setl-jsonl-target")


def test_setl_start_runs_the_plugin_target(tmp_path, jsonl_plugin):
    """`setl start` replicates a stream into the third-party jsonl target found through its entry
    point; a second run adds nothing, and per_table is refused since it is not declared."""
    from setl_jsonl_target import read_log, table_state

    txs = make_stream(300)
    conf = write_conf(tmp_path, f"{{type: jsonl, path: {tmp_path / 'log'}}}", txs=txs)
    result = setl_cli(conf, "start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    log = tmp_path / "log" / "p.jsonl"
    assert table_state(log, "demo.items") == reference_state(txs)["demo.items"]
    lines = read_log(log)[0]
    assert sum("op" in line for line in lines) == sum(len(tx) for tx in txs)
    assert setl_cli(conf, "start", "--pipeline", "p", "--until-caught-up").returncode == 0
    assert read_log(log)[0] == lines

    path = conf / "pipelines" / "p.yaml"
    path.write_text(path.read_text() + "  load: {mode: per_table}\n")
    refused = setl_cli(conf, "start", "--pipeline", "p", "--until-caught-up")
    assert refused.returncode == 2 and "target.type jsonl cannot load per table" in refused.stderr


def test_plugins_list_shows_sources_targets_and_transforms(tmp_path, jsonl_plugin):
    """`setl plugins list` lists sources, targets (the plugin's with its origin) and transforms."""
    result = setl_cli(tmp_path, "plugins", "list")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.index("SOURCES") < out.index("TARGETS") < out.index("TRANSFORMS")
    targets = out[out.index("TARGETS"):out.index("TRANSFORMS")]
    assert "jsonl" in targets and "setl-jsonl-target 0.1.0 (entry point setl_jsonl_target:connector)" in targets
    assert all(name in targets for name in BUILTIN_TARGETS)
    assert "file" in out[:out.index("TARGETS")] and "rename" in out[out.index("TRANSFORMS"):]


def test_example_plugin_passes_its_own_tests(jsonl_plugin):
    """plugins/setl-jsonl-target's own suite (the kit's LoadContract included) passes."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         str(REPO / "plugins" / "setl-jsonl-target" / "tests")],
        capture_output=True, text=True, timeout=280, cwd=REPO, check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "15 passed" in result.stdout


def test_factory_that_fails_is_a_broken_plugin(tmp_path, monkeypatch):
    """An entry point naming a factory that raises (a missing driver imported inside it) is a
    PluginError naming the plugin, not a traceback."""
    fake_distribution(tmp_path, "setl-fake-factory", "setl.sources", "kafka = fake_factory:kafka\n", "fake_factory",
                      "def kafka():\n    import confluent_kafka_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="ModuleNotFoundError") as info:
        ConnectorRegistry().source("kafka")
    assert info.value.context["plugin"] == "kafka" and "'fake_factory:kafka' (setl.sources)" in str(info.value)


def test_nested_config_class_of_a_plugin_is_validated(tmp_path, monkeypatch, fresh_registry):
    """A plugin config holding another attrs class (postponed annotations) validates the inner keys too."""
    fake_distribution(tmp_path / "site", "setl-fake-nested", "setl.targets", "nested = fake_nested:connector\n",
                      "fake_nested", """\
        from __future__ import annotations
        from typing import Literal
        import attrs
        from setl.connectors import TargetConnector

        @attrs.frozen
        class Auth:
            user: str
            retries: int = 3

        @attrs.frozen
        class NestedConfig:
            type: Literal["nested"]
            auth: Auth

        connector = TargetConnector("nested", NestedConfig, lambda config, context: None)
        """)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    conf = write_conf(tmp_path, "{type: nested, auth: {user: u, retries: many}}")
    with pytest.raises(ConfigError) as info:
        load_pipeline(conf, "p", registry())
    assert str(info.value).endswith("target.auth.retries: expected an integer, got 'many'")


def test_broken_plugin_is_listed_with_its_error(tmp_path, monkeypatch):
    """The targets listing shows a broken plugin as BROKEN with its error, and the others as usual."""
    fake_distribution(tmp_path, "setl-fake-listed", "setl.targets", "listed = fake_listed:connector\n",
                      "fake_listed", "raise RuntimeError('driver too old')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = setl.connectors.format_connector_table("target", ConnectorRegistry())
    broken = [line for line in text.splitlines() if line.startswith("listed ")]
    assert len(broken) == 1 and "BROKEN" in broken[0] and "RuntimeError: driver too old" in broken[0]
    assert any(line.startswith("sqlite ") for line in text.splitlines())


def test_target_type_may_come_from_the_environment(tmp_path, monkeypatch):
    """`type: ${VAR}` is expanded before the connector is chosen, like every other value."""
    monkeypatch.setenv("SETL_TEST_TARGET_TYPE", "sqlite")
    conf = write_conf(tmp_path, f"{{type: '${{SETL_TEST_TARGET_TYPE}}', path: {tmp_path / 't.db'}}}")
    assert load_pipeline(conf, "p", registry()).target.type == "sqlite"


def test_snapshots_capability_is_declared_and_enforced(tmp_path):
    """The mysql source declares snapshots and its Select gives `snapshot_access()` without connecting;
    a source declaring snapshots whose Select does not implement `SnapshotCapable` is a PluginError
    naming it; a source without the capability is left unwrapped by `with_snapshots`."""
    from setl.connectors import SourceConnector
    from setl.snapshot.select import SnapshotSelect, with_snapshots
    from setl.sources.file import FileSource, FileSourceConfig
    from setl.sources.mysql_binlog import MysqlSourceConfig
    from setl.stages.select import SelectCapabilities
    from setl.stages.snapshot import SnapshotAccess, SnapshotCapable

    connectors = ConnectorRegistry()
    mysql = connectors.source("mysql")
    assert mysql.capabilities.snapshots and not connectors.source("file").capabilities.snapshots
    source = mysql.create(MysqlSourceConfig(type="mysql", host="127.0.0.1", port=1, password="secret",
                                            start="snapshot"), BuildContext("p"))
    assert isinstance(source, SnapshotCapable)
    access = source.snapshot_access()
    assert isinstance(access, SnapshotAccess) and access.where == "127.0.0.1:1" and access.start_mode
    assert "secret" not in repr(access) and access.task_connect is not None
    wrapped = with_snapshots(source, pipeline="p", meta=lambda: None, parallelism=2)  # type: ignore[arg-type,return-value]
    assert isinstance(wrapped, SnapshotSelect) and wrapped.where == "127.0.0.1:1"

    def build(config: FileSourceConfig, context: BuildContext) -> FileSource:
        return FileSource(tmp_path / "none.jsonl", pipeline=context.name)

    liar = SourceConnector("liar", FileSourceConfig, build, SelectCapabilities(snapshots=True))
    with pytest.raises(PluginError, match="declares the snapshots capability") as info:
        liar.create(FileSourceConfig(type="file", path="none.jsonl"), BuildContext("p"))
    assert info.value.context["plugin"] == "liar"
    plain = connectors.source("file").create(FileSourceConfig(type="file", path=str(tmp_path / "x")),
                                             BuildContext("p"))
    assert with_snapshots(plain, pipeline="p", meta=lambda: None, parallelism=2) is plain  # type: ignore[arg-type,return-value]


def test_a_build_returning_a_wrapper_is_a_plugin_error(tmp_path):
    """A connector whose build returns something else than a Load or Select (a wrapper) is a
    PluginError naming the plugin, not an AttributeError from deep inside setl."""
    from setl.connectors import SourceConnector
    from setl.sources.file import FileSource, FileSourceConfig

    sqlite = ConnectorRegistry().target("sqlite")

    class Wrapper:
        """Holds a Load instead of being one."""

        __slots__ = ("inner",)

        def __init__(self, inner: object) -> None:
            self.inner = inner

    wrapping = TargetConnector("wrapping", sqlite.config, lambda c, x: Wrapper(sqlite.build(c, x)))
    with pytest.raises(PluginError, match=r"target type 'wrapping': its build returned .*Wrapper.*not a "
                                          r"setl\.stages\.load\.Load") as info:
        wrapping.create(sqlite.config("sqlite", str(tmp_path / "t.db")), BuildContext("p"))
    assert info.value.context["plugin"] == "wrapping"
    nothing = SourceConnector("nothing", FileSourceConfig, lambda c, x: None)
    with pytest.raises(PluginError, match=r"source type 'nothing': its build returned NoneType") as info:
        nothing.create(FileSourceConfig(type="file", path="x"), BuildContext("p"))
    assert info.value.context["plugin"] == "nothing"
    fine = SourceConnector("fine", FileSourceConfig, lambda c, x: FileSource(tmp_path / "x", pipeline="p"))
    assert isinstance(fine.create(FileSourceConfig(type="file", path="x"), BuildContext("p")), FileSource)


def test_declared_capabilities_must_be_implemented(tmp_path):
    """A connector declaring per_table, stores_position or reports_head whose built class keeps
    the base class's placeholder methods is a PluginError naming the plugin and the methods."""
    from setl.connectors import SourceConnector
    from setl.sources.file import FileSourceConfig
    from setl.stages.load import Load
    from setl.stages.select import Select, SelectCapabilities

    class Plain(Load):
        """Loads nothing, and implements no capability."""

        def load(self, batch: object) -> None:
            return None

    class Quiet(Select):
        """Reads nothing, and implements no capability."""

        def open(self, start: object) -> None:
            return None

        def poll(self, timeout: float) -> None:
            return None

        def close(self) -> None:
            return None

    config = ConnectorRegistry().target("sqlite").config("sqlite", "x.db")
    for capabilities, missing in [(LoadCapabilities(per_table=True), "load_part, mark_loaded"),
                                  (LoadCapabilities(stores_position=True), "committed")]:
        liar = TargetConnector("liar", type(config), lambda c, x: Plain(), capabilities)
        with pytest.raises(PluginError, match=f"declares the .* capability, but the Plain it builds does not "
                                              f"implement {missing}") as info:
            liar.create(config, BuildContext("p"))
        assert info.value.context["plugin"] == "liar"
    honest = TargetConnector("honest", type(config), lambda c, x: Plain())
    assert honest.create(config, BuildContext("p")).capabilities == LoadCapabilities()
    head = SourceConnector("head", FileSourceConfig, lambda c, x: Quiet(), SelectCapabilities(reports_head=True))
    with pytest.raises(PluginError, match="reports_head capability, but the Quiet it builds does not implement head"):
        head.create(FileSourceConfig(type="file", path="x"), BuildContext("p"))


def test_a_blocked_target_is_refused_unimported_and_listed(tmp_path, monkeypatch, fresh_registry):
    """A target named in setl.yaml's plugins.blocked is refused when a pipeline uses it, naming it
    and the setting, without importing its module; `setl plugins list` shows it as BLOCKED, and
    the other targets still load."""
    fake_distribution(tmp_path / "site", "setl-fake-blocked", "setl.targets", "blocked = fake_blocked:connector\n",
                      "fake_blocked", "raise RuntimeError('imported although blocked')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    conf = write_conf(tmp_path, "{type: blocked}")
    (conf / "setl.yaml").write_text((conf / "setl.yaml").read_text() + "plugins: {blocked: [blocked, sqlite]}\n")
    settings = load_node(conf)
    assert settings.plugins.blocked == ("blocked", "sqlite")
    with pytest.raises(PluginError, match="target type 'blocked' is blocked in setl.yaml") as info:
        load_pipeline(conf, "p", setl.connectors.for_node(settings))
    assert info.value.context["plugin"] == "blocked" and "imported although" not in str(info.value)
    text = setl.connectors.format_connector_table("target", setl.connectors.for_node(settings))
    lines = text.splitlines()
    assert any(line.startswith("blocked ") and "BLOCKED" in line for line in lines)
    assert any(line.startswith("sqlite ") and "BLOCKED" in line for line in lines)
    assert any(line.startswith("postgresql ") and "BLOCKED" not in line for line in lines)
    assert registry().target("sqlite").type == "sqlite"  # the node's setting, not the process's registry
    result = setl_cli(conf, "plugins", "list")
    assert result.returncode == 0 and "imported although" not in result.stdout + result.stderr
    assert "BLOCKED: plugin=sqlite: target type 'sqlite' is blocked" in result.stdout, result.stdout


def test_start_refuses_a_blocked_target(tmp_path):
    """`setl start` with the pipeline's target blocked exits 2 with one line naming the plugin."""
    conf = write_conf(tmp_path, f"{{type: sqlite, path: {tmp_path / 't.db'}}}", txs=make_stream(3))
    (conf / "setl.yaml").write_text((conf / "setl.yaml").read_text() + "plugins: {blocked: [sqlite]}\n")
    result = setl_cli(conf, "start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 2, result.stderr
    assert "target type 'sqlite' is blocked in setl.yaml (plugins.blocked)" in result.stderr
    assert not (tmp_path / "t.db").exists()


def test_a_target_that_creates_no_tables_is_warned_about(tmp_path, monkeypatch, caplog):
    """A pipeline whose target connector has neither a schema nor creates_tables is warned about
    at assembly (its tables must exist beforehand); one that declares creates_tables is not."""
    from setl.pipeline.build import table_creation
    from setl.sinks.sqlite import SqliteLoad

    @attrs.frozen
    class BareConfig:
        type: str
        path: str

    conf = write_conf(tmp_path, f"{{type: bare, path: {tmp_path / 't.db'}}}", txs=make_stream(3))
    settings = load_node(conf)

    def warnings(capabilities: LoadCapabilities) -> list[str]:
        connectors = ConnectorRegistry()
        connectors.register(TargetConnector("bare", BareConfig, lambda c, x: SqliteLoad(x.resolve(c.path)),
                                            capabilities))
        monkeypatch.setattr(setl.connectors, "_registry", connectors)
        config = load_pipeline(conf, "p", connectors)
        caplog.clear()
        with caplog.at_level("WARNING", logger="setl.pipeline"):
            assert table_creation(settings, config, None, None, None) is None  # type: ignore[arg-type]
        return [r.getMessage() for r in caplog.records]

    warned = warnings(LoadCapabilities(per_table=True, stores_position=True))
    assert len(warned) == 1 and "pipeline=p target type bare creates no tables and setl cannot create them" in warned[0]
    assert warnings(LoadCapabilities(per_table=True, stores_position=True, creates_tables=True)) == []


def test_the_binlog_source_reads_the_signal_table_the_rules_do_not_select(tmp_path):
    """A mysql source built for batch DDL tasks reads (decodes) its signal table's rows, which no rule selects."""
    from setl.config import load_node, load_pipeline
    from setl.connectors import build_select, registry

    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {tmp_path / 'meta.db'}}}\n")
    (conf / "pipelines" / "p.yaml").write_text(textwrap.dedent("""\
        source: {type: mysql, host: 127.0.0.1, port: 1, user: root, server_id: 77}
        target: {type: mysql, host: 127.0.0.1, port: 1, user: root}
        tables:
          - {source: 'app\\.orders', target: 'dw.orders'}
        pipeline:
          ddl_tasks: {signal_table: ops.signals}
        """))
    config = load_pipeline(conf, "p", registry())
    from setl.sources.mysql_binlog import MysqlBinlogSource

    source = build_select(config, load_node(conf), selects=lambda schema, table: (schema, table) == ("app", "orders"))
    assert isinstance(source, MysqlBinlogSource) and source.reads is not None and source.selects is not None
    assert source.reads("ops", "signals") and source.reads("app", "orders")
    assert not source.reads("app", "other") and not source.selects("ops", "signals")
