"""The cluster's pure assignment function (`setl.ha.assign.plan`): balance, stickiness, capacity,
pinning and standbys, driven without ZooKeeper or threads."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from setl.ha.assign import NodeSpec, PipelineSpec, eligible, loads_of, plan


def settle(pipelines, nodes, current, *, held=(), limit=200):
    """Apply plans (placements and one move each) until one neither places nor moves; returns the
    owners and the number of moves made. A plan that places makes no move for the pipelines it
    placed; the coordinator plans again (on the owners' change, and every interval), and so does
    this loop: stopping at the first plan without a move left a placement's imbalance unchecked."""
    owners, standbys, moves = dict(current), {}, 0
    for _ in range(limit):
        result = plan(pipelines, nodes, owners, standbys=standbys, held=held)
        owners, standbys = result.owners, result.standbys
        if result.move is None and not result.placed:
            return owners, standbys, moves
        moves += 1
    raise AssertionError(f"no fixpoint after {limit} plans: {owners}")


names = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def clusters(draw):
    node_names = draw(st.sets(names, min_size=1, max_size=4))
    nodes = {n: NodeSpec(n, capacity=draw(st.one_of(st.none(), st.integers(1, 12))),
                         draining=draw(st.booleans()) and draw(st.booleans()))
             for n in sorted(node_names)}
    count = draw(st.integers(0, 10))
    pipelines = {}
    for i in range(count):
        pinned = draw(st.one_of(st.none(), st.frozensets(names, min_size=1, max_size=3)))
        pipelines[f"p{i}"] = PipelineSpec(f"p{i}", weight=draw(st.integers(1, 4)), nodes=pinned)
    current = {p: draw(st.one_of(st.none(), names)) for p in pipelines}
    return pipelines, nodes, current


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_every_owner_is_eligible_and_within_capacity(cluster):
    """Placements land only on live, undrained, pinned nodes, and never past a node's capacity
    (unless the pipeline was already there: the move that fixes that comes one at a time)."""
    pipelines, nodes, current = cluster
    result = plan(pipelines, nodes, current)
    for name, node in result.owners.items():
        if node is not None:
            assert eligible(pipelines[name], nodes[node])
    weights = {p: s.weight for p, s in pipelines.items()}
    kept = {p: n for p, n in result.owners.items() if p not in result.placed}
    for node, load in loads_of(result.owners, weights, nodes).items():
        capacity = nodes[node].capacity
        if capacity is not None:
            assert load <= max(capacity, loads_of(kept, weights, nodes)[node]), (node, load, result)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_sticky_one_move_at_a_time(cluster):
    """Only pipelines without an eligible owner are placed; at most one running pipeline moves per plan."""
    pipelines, nodes, current = cluster
    result = plan(pipelines, nodes, current)
    changed = {p for p in pipelines if result.owners[p] != current.get(p)}
    moved = changed - set(result.placed) - {p for p in pipelines if result.owners[p] is None}
    assert len(moved) <= 1
    if result.move is not None:
        assert moved == {result.move.pipeline}
        assert current[result.move.pipeline] == result.move.source
    for name in result.placed:
        owner = current.get(name)
        assert owner not in nodes or not eligible(pipelines[name], nodes[owner])


@settings(max_examples=200, deadline=None)
@given(clusters())
@example(({"p0": PipelineSpec("p0", 2), "p1": PipelineSpec("p1", 1, frozenset("abc")),
           "p2": PipelineSpec("p2", 2), "p3": PipelineSpec("p3", 1, frozenset("ac"))},
          {"a": NodeSpec("a", None, draining=True), "b": NodeSpec("b"), "c": NodeSpec("c"), "d": NodeSpec("d")},
          dict.fromkeys(("p0", "p1", "p2", "p3"))))  # its first plan places all and leaves b at 3, c at 1
def test_plans_reach_a_fixpoint_that_no_single_move_improves(cluster):
    """Repeated plans stop moving; at the fixpoint no pipeline could move to an eligible node with
    room and leave both nodes more even."""
    pipelines, nodes, current = cluster
    owners, _, _ = settle(pipelines, nodes, current)
    weights = {p: s.weight for p, s in pipelines.items()}
    loads = loads_of(owners, weights, nodes)
    for name, source in owners.items():
        if source is None:
            continue
        for target, spec in nodes.items():
            if target == source or not eligible(pipelines[name], spec):
                continue
            room = spec.capacity is None or loads[target] + weights[name] <= spec.capacity
            assert not (room and loads[source] - (loads[target] + weights[name]) > 0), (name, source, target, loads)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(0, 15))
def test_equal_weights_balance_within_one(node_count, pipeline_count):
    """Unpinned weight-1 pipelines end spread so that node counts differ by at most one."""
    nodes = {f"n{i}": NodeSpec(f"n{i}") for i in range(node_count)}
    pipelines = {f"p{i}": PipelineSpec(f"p{i}") for i in range(pipeline_count)}
    owners, _, _ = settle(pipelines, nodes, {p: "n0" for p in pipelines})
    counts = loads_of(owners, {}, nodes).values()
    assert max(counts) - min(counts) <= 1
    assert all(owners[p] is not None for p in pipelines)


def test_a_joining_node_takes_its_share_in_few_moves():
    """6 pipelines on 2 nodes (3 + 3); a third joins: exactly 2 moves give it 2, the rest stay."""
    pipelines = {f"p{i}": PipelineSpec(f"p{i}") for i in range(6)}
    two = {"a": NodeSpec("a"), "b": NodeSpec("b")}
    owners, _, _ = settle(pipelines, two, {})
    assert sorted(loads_of(owners, {}, two).values()) == [3, 3]
    three = {**two, "c": NodeSpec("c")}
    after, _, moves = settle(pipelines, three, owners)
    assert moves == 2
    assert loads_of(after, {}, three) == {"a": 2, "b": 2, "c": 2}
    assert sum(after[p] != owners[p] for p in pipelines) == 2


def test_a_lost_node_s_pipelines_are_placed_and_nothing_else_moves():
    """Node c goes: only its two pipelines get new owners, one on each survivor."""
    pipelines = {f"p{i}": PipelineSpec(f"p{i}") for i in range(6)}
    nodes = {n: NodeSpec(n) for n in "abc"}
    owners, _, _ = settle(pipelines, nodes, {})
    survivors = {"a": nodes["a"], "b": nodes["b"]}
    result = plan(pipelines, survivors, owners)
    lost = {p for p, n in owners.items() if n == "c"}
    assert set(result.placed) == lost and result.move is None
    assert loads_of(result.owners, {}, survivors) == {"a": 3, "b": 3}
    assert all(result.owners[p] == owners[p] for p in pipelines if p not in lost)


def test_weights_and_capacity():
    """A weight-4 pipeline counts as four; a node with capacity 2 never takes more than 2."""
    pipelines = {"big": PipelineSpec("big", weight=4), **{f"s{i}": PipelineSpec(f"s{i}") for i in range(4)}}
    nodes = {"a": NodeSpec("a"), "b": NodeSpec("b", capacity=2)}
    owners, _, _ = settle(pipelines, nodes, {})
    loads = loads_of(owners, {p: s.weight for p, s in pipelines.items()}, nodes)
    assert loads == {"a": 6, "b": 2}
    full = {"a": NodeSpec("a", capacity=1)}
    result = plan({"big": PipelineSpec("big", weight=4)}, full, {})
    assert result.owners == {"big": None}


def test_pinning_and_draining():
    """A pinned pipeline runs only on its nodes; a drained node gives up everything, one place at a time."""
    pipelines = {"p": PipelineSpec("p", nodes=frozenset({"b"})), "q": PipelineSpec("q"), "r": PipelineSpec("r")}
    nodes = {"a": NodeSpec("a"), "b": NodeSpec("b")}
    owners, _, _ = settle(pipelines, nodes, {})
    assert owners["p"] == "b"
    drained = {"a": NodeSpec("a"), "b": NodeSpec("b", draining=True)}
    result = plan(pipelines, drained, owners)
    assert result.owners["p"] is None  # pinned to a drained node: nowhere to run
    assert all(result.owners[x] == "a" for x in ("q", "r"))


def test_held_pipelines_are_not_moved_by_balance():
    """A pipeline an operator moved stays; balance evens out with the others."""
    pipelines = {f"p{i}": PipelineSpec(f"p{i}") for i in range(4)}
    nodes = {"a": NodeSpec("a"), "b": NodeSpec("b")}
    current = {"p0": "b", "p1": "b", "p2": "b", "p3": "a"}
    owners, _, _ = settle(pipelines, nodes, current, held={"p0"})
    assert owners["p0"] == "b"
    assert loads_of(owners, {}, nodes) == {"a": 2, "b": 2}


def test_standbys_spread_a_node_s_pipelines():
    """Each pipeline's standby is another eligible node; one node's pipelines stand by on different nodes."""
    pipelines = {f"p{i}": PipelineSpec(f"p{i}") for i in range(6)}
    nodes = {n: NodeSpec(n) for n in "abc"}
    owners, standbys, _ = settle(pipelines, nodes, {})
    for p, owner in owners.items():
        assert standbys[p] not in (None, owner)
    for owner in "abc":
        mine = [standbys[p] for p in pipelines if owners[p] == owner]
        assert len(set(mine)) == len(mine) == 2
    solo = plan({"p": PipelineSpec("p")}, {"a": NodeSpec("a")}, {})
    assert solo.standbys == {"p": None}
