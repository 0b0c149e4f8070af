"""setl/ has no import cycle and no arrow up a floor, function-level and TYPE_CHECKING imports included
(tools/import_graph.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tools import import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_setl_has_no_import_cycle():
    """tools/import_graph.py finds no cycle among setl's modules and exits 0."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no import cycle" in run.stdout


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"setl/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_a_function_level_import_that_reaches_up_is_a_cycle(tmp_path, capsys):
    """An import inside a function that closes a loop is reported, with its line, and exits 1."""
    root = _package(tmp_path, {
        "setl/low.py": """\
            def resolve():
                from setl.high import thing
                return thing
            """,
        "setl/high.py": "from setl.low import resolve\nthing = 1\n",
    })
    assert import_graph.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "setl.low -> setl.high  (line 2)" in out and "setl.high -> setl.low  (line 1)" in out


def test_type_checking_and_relative_imports_count(tmp_path):
    """An import under ``if TYPE_CHECKING:`` counts, and relative imports are resolved."""
    root = _package(tmp_path, {
        "setl/pkg/__init__.py": "",
        "setl/pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "setl/pkg/b.py": "from . import a\nclass B: ...\n",
    })
    assert import_graph.cycles(import_graph.edges(root)) == [["setl.pkg.a", "setl.pkg.b"]]


def test_a_package_reexporting_its_modules_is_no_cycle(tmp_path):
    """A package ``__init__`` importing its submodules is not an arrow from each submodule to it."""
    root = _package(tmp_path, {
        "setl/pkg/__init__.py": "from setl.pkg.a import A\nfrom setl.pkg.b import B\n",
        "setl/pkg/a.py": "class A: ...\n",
        "setl/pkg/b.py": "from setl.pkg.a import A\nclass B(A): ...\n",
    })
    assert import_graph.cycles(import_graph.edges(root)) == []


def test_an_arrow_up_a_floor_is_reported(tmp_path, capsys):
    """A module importing one on a higher floor (model -> scheduler, even inside a function) is
    reported with both floors and its line, and exits 1, though it closes no cycle."""
    root = _package(tmp_path, {
        "setl/errors.py": "class SetlError(Exception): ...\n",
        "setl/model.py": """\
            from setl.errors import SetlError
            def build():
                from setl.scheduler.core import Scheduler
                return Scheduler
            """,
        "setl/scheduler/__init__.py": "",
        "setl/scheduler/core.py": "from setl.model import build\nclass Scheduler: ...\n",
    })
    graph = import_graph.edges(root)
    assert import_graph.cycles(graph) == [["setl.model", "setl.scheduler.core"]]
    up, homeless = import_graph.upward(graph)
    assert up == [("setl.model", "setl.scheduler.core", 3)] and homeless == []
    assert import_graph.main(["--root", str(root)]) == 1
    assert "upward: setl.model (ground) -> setl.scheduler.core (scheduler)  (line 3)" in capsys.readouterr().out


def test_downward_and_same_floor_arrows_pass(tmp_path, capsys):
    """Arrows down a floor or within one are fine: the script exits 0 and says so."""
    root = _package(tmp_path, {
        "setl/errors.py": "class SetlError(Exception): ...\n",
        "setl/config.py": "from setl.errors import SetlError\n",
        "setl/sinks/__init__.py": "",
        "setl/sinks/a.py": "from setl.config import SetlError\n",
        "setl/schema/__init__.py": "",
        "setl/schema/b.py": "from setl.sinks import a\n",
    })
    assert import_graph.main(["--root", str(root)]) == 0
    assert "no arrow up a floor" in capsys.readouterr().out


def test_a_module_on_no_floor_is_reported(tmp_path, capsys):
    """A new top-level module not placed in FLOORS fails the check, naming it."""
    root = _package(tmp_path, {"setl/errors.py": "", "setl/newthing.py": "from setl.errors import *\n"})
    assert import_graph.main(["--root", str(root)]) == 1
    assert "no floor: setl.newthing" in capsys.readouterr().out


def test_every_setl_module_has_a_floor_and_none_reaches_up():
    """On setl/ itself: every module is on a floor, and only the listed exceptions reach up."""
    up, homeless = import_graph.upward(import_graph.edges(ROOT))
    assert up == [] and homeless == []
    graph = import_graph.edges(ROOT)
    for (importer, imported), why in import_graph.ALLOWED_UP.items():
        assert imported in graph[importer], f"stale exception {importer} -> {imported}: {why}"


def test_a_class_over_the_limit_is_reported(tmp_path, capsys):
    """A class longer than MAX_CLASS_LINES that is not on the allow-list fails the check, naming
    it with its length; one at the limit passes."""
    body = "".join(f"    x{i} = {i}\n" for i in range(import_graph.MAX_CLASS_LINES))
    root = _package(tmp_path, {
        "setl/errors.py": "",
        "setl/model.py": "class Big:\n" + body + "\nclass Fits:\n" + body[:-len("    x0 = 0\n") - 1] + "\n",
    })
    over, _ = import_graph.big_classes(root)
    assert over == [("setl.model:Big", import_graph.MAX_CLASS_LINES + 1)]
    assert import_graph.main(["--root", str(root)]) == 1
    assert f"too long: class setl.model:Big has {import_graph.MAX_CLASS_LINES + 1} lines" in capsys.readouterr().out


def test_no_class_in_setl_is_over_the_limit_but_the_listed_ones():
    """On setl/ itself: no class is over MAX_CLASS_LINES but those on the shrinking allow-list, and
    every one on the list still is (a split class leaves the list)."""
    over, stale = import_graph.big_classes(ROOT)
    assert over == [] and stale == []
