"""The simulator's bill of workers held across a step's start (issue 30 item 8).

With a keep-alive longer than the gap between two steps' work, a worker is held from one step into the next: a
learner rank kept warm sits idle until the plan starts it late, a function's keep-alive lapses in the next step's
window, a decode function is evicted for a unit before it lapses. The meter bills all of it; the model must too.
End to end: both serverless designs at runtime.keep_alive_s=0.5 (10 modelled s at scale 0.05, near the step's 12 s),
on the small emulated size of tests/test_emulated.py (about 15 s an arm here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfless.config import load_run_config
from rlhfless.sim.modelled import _held

from test_emulated import SMALL

KEEP = ["runtime.keep_alive_s=0.5", "runtime.mode=serverless"]


def _rows(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_held_bills_a_kept_worker_from_the_step_start():
    """`_held` (pure): a worker invoked in the step is billed from the step's start to its first request; one not
    invoked to its carried lapse, or its release when evicted sooner, or the step's end when still held, and its
    lapse carries on; each to the role its idle bills to, times its units."""
    billed: dict[str, float] = {}
    alive = {"rank": ("learner", 1.0), "lapsing": ("learner", 1.0), "evicted": ("decode", 1.0),
             "held": ("decode", 2.0)}
    carry = {"lapsing": 3.0, "evicted": 5.0, "held": 15.0}
    nxt = _held(alive, {"rank": 4.0}, 12.0, carry, {"lapsing": 3.2, "evicted": 1.5}, {"evicted": 1.5}, billed)
    assert billed == pytest.approx({"learner": 4.0 + 3.0, "decode": 1.5 + 2.0 * 12.0})
    assert nxt == pytest.approx({"held": 3.0})


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    from rlhfless.run.launch import train

    out = tmp_path_factory.mktemp("emulated-keep")
    for design in ("extended", "paper"):
        cfg = load_run_config("experiments/configs/quickstart.yaml", SMALL + KEEP + [f"runtime.design={design}"])
        train(cfg, out / design, progress=False)
    return out


def _held_across_a_step_start(run: Path) -> int:
    """Workers spawned before a validated step's window and still held when it began (the case under test)."""
    n = 0
    for m in _rows(run / "metrics.jsonl"):
        if m.get("step", 0) > 1 and "runtime/window_start_s" in m:
            ws = m["runtime/window_start_s"]
            n += sum(1 for w in _rows(run / "workers.jsonl")
                     if w["spawned_s"] < ws and (w["released_s"] is None or w["released_s"] > ws))
    return n


@pytest.mark.parametrize("design", ["extended", "paper"])
def test_simulator_bills_workers_held_across_a_step_start(kept, design):
    """The bill within 10% and at most 5% of it unexplained by the named terms. Before the fix the model billed a
    kept worker only from its request in the step and dropped a keep-alive that lapsed in the next step's window:
    the extended arm's bill was 25% short (12 device-s a step unexplained), the paper arm's 9% short with 18%
    unexplained behind an eviction billed as a full keep-alive."""
    from rlhfless.sim.modelled import validate_emulated

    run = kept / design
    assert _held_across_a_step_start(run) > 0
    v = validate_emulated(run)
    cost = v["cost_device_s"]
    assert cost["rel_error"] < 0.10, cost
    assert abs(v["cost_terms_device_s"]["unexplained"]) < 0.05 * cost["measured"], v["cost_terms_device_s"]
    assert v["step_time_s"]["rel_error"] < 0.10 or v["control_plane_real_ms_per_step"] < 500
