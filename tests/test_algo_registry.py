"""Algorithm variants registered by name (`rlhfless.algo.registry`): each registered function against a hand
computation, the config's names checked against the registry, and a variant that really changes the update."""

from __future__ import annotations

import pytest
import torch

from rlhfless.algo import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, GRPOConfig, group_advantages
from rlhfless.algo.ppo import ppo_advantages
from rlhfless.algo.registry import advantage_estimator, policy_loss, register_advantage
from rlhfless.config import load_run_config
from rlhfless.core.errors import ConfigError


def test_every_shipped_variant_is_registered():
    assert {"grpo", "rloo", "gae"} <= set(ADVANTAGE_ESTIMATORS) and {"clip", "dual_clip"} <= set(POLICY_LOSSES)
    assert ADVANTAGE_ESTIMATORS["gae"].needs_critic and not ADVANTAGE_ESTIMATORS["rloo"].needs_critic


def test_the_torch_free_names_are_the_registries():
    """Issue 42: the config checks and `config show` read `algo.variants` (no torch); the torch functions
    register against it. One source of truth: every declared name has its function, and no function more."""
    from rlhfless.algo.variants import ESTIMATOR_NAMES, POLICY_LOSS_NAMES

    assert set(ESTIMATOR_NAMES) == set(ADVANTAGE_ESTIMATORS) and set(POLICY_LOSS_NAMES) == set(POLICY_LOSSES)
    assert {k: v.needs_critic for k, v in ESTIMATOR_NAMES.items()} == {
        k: e.needs_critic for k, e in ADVANTAGE_ESTIMATORS.items()}
    assert all(v.doc for v in (*ESTIMATOR_NAMES.values(), *POLICY_LOSS_NAMES.values()))


def test_an_undeclared_name_cannot_register():
    """A function registered under a name the config would refuse is refused at import, naming the list."""
    with pytest.raises(ValueError, match="not declared: add it to rlhfless.algo.variants.ESTIMATOR_NAMES"):
        register_advantage("zz_undeclared")(lambda *a: None)
    assert "zz_undeclared" not in ADVANTAGE_ESTIMATORS


def test_rloo_is_reward_minus_the_mean_of_the_other_responses():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    groups, metrics = advantage_estimator("rloo").fn(rewards, 4, GRPOConfig())
    # group 0: 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (1 + 0 + 1) / 3 = -2/3; group 1 has no spread: exactly 0
    want = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0])
    assert torch.allclose(groups.advantages, want, atol=1e-7)
    assert groups.zero_variance.tolist() == [False, True]
    assert metrics["actor/advantages/abs_mean"] == pytest.approx(float(want.abs().mean()))


def test_grpo_and_gae_are_the_functions_they_name():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    cfg = GRPOConfig(scale_adv_by_std=False)
    assert torch.equal(advantage_estimator("grpo").fn(r, 4, cfg)[0].advantages,
                       group_advantages(r, 4, False, cfg.adv_eps)[0].advantages)
    tok_r, values, mask = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2, dtype=torch.bool)
    ppo = GRPOConfig(name="ppo", gamma=0.9, lam=0.8, whiten_advantages=False)
    adv, ret, _ = advantage_estimator("gae").fn(tok_r, values, mask, ppo)
    # by hand: delta_1 = 1 - 0.25; delta_0 = 0 + 0.9 * 0.25 - 0.5; A_0 = delta_0 + 0.9 * 0.8 * A_1
    assert torch.allclose(adv, torch.tensor([[-0.275 + 0.72 * 0.75, 0.75]]))
    assert torch.equal(ret, ppo_advantages(tok_r, values, mask, 0.9, 0.8, False)[1])


def test_dual_clip_caps_the_loss_of_negative_advantage_tokens():
    # ratios 5, 2 and 0.5 (logp - old_logp = log r); advantages -1, -1, +1
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[5.0, 2.0, 0.5]]))
    adv, mask = torch.tensor([[-1.0, -1.0, 1.0]]), torch.ones(1, 3, dtype=torch.bool)
    cfg = GRPOConfig(clip_ratio_c=3.0)
    clip, _ = policy_loss("clip")(logp, old, adv, mask, cfg)
    dual, m = policy_loss("dual_clip")(logp, old, adv, mask, cfg)
    # clip: max(-A r, -A clip(r, 0.8, 1.2)) = 5, 2, -0.5; dual caps the first at -A * c = 3
    assert torch.allclose(clip, torch.tensor([[5.0, 2.0, -0.5]]))
    assert torch.allclose(dual, torch.tensor([[3.0, 2.0, -0.5]]))
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)


def test_a_config_names_only_registered_variants_that_fit_its_algorithm():
    base = "experiments/configs/quickstart.yaml"
    assert load_run_config(base, ["algo.adv_estimator=rloo"]).algo.estimator == "rloo"
    assert load_run_config(base, []).algo.estimator == "grpo"
    for bad, field in ((["algo.adv_estimator=nope"], "algo.adv_estimator"), (["algo.adv_estimator=gae"],
                       "algo.adv_estimator"), (["algo.policy_loss=nope"], "algo.policy_loss"),
                       (["algo.clip_ratio_c=1"], "algo.clip_ratio_c")):
        with pytest.raises(ConfigError, match=field):
            load_run_config(base, bad)


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="twice"):
        register_advantage("grpo")(lambda *a: None)


def test_rloo_changes_the_update_and_grpo_is_the_default(tmp_path):
    """Two inline steps from the same seed: rloo's weights differ from grpo's (the registry is what the learner
    calls), and naming grpo explicitly is bitwise the default."""
    from safetensors.torch import load_file

    from rlhfless.run.launch import train

    tiny = ["train.steps=2", "rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=32",
            "train.eval_prompts=0", "tracking.mode=disabled", "task.arith.k_max=4", "train.table_every=0"]
    weights = {}
    for name, extra in (("default", []), ("grpo", ["algo.adv_estimator=grpo"]), ("rloo", ["algo.adv_estimator=rloo"])):
        train(load_run_config("experiments/configs/quickstart.yaml", tiny + extra), tmp_path / name, progress=False)
        weights[name] = load_file(str(tmp_path / name / "checkpoints" / "final" / "model.safetensors"))
    assert all(torch.equal(weights["default"][k], weights["grpo"][k]) for k in weights["default"])
    assert any(not torch.equal(weights["default"][k], weights["rloo"][k]) for k in weights["default"])
