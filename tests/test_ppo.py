"""PPO with a critic: where values are read, that the critic and the policy learn from a fixed batch, that a
run's checkpoint carries the critic and its optimizer through --resume, and the config's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfless.core import metrics as M
from rlhfless.config import load_run_config
from rlhfless.learn.config import CriticConfig, OptimConfig
from rlhfless.learn.critic import STATE_FILE, load_critic, load_critic_state, response_values, save_critic_state
from rlhfless.core.errors import ConfigError, DataError
from rlhfless.learn.learner import Learner
from rlhfless.algo.config import GRPOConfig
from rlhfless.model.factory import load_policy
from rlhfless.learn.ppo_update import ppo_update
from rlhfless.rollout.forward import response_logprobs
from rlhfless.run.launch import train

PROMPTS = [[3, 10, 11, 12], [3, 20, 21], [3, 30, 31, 32, 33]]
RESPONSES = [[40, 41, 42, 1], [50, 51, 1], [60, 61, 62, 63, 64, 1]]
REWARDS = torch.tensor([1.0, 0.0, 1.0])


def test_the_value_of_token_t_sees_only_the_prompt_and_tokens_before_t(tiny_checkpoint):
    critic = load_critic(CriticConfig(), tiny_checkpoint)
    torch.nn.init.normal_(critic.model.head.weight)  # a zero head would make every value 0
    v = critic.values(PROMPTS, RESPONSES, 1)
    assert v.shape == (3, 6) and (v[1, 3:] == 0).all()  # [N, T], 0 past each response
    changed = [list(r) for r in RESPONSES]
    changed[2][3] = 70  # token 3 of row 2
    w = critic.values(PROMPTS, changed, 1)
    torch.testing.assert_close(w[2, :4], v[2, :4])  # V(s_t) for t <= 3 never sees token 3
    assert not torch.allclose(w[2, 4:], v[2, 4:])
    alone = response_values(critic.model, [PROMPTS[2]], [RESPONSES[2]], 1)  # no padding from the other rows
    torch.testing.assert_close(alone[0], v[2], rtol=1e-4, atol=1e-5)


def _ppo_pair(checkpoint: Path, **algo):
    cfg = GRPOConfig(name="ppo", **algo)
    learner = Learner(load_policy(checkpoint), OptimConfig(lr=1e-3), cfg)
    return learner, load_critic(CriticConfig(lr=1e-2), checkpoint)


def test_the_critic_learns_the_returns_of_a_fixed_batch(tiny_checkpoint):
    """Explained variance starts at 0 (zero head) and rises, the value loss falls: both need critic steps."""
    torch.manual_seed(0)
    learner, critic = _ppo_pair(tiny_checkpoint)
    head0 = critic.model.head.weight.detach().clone()
    history = []
    for _ in range(15):
        values = critic.values(PROMPTS, RESPONSES, 1)
        history.append(ppo_update(learner, critic, PROMPTS, RESPONSES, REWARDS, values))
    assert history[0][M.VF_EXPLAINED_VAR] == 0.0
    assert history[-1][M.VF_EXPLAINED_VAR] > 0.5
    assert history[-1][M.VF_LOSS] < 0.5 * history[0][M.VF_LOSS]
    assert not torch.equal(critic.model.head.weight, head0) and critic.updates == 15
    assert {M.VF_CLIPFRAC, M.VPRED_MEAN, M.CRITIC_GRAD_NORM, M.VF_EXPLAINED_VAR} <= set(history[-1])


@pytest.mark.parametrize("whiten", [True, False])
def test_ppo_raises_the_likelihood_of_rewarded_responses(tiny_checkpoint, whiten):
    """Whitened from a zero critic, the rewarded rows' advantages are positive and the other's negative. Unwhitened,
    A_t = R - V(s_t) is positive on rewarded rows and about 0 on the other (the critic starts at 0), so only the
    ranking is certain (shared weights move every row)."""
    torch.manual_seed(0)
    learner, critic = _ppo_pair(tiny_checkpoint, ppo_epochs=2, ppo_mini_batches=2, whiten_advantages=whiten)

    def logp():
        with torch.no_grad():
            return response_logprobs(learner.model, PROMPTS, RESPONSES, 1).logp.sum(dim=1)

    before = logp()
    for _ in range(1 if whiten else 4):
        ppo_update(learner, critic, PROMPTS, RESPONSES, REWARDS, critic.values(PROMPTS, RESPONSES, 1))
    gain = logp() - before
    assert min(gain[0], gain[2]) > gain[1] + 0.5  # rewards 1, 0, 1
    if whiten:
        assert gain[0] > 0 and gain[2] > 0 and gain[1] < 0


def test_critic_state_round_trips_and_refuses_a_foreign_file(tiny_checkpoint, tmp_path):
    torch.manual_seed(0)
    learner, critic = _ppo_pair(tiny_checkpoint)
    ppo_update(learner, critic, PROMPTS, RESPONSES, REWARDS, critic.values(PROMPTS, RESPONSES, 1))
    path = save_critic_state(critic, tmp_path / STATE_FILE)
    fresh = load_critic(CriticConfig(lr=1e-2), tiny_checkpoint)
    load_critic_state(fresh, path)
    for a, b in zip(critic.model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh.updates == 1 and fresh.opt.state_dict()["state"][0]["exp_avg"].equal(
        critic.opt.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(DataError, match="missing"):
        load_critic_state(fresh, tmp_path / "nothing.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(DataError, match="bad.safetensors"):
        load_critic_state(fresh, tmp_path / "bad.safetensors")


RUN = ["algo.name=ppo", "algo.group_size=2", "algo.ppo_mini_batches=2", "task.arith.num_train=48",
       "rollout.prompts_per_step=4", "rollout.max_new_tokens=48", "train.checkpoint_every=2", "train.eval_prompts=4",
       "train.threads=1", "tracking.mode=disabled", "predictor.name=ewma"]


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]


def test_resume_carries_the_critic_and_its_optimizer(sft_checkpoint, tmp_path):
    """4 steps straight equal 2 steps + --resume to 4: metrics (critic values, losses) and every tensor of the
    final critic and policy. A resume that rebuilt the critic from the SFT trunk would differ at step 3."""
    cfg = lambda steps: load_run_config(None, RUN + [f"policy.checkpoint={sft_checkpoint}", f"train.steps={steps}"])
    whole, run = tmp_path / "whole", tmp_path / "run"
    train(cfg(4), whole, progress=False)
    train(cfg(2), run, progress=False)
    half = load_file(run / "checkpoints" / "last" / STATE_FILE)
    train(cfg(4), run, progress=False, resume=True)
    assert _metrics(whole) == _metrics(run)
    assert any(M.VF_LOSS in r for r in _metrics(run))
    a, b = (load_file(d / "checkpoints" / "last" / STATE_FILE) for d in (whole, run))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith("optim/") for k in a) and not torch.equal(a["model/head.weight"], half["model/head.weight"])
    wa, wb = (load_file(d / "checkpoints" / "final" / "model.safetensors") for d in (whole, run))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_critic_checkpoint_that_is_missing_or_has_another_vocabulary_is_refused(tiny_checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="critic.checkpoint: no folder"):
        load_critic(CriticConfig(checkpoint=str(tmp_path / "nope")), tiny_checkpoint)
    with pytest.raises(ConfigError, match="critic.checkpoint: .* vocabulary"):
        load_critic(CriticConfig(checkpoint=str(tiny_checkpoint)), tiny_checkpoint, vocab_size=1000)
    assert load_critic(CriticConfig(checkpoint=str(tiny_checkpoint)), tiny_checkpoint, vocab_size=259).updates == 0


@pytest.mark.parametrize("override,field", [
    ("runtime.mode=serverless runtime.overlap=true", "runtime.overlap"),
    ("critic.lr=0", "critic.lr"), ("train.eval_samples=0", "train.eval_samples"),
    ("train.device=cuda", "train.device"), ("runtime.mode=serverless runtime.device=cuda", "runtime.device"),
])
def test_ppo_config_refusals_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_run_config(None, ["algo.name=ppo", *override.split()])


def test_the_runtime_modes_take_ppo_and_serverless_needs_two_units():
    for mode in ("serverless", "serverful", "compare"):
        assert load_run_config(None, ["algo.name=ppo", f"runtime.mode={mode}"]).runtime.mode == mode
    with pytest.raises(ConfigError, match=r"runtime\.units: PPO's actor and critic"):
        load_run_config(None, ["algo.name=ppo", "runtime.mode=serverless", "runtime.units=1",
                         "plan.max_actors=1"]).check_machine()
    load_run_config(None, ["algo.name=ppo", "runtime.mode=serverful", "runtime.units=1"]).check_machine()
    # the serverful pool's PPO ranks are one worker or all of them (its one data-parallel group)
    with pytest.raises(ConfigError, match=r"runtime\.learner_units: PPO in the serverful pool"):
        load_run_config(None, ["algo.name=ppo", "runtime.mode=compare", "runtime.units=2",
                               "runtime.serverful_workers=1", "runtime.learner_units=2"]).check_machine()
    load_run_config(None, ["algo.name=ppo", "runtime.mode=compare", "runtime.units=2",
                           "runtime.learner_units=2"]).check_machine()


def test_quickstart_ppo_config_loads():
    cfg = load_run_config(Path(__file__).resolve().parents[1] / "experiments/configs/quickstart_ppo.yaml")
    assert cfg.algo.name == "ppo" and cfg.algo.group_size == 1 and cfg.train.eval_samples == 8


def test_the_simulators_validation_counts_every_ppo_sequence_as_trained():
    """PPO keeps skip_zero_variance_groups' default (true) in its config, but trains every sequence: with G = 1
    every 'group' has one reward, and counting them as skipped made a PPO run's update look free."""
    from rlhfless.sim.validate import skips_groups

    assert skips_groups({"algo": {"name": "grpo", "skip_zero_variance_groups": True}})
    assert skips_groups({"algo": {"skip_zero_variance_groups": True}})  # runs recorded before algo.name
    assert not skips_groups({"algo": {"name": "ppo", "skip_zero_variance_groups": True}})


def test_ppo_with_a_device_that_resolves_to_a_gpu_is_refused_before_any_work(monkeypatch):
    import rlhfless.core.devices as D

    cfg = load_run_config(None, ["algo.name=ppo", "train.device=auto"])
    cfg.check_machine()  # this machine: auto is the CPU
    monkeypatch.setattr(D, "cuda_visible", lambda: 1)
    with pytest.raises(ConfigError, match=r"train\.device: auto resolves to a GPU here"):
        cfg.check_machine()
