"""Hybrid functions pay for joining the data-parallel learner: communicator, optimizer state, reference model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlhfless.core.errors import ConfigError
from rlhfless.plan.overlap import LearnerCosts
from rlhfless.sim.policies import RLHFless, Switches
from rlhfless.sim.scenario import SimConfig, case_configs, clusters, hybrid_join_s, workload


def _case():
    cfg = case_configs("quick", 2, [])[0]
    work, _ = workload(cfg)
    return cfg, work


def test_each_part_of_a_hybrid_join_is_a_switch_with_its_own_cost():
    cfg, work = _case()
    pm = clusters(cfg, work)[1].perf
    full = hybrid_join_s(cfg, pm)
    parts = {"comm": cfg.hybrid_comm_init_s, "optim": pm.optimizer_move_s(cfg.n_devices),
             "ref": pm.weight_sync_s(colocated=False)}
    assert all(v > 0 for v in parts.values()) and full == pytest.approx(sum(parts.values()))
    assert hybrid_join_s(replace(cfg, hybrid_comm_init_s=0.0), pm) == pytest.approx(full - parts["comm"])
    assert hybrid_join_s(replace(cfg, hybrid_optimizer_move=False), pm) == pytest.approx(full - parts["optim"])
    assert hybrid_join_s(replace(cfg, hybrid_ref_load=False), pm) == pytest.approx(full - parts["ref"])
    off = replace(cfg, hybrid_comm_init_s=0.0, hybrid_optimizer_move=False, hybrid_ref_load=False)
    assert hybrid_join_s(off, pm) == 0.0
    # PPO moves the critic's state and weights too
    assert hybrid_join_s(replace(cfg, algo="ppo", group_size=1), pm) == pytest.approx(
        parts["comm"] + 2 * parts["optim"] + 2 * parts["ref"])


def test_optimizer_state_share_is_twelve_bytes_per_parameter_over_the_learners_nics():
    cfg, work = _case()
    pm = clusters(cfg, work)[1].perf
    nic = (pm.device.nic_bw or pm.device.net_bw / pm.device.devices_per_node) * pm.net_eff
    assert pm.optimizer_move_s(8) == pytest.approx(12 * pm.model.params / (8 * nic))
    assert pm.optimizer_move_s(16) == pytest.approx(pm.optimizer_move_s(8) / 2)


def test_the_scaler_and_the_simulator_charge_a_released_decode_function_the_join():
    cfg, work = _case()
    cs = clusters(cfg, work)[1]
    pol = RLHFless(cs, Switches(), cfg.lam, cfg.tau, cfg.prefill_actors)
    costs: LearnerCosts = pol._learner_costs(work[0], None)
    assert costs.release_cold_s == pytest.approx(cs.perf.weight_sync_s(colocated=True) + cs.hybrid_join_s)
    assert cs.hybrid_join_s == pytest.approx(hybrid_join_s(cfg, cs.perf)) and cs.hybrid_join_s > 0
    free = RLHFless(replace(cs, hybrid_join_s=0.0), Switches(), cfg.lam, cfg.tau, cfg.prefill_actors)
    assert free._learner_costs(work[0], None).release_cold_s == pytest.approx(cs.perf.weight_sync_s(colocated=True))


def test_bad_values_name_the_field():
    with pytest.raises(ConfigError, match="hybrid_comm_init_s"):
        SimConfig(hybrid_comm_init_s=-1.0)
    with pytest.raises(ConfigError, match="hybrid_ref_load"):
        SimConfig(hybrid_ref_load="yes")
