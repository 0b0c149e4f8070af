"""`setl verify`: prove a pipeline's target equal to its source, chunk by chunk, while it replicates.

`plan` decides per table what is compared (routing plan: names, excluded columns, filters) and
how (server-side hashes or rows fetched and compared in Python); `mariadb` and `postgresql` build
each engine's canonical text of a row; `compare` runs the consistent chunk comparisons, the
row-level drill down and the re-checks; `report` holds the result and prints it; `repair` turns a
report's differences into requests the pipeline serves (`setl repair`); `schedule` runs checks on
the node that holds a pipeline. See docs/verify.md.
"""

from setl.verify.compare import Verifier
from setl.verify.plan import TableCheck, plan_table
from setl.verify.report import Report, TableReport

__all__ = ["Report", "TableCheck", "TableReport", "Verifier", "plan_table"]
