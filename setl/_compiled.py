"""Which of setl's modules run compiled: the built extension, or its source when asked or when stale.

setup.py compiles some modules from their .py (`fast`, `assembler`, `frames`, `snapshot.rows`, `sinks.merge`,
`sinks.mysql_sql`) and some from a .pyx only (`_rows`, `_reads`, `_rowparse`, `_loaddata`, `_images`);
Python imports a built extension before a .py of the same name. The finder installed here (by `setl/__init__.py`,
before anything else of setl is imported) decides instead, for a setl module with both:

* with ``SETL_PURE_PYTHON=1`` in the environment, the .py runs, and a .pyx-only module is "not
  built" (ImportError: `fast.available()` is False and the pure fallbacks serve);
* in a source tree (an editable install or ``build_ext --inplace``: setup.py beside the package),
  an extension older than its .py or .pyx is stale: one warning names the module and the fix, and
  the source serves as above. Else an edited merge.py would keep running the old compiled code.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

#: the environment switch: "1" (or any value but "", "0") runs every compiled module's source
PURE_PYTHON = "SETL_PURE_PYTHON"
_ROOT = Path(__file__).resolve().parent
#: a source tree keeps setup.py beside the package; an installed wheel does not (its files' times
#: are the install's, in no useful order)
_SOURCE_TREE = (_ROOT.parent / "setup.py").is_file()
log = logging.getLogger("setl")


def pure_python() -> bool:
    """Whether ``SETL_PURE_PYTHON`` asks for the modules' sources instead of their built extensions."""
    return os.environ.get(PURE_PYTHON, "") not in ("", "0")


class SourceFinder:
    """A meta-path finder for setl's modules that have a built extension and a source (see the module)."""

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("setl.") or not path:
            return None
        name = fullname.rpartition(".")[2]
        for folder in path:
            built = _extension(folder, name)
            if built is None:
                continue
            py, pyx = Path(folder, name + ".py"), Path(folder, name + ".pyx")
            source = py if py.is_file() else pyx if pyx.is_file() else None
            if source is None:
                return None
            if not pure_python() and not (_SOURCE_TREE and _older(built, source)):
                return None  # the built module, as Python finds it
            if not pure_python() and fullname not in self.warned:
                self.warned.add(fullname)
                log.warning("%s: the compiled module %s is older than its source %s; running the source%s. "
                            "Rebuild it: `pip install -e .` or `python3 setup.py build_ext --inplace`", fullname,
                            built.name, source.name, "" if source is py else " (not built: the pure fallback)")
            if source is py:
                return importlib.util.spec_from_file_location(fullname, py)
            why = f"{PURE_PYTHON}=1" if pure_python() else f"{built.name} is older than {source.name}"
            raise ModuleNotFoundError(f"{fullname} is not used: {why}", name=fullname)
        return None


def _extension(folder: str, name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = Path(folder, name + suffix)
        if candidate.is_file():
            return candidate
    return None


def _older(built: Path, source: Path) -> bool:
    try:
        return built.stat().st_mtime < source.stat().st_mtime
    except OSError:
        return False


def install() -> SourceFinder:
    """Put the finder first on `sys.meta_path`, once per process."""
    for finder in sys.meta_path:
        if isinstance(finder, SourceFinder):
            return finder
    finder = SourceFinder()
    sys.meta_path.insert(0, finder)
    return finder


install()
