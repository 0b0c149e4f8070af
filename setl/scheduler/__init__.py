"""One pipeline's scheduler, after otter's SETL: a permit-bounded Select, concurrent Extract and
Transform, Load in batch order (whole batches, or per target table), and Termin, which acks in
order or rolls back.

* `ledger`: the state machine the parts share (`Ledger`: the epoch, the batches in flight as
  `Slot`s, the ids to load and ack next, the acked position, rollback and rewind) and the
  `Permits` the batches hold until they are retired;
* `selecting`: Select's side (`Selector`), with `cutter` cutting transactions into batches
  (`BatchCutter`);
* `working`: Extract and Transform of each batch (`Worker`);
* `loading`: Load in id order, whole or per target table (`LoadDispatcher`);
* `termin`: ack in id order, or roll back, retry or pause (`Termin`);
* `core`: the `Scheduler`, which builds those parts around one `Ledger`, runs them as tasks,
  and drains and tears down;
* `events`: `Outcome` and the `Listener` hooks.

`BatchCap` (the node-wide permit cap) lives in `setl.runtime` and is re-exported here.
"""

from setl.runtime import BatchCap
from setl.scheduler.core import Scheduler
from setl.scheduler.events import Fanout, Forwarding, Listener, Outcome
from setl.stages.load import supports_per_table

__all__ = ["BatchCap", "Fanout", "Forwarding", "Listener", "Outcome", "Scheduler", "supports_per_table"]
