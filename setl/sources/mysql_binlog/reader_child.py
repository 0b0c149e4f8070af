"""The entry point of a binlog reader process (`process.main`): run as a module of its own, so that
the package's import of `process` does not precede its run as ``__main__``."""

import sys

from setl.sources.mysql_binlog.process import main

sys.exit(main())
