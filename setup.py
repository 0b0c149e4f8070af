"""Build of setl's one compiled module; everything else is declared in setup.cfg.

`setl.sources.mysql_binlog._rows` decodes binlog row images in C (Cython). `pip install .` and
`pip install -e .` build it with the compiler on the machine (gcc from apt); without it setl
still runs, decoding every event in Python (`setl.sources.mysql_binlog.fast.available()`).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("setl.sources.mysql_binlog._rows", ["setl/sources/mysql_binlog/_rows.pyx"])],
    compiler_directives={"language_level": "3"}, quiet=True))
