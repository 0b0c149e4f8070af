"""docs/config-reference.md is generated from the config classes and must match them."""

from __future__ import annotations

import attrs

from setl.config import NodeSettings, PipelineConfig
from tools import gen_config_reference as gen


def test_committed_reference_is_up_to_date():
    """The committed docs/config-reference.md is what tools/gen_config_reference.py writes now."""
    committed = gen.OUTPUT.read_text(encoding="utf-8")
    assert committed == gen.render(), (
        "docs/config-reference.md is out of date: run python tools/gen_config_reference.py")


def test_check_mode_reports_a_stale_file(tmp_path):
    """`--check` exits 1 for a file that differs from the classes and 0 for a fresh one."""
    stale = tmp_path / "ref.md"
    stale.write_text("old\n")
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert gen.main(["--output", str(stale)]) == 0
    assert gen.main(["--check", "--output", str(stale)]) == 0


def _keys(cls: type, path: str = "") -> set[str]:
    found: set[str] = set()
    for field in attrs.fields(cls):
        if field.metadata.get("internal") or field.metadata.get("connector"):
            continue
        key = f"{path}.{field.name}" if path else field.name
        found.add(key)
        inner = gen._attrs_in(field.type)
        if inner is not None:
            found |= _keys(inner, f"{key}[]" if gen._is_list(field.type) else key)
    return found


def test_every_key_of_both_files_is_listed():
    """Each key of setl.yaml and of a pipeline file (nested ones and list items included) has a row."""
    node, pipeline = gen.all_sections()
    listed = {row.key for section in [*node, *pipeline] for row in section.rows}
    assert _keys(NodeSettings) <= listed
    assert _keys(PipelineConfig) <= listed
    for kind in ("source", "target"):
        for connector in gen.builtin_connectors(kind):
            assert {f"{kind}.{k}" for k in _keys(connector.config)} <= listed, connector.type


@attrs.frozen
class _Inner:
    """An inner mapping."""

    depth: int = 2  # how deep


@attrs.frozen
class _Example:
    """A class as another helper might add to the config."""

    needed: float  # required
    plain: str = "x"  # trailing comment
    #: a comment above
    #: on two lines
    above: bool = False
    documented: int = attrs.field(default=3, metadata={"doc": "from metadata"})
    inner: _Inner | None = None
    items: tuple[_Inner, ...] = ()


def test_new_keys_are_picked_up_with_their_documentation():
    """A new class's keys appear with type, default and the doc from metadata or comments, nested
    and list-item mappings as sections of their own."""
    sections = list(gen.sections_of(_Example, "example", "`example`"))
    rows = {row.key: row for section in sections for row in section.rows}
    assert rows["example.plain"] == gen.Row("example.plain", "string", "`x`", "trailing comment")
    assert rows["example.above"].doc == "a comment above on two lines"
    assert rows["example.above"].default == "`false`"
    assert rows["example.documented"].doc == "from metadata"
    assert rows["example.inner"].type == "mapping or null"
    assert rows["example.inner.depth"] == gen.Row("example.inner.depth", "integer", "`2`", "how deep")
    assert rows["example.items[].depth"].doc == "how deep"
    assert rows["example.needed"].default == "required"
    assert [s.title for s in sections] == ["`example`", "`example.inner`", "`example.items[]`"]
    assert sections[0].text == "A class as another helper might add to the config."
