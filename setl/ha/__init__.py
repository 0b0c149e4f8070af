"""High availability on ZooKeeper: the one adapter to kazoo, the per-pipeline *mainstem* election
that keeps a hot standby, and the fences that stop a deposed leader from selecting, loading or
acking.

Every ZooKeeper path setl uses (under the configured root, ``ha.chroot``, ``/setl`` by default):

``/nodes/ID``
    ephemeral, one per running node: ``{"host", "pid", "started", "capacity", "pipelines"}``, and
    ``"api"`` (its control API's base URL) when it serves one.
``/cluster/...``
    the cluster's coordinator election, assignments, drain marks and move requests
    (`setl.ha.cluster`, docs/cluster.md).
``/pipelines/NAME/mainstem``
    ephemeral, the holder of the pipeline: ``{"node", "since"}``. Only its owner reads the
    binlog, writes the target or acks.
``/pipelines/NAME/term``
    persistent. Every holder sets it when it takes the mainstem, in the same transaction as the
    create, so its *version* is the holder's fencing token; the data names the last holder and
    whether it released the mainstem on purpose (``{"node", "released", "to"}``).
``/pipelines/NAME/standbys/ID``
    ephemeral, one per node waiting as a hot standby.
``/pipelines/NAME/switch``
    an operator's request (`setl switch`) that the holder hand over: ``{"from", "to"}``.
``/pipelines/NAME/{position,state,epoch,acks/ack-N}``
    the meta store's records (see `setl.meta.zookeeper`).

Fencing: the holder's acks and epoch bumps are transactions that check the term version it
wrote; a node that lost the mainstem (session expired, process frozen) fails them with
`LeadershipLost` however late they arrive. Select and Load are wrapped to check the lease
before each poll and each load: on SUSPENDED (no connection) they wait, and once the
connection has been gone longer than the session timeout, or the session is LOST, the lease is
lost and they raise `LeadershipLost`, which the scheduler turns into `Outcome.LOST`.

The package: `setl.ha.coordinator` (the kazoo adapter: the session and its transactions),
`setl.ha.election` (the mainstem election and a node's `Elections`), `setl.ha.fencing`
(the lease and the fenced stages), `setl.ha.assign` (where each pipeline runs: a pure function)
and `setl.ha.cluster` (the elected coordinator that writes the assignments, and each node's view
of them).
"""

from setl.ha.coordinator import (
    Check,
    Conflict,
    Coordinator,
    Create,
    Delete,
    Fence,
    Op,
    SetData,
    ZNode,
    dumps,
)
from setl.ha.election import Elections, Mainstem
from setl.ha.fencing import FencedLoad, FencedSelect, Lease

__all__ = [
    "Check", "Conflict", "Coordinator", "Create", "Delete", "Elections", "Fence", "FencedLoad",
    "FencedSelect", "Lease", "Mainstem", "Op", "SetData", "ZNode", "dumps",
]
