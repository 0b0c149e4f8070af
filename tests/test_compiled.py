"""setl's compiled modules stay honest: SETL_PURE_PYTHON=1 runs their sources, and a stale build says so.

Each case imports setl in a subprocess, so that the finder (`setl._compiled`) chooses afresh.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from setl import _compiled

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, logging, sys
import setl.sinks.merge, setl.sinks.mysql_sql, setl.sinks.sql_rows, setl.snapshot.rows, setl.reads
from setl.sources.mysql_binlog import assembler, fast
import setl.sinks.merge  # again: still one warning
print(json.dumps({"merge": setl.sinks.merge.__file__, "mysql_sql": setl.sinks.mysql_sql.__file__,
                  "assembler": assembler.__file__, "fast": fast.__file__, "fast_available": fast.available(),
                  "reads": setl.reads.COMPILED, "rowparse": setl.snapshot.rows.COMPILED,
                  "loaddata": setl.sinks.mysql_sql.COMPILED, "images": setl.sinks.sql_rows.COMPILED}))
"""


def probe(tree: Path, **env: str) -> tuple[dict, str]:
    """What a fresh interpreter importing setl from `tree` runs: the modules' files, and its stderr."""
    environ = {k: v for k, v in os.environ.items() if k != _compiled.PURE_PYTHON}
    environ.update(env, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tree, env=environ, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_pure_python_runs_every_compiled_modules_source():
    """SETL_PURE_PYTHON=1: the .py modules come from their .py, and the .pyx-only ones count as not built."""
    found, stderr = probe(ROOT, SETL_PURE_PYTHON="1")
    for name in ("merge", "mysql_sql", "assembler", "fast"):
        assert found[name].endswith(".py"), found
    assert found["fast_available"] is False and found["reads"] is False and found["rowparse"] is False
    assert found["loaddata"] is False and found["images"] is False
    assert "older than its source" not in stderr


def test_without_the_switch_the_built_modules_run():
    """Without the switch, in this freshly built tree, every compiled module runs compiled and nothing warns."""
    found, stderr = probe(ROOT)
    for name in ("merge", "mysql_sql", "assembler", "fast"):
        assert found[name].endswith(".so"), found
    assert found["fast_available"] is True and found["reads"] is not False and found["rowparse"] is True
    assert found["loaddata"] is True and found["images"] is True
    assert "older than its source" not in stderr


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A copy of the built package, with a setup.py beside it as in a source tree."""
    shutil.copytree(ROOT / "setl", tmp_path / "setl", ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    shutil.copy(ROOT / "setup.py", tmp_path / "setup.py")
    return tmp_path


def _newer(path: Path, than: Path) -> None:
    built = than.stat().st_mtime
    os.utime(path, (built + 60, built + 60))


def test_a_source_newer_than_its_build_warns_once_and_runs_the_source(tree_copy):
    """An edited merge.py (newer than its .so) runs from the .py with one warning naming the module and the
    rebuild; the modules whose build is current stay compiled."""
    merge = tree_copy / "setl" / "sinks" / "merge.py"
    [built] = merge.parent.glob("merge.*.so")
    _newer(merge, built)
    found, stderr = probe(tree_copy)
    assert found["merge"] == str(merge)
    assert found["mysql_sql"].endswith(".so") and found["fast_available"] is True
    warnings = [line for line in stderr.splitlines() if "older than its source" in line]
    assert len(warnings) == 1, stderr
    assert "setl.sinks.merge" in warnings[0] and "pip install -e ." in warnings[0]
    assert "python3 setup.py build_ext --inplace" in warnings[0]


def test_a_pyx_newer_than_its_build_counts_as_not_built(tree_copy):
    """An edited _rows.pyx (newer than its .so) is not run stale: the library decodes, with a warning."""
    rows = tree_copy / "setl" / "sources" / "mysql_binlog" / "_rows.pyx"
    [built] = rows.parent.glob("_rows.*.so")
    _newer(rows, built)
    found, stderr = probe(tree_copy)
    assert found["fast_available"] is False and found["fast"].endswith(".so")
    assert "setl.sources.mysql_binlog._rows" in stderr and "build_ext --inplace" in stderr


def test_an_installed_package_is_not_second_guessed(tree_copy):
    """Without setup.py beside the package (a wheel install, whose file times mean nothing), the build runs."""
    (tree_copy / "setup.py").unlink()
    merge = tree_copy / "setl" / "sinks" / "merge.py"
    [built] = merge.parent.glob("merge.*.so")
    _newer(merge, built)
    found, stderr = probe(tree_copy)
    assert found["merge"].endswith(".so")
    assert "older than its source" not in stderr
