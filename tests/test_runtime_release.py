"""Issue 30's accounting, pure: billing rule sets (one definition for meter, planner and simulator), busy / held-idle
/ cold device-seconds per role, the learner's share computed before the rollout ended, intervals with nothing
held, and the comparison's check of the whole final state."""

from __future__ import annotations

import json

import pytest

from rlhfless.core.errors import ConfigError
from rlhfless.plan import billing as B
from rlhfless.plan.cost import billed_seconds, price
from rlhfless.plan.records import Invocation
from rlhfless.run.compare import safetensors_digest, states_match
from rlhfless.runtime.config import RuntimeConfig
from rlhfless.runtime.meter import bill_run, bill_window, billing_rules, usage_window
from rlhfless.runtime.records import InvocationRecord, WorkerRecord, zero_held
from rlhfless.runtime.streaming import early_share

CPU = price("cpu-core")


def test_platform_presets_are_per_second_lifetimes_with_their_documented_idle_timeouts():
    assert B.PRESETS["runpod"] == B.BillingRules(1.0, 0.0, True, 5.0, "lifetime")  # Runpod "Pricing"
    assert B.PRESETS["modal"].keep_alive_s == 60.0 and B.PRESETS["modal"].billed == "lifetime"
    rt = RuntimeConfig(mode="serverless", billing="runpod")
    assert rt.billing_rules() is B.PRESETS["runpod"] and rt.idle_timeout_s() == 5.0
    assert billing_rules(rt) is B.PRESETS["runpod"]  # the meter reads the same object
    # the serverful control is billed its pool's lifetime whatever the serverless arm's rules
    assert RuntimeConfig(mode="serverful", billing="invocations").billing_rules().billed == "lifetime"


@pytest.mark.parametrize("over, field", [("keep_alive_s", "runtime.keep_alive_s"),
                                         ("billing_granularity_s", "runtime.billing_granularity_s")])
def test_a_preset_rejects_a_conflicting_setting_naming_the_field(over, field):
    with pytest.raises(ConfigError, match=field):
        RuntimeConfig(mode="serverless", billing="runpod", **{over: 3.0})
    with pytest.raises(ConfigError, match="runtime.billing"):
        RuntimeConfig(billing="aws")


def test_the_planner_prices_keep_alive_only_under_lifetime_billing():
    inv = Invocation("decode", 0, 0.0, 2.3)
    life, per_call = B.BillingRules(1.0, 0.0, True, 2.0, "lifetime"), B.BillingRules(1.0, 0.0, True, 2.0, "invocations")
    assert billed_seconds(inv, life) == 5.0 and billed_seconds(inv, per_call) == 3.0


def _worker():
    # started at 0, ready at 1 (cold start), decode 1..3, idle (keep-alive) 3..7, learner 7..8, released at 10
    w = WorkerRecord("decode+learner-0", ("decode", "learner"), 1.0, (0,), 0.0, ready_s=1.0, released_s=10.0)
    invs = [InvocationRecord(1, "decode", w.worker, 1.0, 0.0, 1.0, 3.0, cold=True),
            # a learner rank from 5: it waits for groups, computes 5.5..6 and 7..8
            InvocationRecord(1, "learner", w.worker, 1.0, 5.0, 5.0, 8.0, cold=False, busy=[[5.5, 6.0], [7.0, 8.0]])]
    return w, invs


def test_lifetime_bills_the_idle_and_invocations_do_not():
    w, invs = _worker()
    life = bill_run([w], invs, 10.0, CPU, False, B.BillingRules.metered(1.0, 2.0, "lifetime"))
    per_call = bill_run([w], invs, 10.0, CPU, False, B.BillingRules.metered(1.0, 2.0, "invocations"))
    assert life.device_s == 10.0
    assert per_call.device_s == 3.0 + 3.0  # decode 0..3 (its cold start included), learner 5..8
    assert per_call.by_kind == {"decode": 3.0, "learner": 3.0}
    step = bill_window([w], invs, 0.0, 6.0, 10.0, CPU, False, (), B.BillingRules.metered(1.0, 2.0, "invocations"))
    assert step.device_s == pytest.approx(3.0 + 1.0)


def test_a_learner_rank_waiting_for_groups_is_held_idle_not_busy():
    w, invs = _worker()
    u = usage_window([w], invs, 0.0, 10.0, 10.0)
    assert u["decode"] == pytest.approx({"cold": 1.0, "busy": 2.0, "idle": 2.0})  # 3..5: its keep-alive
    # learner from 5 to the release: 1.5 s computing, 3.5 s waiting for groups or idle after
    assert u["learner"] == pytest.approx({"cold": 0.0, "busy": 1.5, "idle": 3.5})
    assert sum(sum(d.values()) for d in u.values()) == pytest.approx(10.0)
    assert invs[1].busy_s == 1.5 and invs[1].busy_in(0.0, 6.0) == 0.5


def test_the_learner_share_before_the_rollout_ended_counts_compute_seconds():
    assert early_share([[[0.0, 1.0], [4.0, 6.0]], [[2.0, 3.0]]], rollout_end=5.0) == pytest.approx(3.0 / 4.0)
    assert early_share([[]], 5.0) == 0.0


def test_zero_held_intervals_are_the_gaps_in_every_lifetime():
    rows = [{"spawned_s": 0.0, "released_s": 2.0}, {"spawned_s": 1.0, "released_s": 3.0},
            {"spawned_s": 5.0, "released_s": None}, {"spawned_s": 8.0, "released_s": 8.5}]
    assert zero_held(rows, 0.0, 10.0) == [(3.0, 5.0)]
    assert zero_held(rows[:2] + rows[3:], 0.0, 10.0) == [(3.0, 8.0), (8.5, 10.0)]


def test_the_final_state_matches_only_when_every_file_does():
    a = {"model.safetensors": "x", "optimizer.safetensors": "y"}
    assert states_match({"serverful": a, "serverless": dict(a)})
    assert not states_match({"serverful": a, "serverless": {**a, "optimizer.safetensors": "z"}})
    assert not states_match({"serverful": a, "serverless": {"model.safetensors": "x"}})
    assert not states_match({"serverful": {}, "serverless": {}})


def _safetensors(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def test_a_state_file_is_compared_by_content_not_by_the_order_of_its_metadata(tmp_path):
    """Two identical critic states were written with their metadata maps in different orders (a per-process
    order): the same content digest. One ulp in one tensor: a different one."""
    import torch
    from safetensors.torch import load_file

    tensor = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    data = torch.tensor([1.0, 2.0]).numpy().tobytes()
    _safetensors(tmp_path / "a", {"__metadata__": {"updates": "10", "version": "1"}, **tensor}, data)
    _safetensors(tmp_path / "b", {**tensor, "__metadata__": {"version": "1", "updates": "10"}}, data)
    assert (tmp_path / "a").read_bytes() != (tmp_path / "b").read_bytes()
    assert safetensors_digest(tmp_path / "a") == safetensors_digest(tmp_path / "b")
    assert torch.equal(load_file(tmp_path / "a")["w"], torch.tensor([1.0, 2.0]))  # a real safetensors file
    ulp = torch.tensor([1.0, torch.nextafter(torch.tensor(2.0), torch.tensor(3.0)).item()]).numpy().tobytes()
    _safetensors(tmp_path / "c", {"__metadata__": {"updates": "10", "version": "1"}, **tensor}, ulp)
    assert safetensors_digest(tmp_path / "c") != safetensors_digest(tmp_path / "a")
