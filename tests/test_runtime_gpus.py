"""GPU units of the runtime (runtime.device=cuda), tested without a GPU: the slot layout, the pool's free list
over it (never two functions on one GPU unless functions_per_gpu asks; releases and deaths give GPUs back), and
the worker binding its GPUs through the environment before anything touches CUDA."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.core.errors import ConfigError
from rlhfless.runtime.devices.gpus import ENV, MEMORY_FRACTION, GpuLayout, parse_visible, visible_gpus
from rlhfless.runtime.platform.pool import claim_units, free_units
from rlhfless.runtime.devices.worker import bind_device


@pytest.mark.parametrize("value, gpus", [
    ("0,1", ["0", "1"]), (" 2, 5 ", ["2", "5"]), ("", []), ("-1", []), ("1,-1,2", ["1"]),
    ("GPU-8f2a,GPU-77c1", ["GPU-8f2a", "GPU-77c1"]),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, gpus):
    assert parse_visible(value) == gpus
    assert visible_gpus({ENV: value}) == gpus


def test_a_layout_refuses_no_gpus_and_a_gpu_named_twice():
    with pytest.raises(ConfigError, match="no GPU"):
        GpuLayout(())
    with pytest.raises(ConfigError, match="twice"):
        GpuLayout(("0", "0"))


def test_slots_interleave_and_a_worker_sees_only_its_gpus():
    lay = GpuLayout(("3", "5"), per_gpu=2)
    assert lay.slots == 4 and [lay.gpu_of(u) for u in range(4)] == ["3", "5", "3", "5"]
    assert lay.worker_env((1,)) == {ENV: "5", MEMORY_FRACTION: "0.5"}
    assert lay.worker_env((0, 2)) == {ENV: "3", MEMORY_FRACTION: "0.5"}  # two slots of one GPU: listed once
    assert GpuLayout(("0", "1")).worker_env((0, 1))[ENV] == "0,1"
    with pytest.raises(ValueError):
        lay.gpu_of(4)


OPS = st.lists(st.tuples(st.sampled_from(["start", "release", "die"]), st.integers(1, 2), st.integers(0, 99)),
               max_size=40)


@settings(max_examples=300, deadline=None)
@given(n_gpus=st.integers(1, 4), per_gpu=st.integers(1, 3), ops=OPS)
def test_the_free_list_never_overbooks_a_gpu_and_gets_every_gpu_back(n_gpus, per_gpu, ops):
    lay = GpuLayout(tuple(str(i) for i in range(n_gpus)), per_gpu)
    live: dict[int, tuple[int, ...]] = {}  # worker -> its units, as the pool's handles hold them
    for k, (op, n, pick) in enumerate(ops):
        free = free_units(lay.slots, list(live.values()))
        if op == "start":
            got = claim_units(free, n)
            assert (got is None) == (len(free) < n)  # refused only when too few are free: never shared instead
            if got is not None:
                live[k] = got
        elif live:  # a release and a death both end the worker; either way its units come back
            del live[sorted(live)[pick % len(live)]]
        held = [u for units in live.values() for u in units]
        assert len(held) == len(set(held)), "a unit handed out twice"
        per = {}
        for w, units in live.items():
            for g in lay.worker_env(units)[ENV].split(","):
                per.setdefault(g, set()).add(w)
        assert all(len(ws) <= per_gpu for ws in per.values()), f"a GPU over its {per_gpu} functions: {per}"
    live.clear()
    assert free_units(lay.slots, list(live.values())) == list(range(lay.slots))


def test_from_an_empty_pool_functions_spread_over_the_gpus_first():
    lay = GpuLayout(("0", "1", "2"), per_gpu=2)
    live = []
    for _ in range(3):
        live.append(claim_units(free_units(lay.slots, live), 1))
    assert sorted(lay.worker_env(u)[ENV] for u in live) == ["0", "1", "2"]


def test_a_cuda_worker_binds_its_gpu_through_the_environment_before_cuda(monkeypatch):
    monkeypatch.setenv(ENV, "4,6")  # what the driver sees; the worker narrows it
    monkeypatch.delenv(MEMORY_FRACTION, raising=False)  # restored after the test, like ENV
    affinity = os.sched_getaffinity(0)
    setup = {"gpu_layout": GpuLayout(("4", "6"), 2).to_json(), "cores": [3]}
    assert bind_device(setup) == "cuda:0"
    assert os.environ[ENV] == "6" and os.environ[MEMORY_FRACTION] == "0.5"
    assert os.sched_getaffinity(0) == affinity  # GPU slot ids are not cores: nothing pinned


def test_a_cpu_worker_is_bound_as_before():
    assert bind_device({"cores": [0], "pin": False}) == "cpu"
