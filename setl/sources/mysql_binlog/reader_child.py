"""The entry point of a binlog reader process (`process.main`), run by its path (`process.spawn`), not
with ``-m``: ``-m`` would first run the package ``__init__``s of `setl` and `setl.sources.mysql_binlog`,
which import the scheduler, the stages and every connector (a third of the child's start-up CPU),
none of which a reader runs. `lean_packages` makes those three packages bare (their ``__path__``
only), so the child imports just the reader's modules; run it with ``-m`` and it works as well, the
long way.
"""

import sys
import types
from pathlib import Path

#: the packages on the way to the reader's modules, made bare in a reader process
PACKAGES = ("setl", "setl.sources", "setl.sources.mysql_binlog")


def lean_packages(root: Path) -> None:
    """Register `PACKAGES` as bare packages of the tree at `root` (unless imported already), then let
    `setl._compiled` choose compiled modules or their sources, as `setl/__init__` would first."""
    for name in PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")))]
            package.__package__ = name
            sys.modules[name] = package
    import setl._compiled  # noqa: F401 - installs its finder before any compiled module is imported


if __name__ == "__main__":  # importing it (docs, a module walk) starts nothing
    if __spec__ is None:  # run by its path: its folder is sys.path[0], whose modules are setl's, not top-level ones
        del sys.path[0]
        lean_packages(Path(__file__).resolve().parents[3])
    from setl.sources.mysql_binlog.process import main

    sys.exit(main())
