"""The entry point of a binlog reader process (`process.main`): run as a module of its own, so that
the package's import of `process` does not precede its run as ``__main__``."""

import sys

from setl.sources.mysql_binlog.process import main

if __name__ == "__main__":  # importing it (docs, a module walk) starts nothing
    sys.exit(main())
