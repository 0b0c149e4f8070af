"""Build of setl's compiled modules; everything else is declared in setup.cfg.

`setl.sources.mysql_binlog._rows` decodes binlog row images in C (Cython, docs/performance.md);
`fast` and `assembler`, the rest of the binlog reader's hot loop, and the per-row loops of a
snapshot and of every load (`setl.snapshot.rows`, `setl.sinks.merge`, `setl.sinks.mysql_sql`) are
compiled from their .py as they are (Python imports the built module before the .py; the .py
serves where none is built); `setl.sinks._loaddata` writes a chunk's ``LOAD DATA`` input in C.
`pip install .` and `pip install -e .` build it with the machine's C compiler (Debian: gcc,
libc6-dev, python3-dev; tools/setup.sh and .ci/run install them). Where it cannot be compiled the
install goes on with a warning and setl decodes every event in Python, more slowly
(`setl.sources.mysql_binlog.fast.available()` is False; the tests check that it is True).
"""

import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """`build_ext` that warns instead of failing when the compiler is missing or fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler at all (DistutilsPlatformError and the like)
            self._warn(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - the compiler failed (CompileError, missing Python.h)
            self._warn(exc)

    @staticmethod
    def _warn(exc: Exception) -> None:
        print(f"WARNING: setl's compiled row decoder was not built ({exc}); setl will decode binlog rows "
              "in Python, several times slower. Install gcc, libc6-dev and python3-dev, then reinstall.",
              file=sys.stderr)


setup(
    ext_modules=cythonize(
        [Extension("setl.sources.mysql_binlog._rows", ["setl/sources/mysql_binlog/_rows.pyx"]),
         # snapshot reads built in C (`setl.reads`)
         Extension("setl._reads", ["setl/_reads.pyx"]),
         # plain Python modules of the reader's hot loop, compiled as they are (the .py is used where not built)
         Extension("setl.sources.mysql_binlog.fast", ["setl/sources/mysql_binlog/fast.py"]),
         Extension("setl.sources.mysql_binlog.assembler", ["setl/sources/mysql_binlog/assembler.py"]),
         # the reader process's frames, decoded in the node for every row change it hands on
         Extension("setl.sources.mysql_binlog.frames", ["setl/sources/mysql_binlog/frames.py"]),
         # the snapshot's and every load's per-row loops: chunk rows read, merged, written as text
         Extension("setl.snapshot.rows", ["setl/snapshot/rows.py"]),
         Extension("setl.snapshot._rowparse", ["setl/snapshot/_rowparse.pyx"]),
         Extension("setl.sinks.merge", ["setl/sinks/merge.py"]),
         Extension("setl.sinks.mysql_sql", ["setl/sinks/mysql_sql.py"]),
         # a chunk of snapshot rows as LOAD DATA input, text and integers in C (`setl.sinks.mysql_sql`)
         Extension("setl.sinks._loaddata", ["setl/sinks/_loaddata.pyx"]),
         # a batch's row images scanned in C: a type among their values, one column list (`setl.sinks.sql_rows`)
         Extension("setl.sinks._images", ["setl/sinks/_images.pyx"])],
        # annotation_typing off: the .py modules' type hints stay hints (no runtime type checks)
        compiler_directives={"language_level": "3", "annotation_typing": False}, quiet=True),
    cmdclass={"build_ext": OptionalBuildExt},
)
