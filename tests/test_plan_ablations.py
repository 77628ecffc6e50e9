"""Every ablation switch of docs/configuration.md changes what it claims and nothing else.

Planner switches (`plan.policy`, `plan.migrate`, `plan.scale`, `predictor.name`, `train.plan`) change only the
logged plan: on this machine the rollout runs as one engine batch whatever the plan says, so one real step with
the switch must produce the same tokens, and a different decision. Rollout switches (`rollout.dedup_prefill`,
`rollout.reuse_prefix_forward`) change the work done: tokens the model computes, counted at the model's input.
Each test goes through the dotted config key, so it fails if the switch were ignored.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlhfless.core import metrics as M
from rlhfless.config import load_run_config
from rlhfless.learn.learner import Learner
from rlhfless.step.loop import Stages, run_step
from rlhfless.model.factory import load_checkpoint
from rlhfless.model.tokenizer import ByteTokenizer
from rlhfless.step.planner import Planner
from rlhfless.predictor.data import Observation
from rlhfless.core.records import Prompt, PromptGroup

G = 4
BASE = ["rollout.prompts_per_step=8", f"algo.group_size={G}", "rollout.max_new_tokens=72", "plan.max_actors=4",
        "plan.capacity=16", "tracking.mode=disabled"]
# per-prompt response lengths seen in an earlier epoch: heavy-tailed, so length-aware choices matter
HISTORY = [(4, 4, 5, 4), (60, 64, 58, 70), (9, 8, 9, 10), (120, 100, 130, 110), (6, 6, 7, 6), (30, 28, 33, 31),
           (12, 12, 11, 12), (7, 7, 7, 8)]


def _groups() -> list[PromptGroup]:
    tok = ByteTokenizer()
    # 8 terms: the SFT checkpoint is right on some samples and wrong on others, so the update has signal
    terms = [[i % 10, (i + 1) % 10, 2 * i % 10, 3, 5, 7, (9 * i) % 10, 1] for i in range(len(HISTORY))]
    prompts = [Prompt(f"p{i}", "+".join(map(str, t)) + "=", str(sum(t))) for i, t in enumerate(terms)]
    return [PromptGroup(p, tok.encode(p.text, bos=True), G) for p in prompts]


def _decide(*overrides: str):
    """The planner's decision for this step after one epoch of length history, built from the run config."""
    cfg = load_run_config(None, BASE + list(overrides))
    planner = Planner(cfg.predictor, cfg.plan)
    groups = _groups()
    planner.predictor.update([Observation(g.prompt.prompt_id, g.prompt.text, h, 0, 1)
                              for g, h in zip(groups, HISTORY)])
    sp, metrics = planner.plan_step(groups)
    return sp, metrics


def _placement(sp) -> list[list[str]]:
    return [[j.group_id for j in js] for js in sp.decision.plan.actor_jobs]


def test_policy_round_robin_changes_the_assignment():
    base, _ = _decide()
    rr, _ = _decide("plan.policy=round_robin")
    assert base.decision.plan.policy == "contiguous" and rr.decision.plan.policy == "round_robin"
    assert _placement(rr) != _placement(base)
    n = rr.decision.n_actors  # round-robin: group i on actor i mod N, in arrival order
    assert _placement(rr) == [[f"p{i}" for i in range(a, len(HISTORY), n)] for a in range(n)]


def test_migrate_false_drops_the_cuts_from_the_decision():
    # 4 actors billed per 10 ms: cutting the actors of short groups at tau saves billed seconds without
    # delaying the step, so the time model says the cuts pay
    cfg = ("plan.scale=false", "plan.billing.granularity_s=0.01")
    on, m_on = _decide(*cfg)
    off, m_off = _decide(*cfg, "plan.migrate=false")
    assert on.decision.migration is not None and m_on[M.BAL_MIGRATE_USED] == 1.0 and m_on[M.BAL_MIGRATIONS] > 0
    assert off.decision.migration is None and m_off[M.BAL_MIGRATIONS] == 0 and M.BAL_MIGRATE_USED not in m_off
    assert on.decision.plan == off.decision.plan  # the same placement, with and without its cuts
    assert m_on[M.SCALER_GPU_S] < m_off[M.SCALER_GPU_S] and m_on[M.BAL_IDLE_DEVICE_S] != m_off[M.BAL_IDLE_DEVICE_S]


def test_scale_false_always_uses_max_actors():
    scaled, _ = _decide()
    fixed, m = _decide("plan.scale=false")
    assert [c.n_actors for c in fixed.decision.candidates] == [4] and m[M.SCALER_NUM_ACTORS] == 4.0
    assert [c.n_actors for c in scaled.decision.candidates] == [1, 2, 3, 4] and scaled.decision.n_actors != 4


def test_global_mean_predictor_predicts_one_length_for_every_prompt():
    ewma, _ = _decide()
    flat, _ = _decide("predictor.name=global_mean")
    assert len({j.predicted_len for j in flat.jobs}) == 1
    assert len({j.predicted_len for j in ewma.jobs}) == len(HISTORY)
    assert _placement(flat) != _placement(ewma)


# ---------------------------------------------------------------------------------- one real step per switch


def _step(ckpt, *overrides: str, count: str | None = None):
    """One GRPO step of the shipped SFT policy (some groups have mixed rewards, so the update runs) from the
    same weights and seed; optionally counts the tokens the model receives in the stage `count` ("rollout" or
    "learn") through a forward pre-hook. Returns (report, tokens counted, updated weights)."""
    cfg = load_run_config(None, BASE + [f"policy.checkpoint={ckpt}", *overrides])
    torch.manual_seed(0)
    model = load_checkpoint(ckpt)
    learner = Learner(copy.deepcopy(model), cfg.optim, cfg.algo, reuse_prefix=cfg.rollout.reuse_prefix_forward)
    planner = Planner(cfg.predictor, cfg.plan) if cfg.train.plan else None
    stages = Stages(cfg, learner, None, planner)
    seen = []
    if count:
        stage = getattr(stages, count)

        def counted(*a, **kw):
            hook = learner.model.register_forward_pre_hook(
                lambda _m, args, kwargs: seen.append(int(kwargs["input_ids"].numel())), with_kwargs=True)
            try:
                return stage(*a, **kw)
            finally:
                hook.remove()

        setattr(stages, count, counted)
    report = run_step(stages, _groups(), step=1, epoch=0, seed=0)
    return report, sum(seen), learner.model.state_dict()


def _same_weights(a, b) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)


@pytest.fixture(scope="module")
def baseline(sft_checkpoint):
    return _step(sft_checkpoint)


@pytest.mark.parametrize("switch, changed", [
    ("plan.policy=round_robin", "assignment"),
    ("plan.migrate=false", "migrate metrics"),
    ("plan.scale=false", "actors"),
    ("predictor.name=global_mean", "predictions"),
    ("train.plan=false", "no plan"),
])
def test_planner_switches_change_only_the_logged_plan(sft_checkpoint, baseline, switch, changed):
    report, _, weights = _step(sft_checkpoint, switch)
    base, _, base_weights = baseline
    assert M.PG_LOSS in base.metrics  # the update ran
    assert report.rollout.responses == base.rollout.responses  # the work done: the same tokens ...
    assert [s.reward for s in report.samples] == [s.reward for s in base.samples]
    assert _same_weights(weights, base_weights)  # ... and the same update
    baseline = base
    plan_keys = {k for k in baseline.metrics if k.split("/")[0] in ("scaler", "balancer", "plan", "predictor")}
    if switch == "train.plan=false":
        assert report.plan is None and not plan_keys & report.metrics.keys()
        return
    differs = {k for k in plan_keys if report.metrics.get(k) != baseline.metrics[k]}
    assert differs, f"{switch} changed no logged plan metric ({changed})"


def test_dedup_prefill_false_computes_every_row_and_the_same_tokens(sft_checkpoint):
    dedup, n_dedup, _ = _step(sft_checkpoint, count="rollout")
    naive, n_naive, _ = _step(sft_checkpoint, "rollout.dedup_prefill=false", count="rollout")
    assert naive.rollout.responses == dedup.rollout.responses
    pd, pn = dedup.rollout.prefill, naive.rollout.prefill
    assert pn.tokens_computed == pn.tokens_naive and pd.tokens_computed * G == pn.tokens_computed
    assert n_naive - n_dedup >= pn.tokens_computed - pd.tokens_computed  # counted at the model's input
    assert naive.metrics[M.PREFILL_DEDUP_RATIO] == 1.0 and dedup.metrics[M.PREFILL_DEDUP_RATIO] == float(G)


def test_reuse_prefix_forward_false_runs_each_prompt_g_times_in_the_update(sft_checkpoint):
    reuse, n_reuse, _ = _step(sft_checkpoint, count="learn")
    full, n_full, _ = _step(sft_checkpoint, "rollout.reuse_prefix_forward=false", count="learn")
    assert full.rollout.responses == reuse.rollout.responses and M.PG_LOSS in reuse.metrics
    # the update keeps groups with mixed rewards; their prompts (left-padded to one width) run once per group
    # instead of once per sample, and nothing else changes
    groups, rewards = _groups(), [s.reward for s in reuse.samples]
    kept = [g for i, g in enumerate(groups) if len(set(rewards[i * G:(i + 1) * G])) > 1]
    assert kept and n_full - n_reuse == (G - 1) * len(kept) * max(len(g.token_ids) for g in kept)
    # the same loss and gradient up to float rounding (AdamW's first step amplifies rounding, so the weights
    # are not compared here)
    for key in (M.PG_LOSS, M.GRAD_NORM):
        assert full.metrics[key] == pytest.approx(reuse.metrics[key], rel=1e-4, abs=1e-6)
