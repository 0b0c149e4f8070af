"""One pipeline's scheduler, after otter's SETL: a permit-bounded Select, concurrent Extract and
Transform, Load in batch order (whole batches, or per target table), and Termin, which acks in
order or rolls back.

* `cutter`: Select's side, transactions into batches (`BatchCutter`);
* `ledger`: the batches in flight (`Slot`), each holding a permit until it is retired;
* `core`: the `Scheduler` itself: permits and epochs, Extract/Transform tasks, ordered and
  per-table load dispatch, Termin (ack or roll back), drain and teardown;
* `events`: `Outcome` and the `Listener` hooks.

`BatchCap` (the node-wide permit cap) lives in `setl.runtime` and is re-exported here.
"""

from setl.runtime import BatchCap
from setl.scheduler.core import Scheduler
from setl.scheduler.events import Fanout, Forwarding, Listener, Outcome
from setl.stages.load import supports_per_table

__all__ = ["BatchCap", "Fanout", "Forwarding", "Listener", "Outcome", "Scheduler", "supports_per_table"]
