"""Every entry of docs/runbook.md names the tests that perform its fix (issue 34 point 6), and every
test it names exists: a renamed or deleted test, or a new entry without one, fails here (no servers)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
REFERENCE = {"Statuses (`setl status`)", "Alerts"}  # tables of meanings, pointing at the entries below
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def sections(text: str) -> dict[str, str]:
    """The runbook's ``##`` sections: heading -> body."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


def defined_tests(path: Path) -> set[str]:
    """The names of the module-level test functions of a test file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_runbook_entry_names_tests_that_exist() -> None:
    """Each ``##`` entry but the two reference tables has a ``Tested by`` line naming at least one
    ``tests/...py::test_x``, and each named function is a test in that file."""
    found = sections(RUNBOOK.read_text(encoding="utf-8"))
    assert REFERENCE <= set(found), sorted(found)
    entries = {heading: body for heading, body in found.items() if heading not in REFERENCE}
    assert len(entries) >= 13, sorted(entries)
    missing = []
    for heading, body in entries.items():
        tested = [line for line in re.split(r"\n\s*\n", body) if line.startswith("Tested by ")]
        named = [pair for paragraph in tested for pair in NAMED.findall(" ".join(paragraph.split()))]
        if not named:
            missing.append(f"{heading}: no 'Tested by `tests/...::test_x`' paragraph")
        for file, name in named:
            path = ROOT / file
            if not path.is_file() or name not in defined_tests(path):
                missing.append(f"{heading}: {file}::{name} does not exist")
    assert not missing, "\n".join(missing)


def test_the_index_check_sees_a_missing_or_unknown_test() -> None:
    """The parsing the check relies on: a section without a Tested-by paragraph names nothing, and an
    unknown function is not among a file's tests."""
    text = "## One\n\nfix it\n\nTested by `tests/e2e/test_runbook_index.py::test_nope`.\n\n## Two\n\nfix\n"
    found = sections(text)
    assert set(found) == {"One", "Two"}
    assert NAMED.findall(found["One"]) == [("tests/e2e/test_runbook_index.py", "test_nope")]
    assert NAMED.findall(found["Two"]) == []
    assert "test_nope" not in defined_tests(Path(__file__)) and "test_every_runbook_entry_names_tests_that_exist" in (
        defined_tests(Path(__file__)))
