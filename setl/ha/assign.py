"""The cluster's assignment as a pure function: which live node runs each pipeline (`plan`).

No ZooKeeper, no threads, no clock: `setl.ha.cluster` reads the cluster's state, calls `plan`
and writes what it returns. Rules, in order:

* a pipeline runs only on an *eligible* node: live, not draining, configured with the pipeline,
  among its pinned ``pipeline.nodes`` if set, and with room for its weight under the node's
  ``node.capacity`` (a ceiling on the total weight it runs; None: no ceiling);
* sticky: a pipeline on an eligible node stays there; a pipeline without one (new, its node lost
  or drained, its pin changed) is *placed* on the eligible node with the least total weight;
* balance: then at most **one** pipeline *moves*, from the node that runs the most weight (or one
  over its capacity) to the eligible node with the least, and only when that strictly evens the
  loads out (the sum of squared loads falls, so repeated plans end); pipelines in `held` (placed
  by an operator's move) and pipelines placed by the same plan are not moved by balance;
* each pipeline gets a *standby*: another eligible node, spread so that the pipelines of one node
  have their standbys on different nodes. The standby takes a pipeline over at once when its node
  dies (the hot standby), before the coordinator reassigns it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import attrs


@attrs.frozen
class PipelineSpec:
    """What the assignment needs of one pipeline."""

    name: str
    weight: int = 1
    nodes: frozenset[str] | None = None  # pinned: only these nodes; None: any
    configured_on: frozenset[str] | None = None  # the live nodes configured with it; None: all


@attrs.frozen
class NodeSpec:
    """What the assignment needs of one live node."""

    name: str
    capacity: int | None = None  # the most total weight it runs; None: no ceiling
    draining: bool = False  # an operator's `setl cluster drain`: runs nothing


@attrs.frozen
class Move:
    pipeline: str
    source: str
    target: str


@attrs.frozen
class Plan:
    """The next assignment: `owners` (pipeline -> node, or None where no node is eligible),
    `standbys` (pipeline -> node or None), `placed` (pipelines newly given an owner, not moved
    from a running one) and at most one balancing `move` (already in `owners`)."""

    owners: dict[str, str | None]
    standbys: dict[str, str | None]
    placed: tuple[str, ...] = ()
    move: Move | None = None

    def loads(self, nodes: Iterable[str]) -> dict[str, int]:
        return loads_of(self.owners, {}, nodes)


def loads_of(owners: Mapping[str, str | None], weights: Mapping[str, int], nodes: Iterable[str]) -> dict[str, int]:
    """Total weight per node (every node in `nodes`, 0 when it runs nothing)."""
    loads = dict.fromkeys(nodes, 0)
    for pipeline, node in owners.items():
        if node is not None and node in loads:
            loads[node] += weights.get(pipeline, 1)
    return loads


def eligible(spec: PipelineSpec, node: NodeSpec) -> bool:
    """Whether `node` may run `spec` at all (room aside)."""
    if node.draining:
        return False
    if spec.configured_on is not None and node.name not in spec.configured_on:
        return False
    return spec.nodes is None or node.name in spec.nodes


def _room(node: NodeSpec, load: int, weight: int) -> bool:
    return node.capacity is None or load + weight <= node.capacity


def plan(pipelines: Mapping[str, PipelineSpec], nodes: Mapping[str, NodeSpec],
         current: Mapping[str, str | None], *, standbys: Mapping[str, str | None] | None = None,
         held: Collection[str] = (), balance: bool = True) -> Plan:
    """The next assignment of `pipelines` over the live `nodes`, from the `current` owners (and
    standbys). With `balance` False, only placements are made (a move is in flight)."""
    weights = {name: spec.weight for name, spec in pipelines.items()}
    owners: dict[str, str | None] = {}
    for name in sorted(pipelines):
        node = current.get(name)
        owners[name] = node if node is not None and node in nodes and eligible(pipelines[name], nodes[node]) else None
    loads = loads_of(owners, weights, nodes)

    placed: list[str] = []
    def choice(name: str) -> tuple[int, int, str]:  # the most constrained and heaviest first
        return (sum(eligible(pipelines[name], spec) for spec in nodes.values()), -weights[name], name)

    for name in sorted((n for n in owners if owners[n] is None), key=choice):
        spec = pipelines[name]
        options = [n for n in sorted(nodes) if eligible(spec, nodes[n]) and _room(nodes[n], loads[n], spec.weight)]
        if options:
            target = min(options, key=lambda n: (loads[n], n))
            owners[name] = target
            loads[target] += spec.weight
            placed.append(name)

    move = _one_move(pipelines, nodes, owners, loads, {*held, *placed}) if balance else None
    if move is not None:
        owners[move.pipeline] = move.target
        loads[move.source] -= weights[move.pipeline]
        loads[move.target] += weights[move.pipeline]
    return Plan(owners, _standbys(pipelines, nodes, owners, loads, standbys or {}), tuple(placed), move)


def _one_move(pipelines: Mapping[str, PipelineSpec], nodes: Mapping[str, NodeSpec], owners: Mapping[str, str | None],
              loads: Mapping[str, int], held: Collection[str]) -> Move | None:
    """The one move that evens the loads out most (a node over its capacity first), or None."""
    best: tuple[tuple[int, int, int, str, str], Move] | None = None
    for name in sorted(owners):
        source = owners[name]
        if source is None or name in held:
            continue
        spec = pipelines[name]
        over = nodes[source].capacity is not None and loads[source] > (nodes[source].capacity or 0)
        for target in sorted(nodes):
            if target == source or not eligible(spec, nodes[target]):
                continue
            if not _room(nodes[target], loads[target], spec.weight):
                continue
            gain = loads[source] - (loads[target] + spec.weight)  # > 0: the squares' sum falls
            if gain <= 0 and not over:
                continue
            # over capacity first, then the biggest gain, then the lightest pipeline, then by name
            key = (0 if over else 1, -gain, spec.weight, name, target)
            if best is None or key < best[0]:
                best = (key, Move(name, source, target))
    return None if best is None else best[1]


def _standbys(pipelines: Mapping[str, PipelineSpec], nodes: Mapping[str, NodeSpec], owners: Mapping[str, str | None],
              loads: Mapping[str, int], current: Mapping[str, str | None]) -> dict[str, str | None]:
    """A standby per owned pipeline: sticky while still eligible, else the node that stands by
    for the fewest of the owner's pipelines (then the least loaded)."""
    found: dict[str, str | None] = {}
    pairs: dict[tuple[str, str], int] = {}
    totals = dict.fromkeys(nodes, 0)

    def take(name: str, owner: str, node: str) -> None:
        found[name] = node
        pairs[owner, node] = pairs.get((owner, node), 0) + 1
        totals[node] += 1

    def ok(name: str, owner: str, node: str | None) -> bool:
        return node is not None and node != owner and node in nodes and eligible(pipelines[name], nodes[node])

    later = []
    for name in sorted(owners):
        owner = owners[name]
        if owner is None:
            found[name] = None
        elif ok(name, owner, current.get(name)):
            take(name, owner, current[name])  # type: ignore[arg-type]
        else:
            later.append(name)
    for name in later:
        owner = owners[name]
        assert owner is not None
        options = [n for n in sorted(nodes) if ok(name, owner, n)]
        if not options:
            found[name] = None
            continue
        take(name, owner, min(options, key=lambda n: (pairs.get((owner, n), 0), totals[n], loads[n], n)))
    return found
