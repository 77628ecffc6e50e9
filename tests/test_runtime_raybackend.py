"""RayBackend's placement rule without Ray: a fake cluster answers `ray.nodes()`, nothing is started.

The rule (the paper's locality): learner ranks and pool workers on the driver's node with hard affinity (their
gloo group is loopback-only), the prefill function and the first decode function there with soft affinity, every
other function on the node holding the fewest of the run's units.
"""

from __future__ import annotations

from types import SimpleNamespace

from rlhfless.runtime.platform.raybackend import RayBackend, RayHandle


def _backend(nodes: list[str], home: str) -> RayBackend:
    b = RayBackend("auto", units=4)
    b.home = home
    b.ray = SimpleNamespace(nodes=lambda: [{"NodeID": n, "Alive": True, "Resources": {"CPU": 4.0}} for n in nodes]
                            + [{"NodeID": "gone", "Alive": False, "Resources": {"CPU": 4.0}},
                               {"NodeID": "no-cpu", "Alive": True, "Resources": {"memory": 1.0}}])
    return b


def _started(b: RayBackend, worker: str, kinds: tuple[str, ...], units: int = 1) -> RayHandle:
    node, home, _ = b._place(kinds)
    h = RayHandle(worker, None, object(), tuple(range(units)), kinds, 0.0, node, home)
    b.handles[worker] = h
    return h


def test_learner_and_pool_workers_are_pinned_to_the_drivers_node():
    b = _backend(["A", "B", "C"], home="B")
    for kinds in (("learner",), ("decode", "reward", "reference", "learner")):
        assert b._place(kinds) == ("B", True, False)  # hard: the data-parallel group rendezvouses on loopback
    assert b._place(("prefill",)) == ("B", True, True)


def test_one_decode_function_at_home_the_others_spread_by_load():
    b = _backend(["A", "B", "C"], home="A")
    first = _started(b, "decode-0", ("decode",))
    assert (first.target, first.home) == ("A", True)
    second = _started(b, "decode-1", ("decode",), units=2)
    third = _started(b, "decode-2", ("decode",))
    assert {second.target, third.target} == {"B", "C"} and not second.home and not third.home
    ref = _started(b, "reference-3", ("reference",))
    assert ref.target == "C"  # A and C hold 1 unit, B 2; a tie goes away from home (learner, heaviest decode)


def test_a_dead_home_decode_lets_the_next_one_take_home_and_dead_nodes_are_never_chosen():
    b = _backend(["A", "B"], home="A")
    first = _started(b, "decode-0", ("decode",))
    first.dead = True
    again = _started(b, "decode-1", ("decode",))
    assert (again.target, again.home) == ("A", True)
    for i in range(5):
        assert _started(b, f"reference-{i}", ("reference",)).target in ("A", "B")
