"""`rlhfless simulate --validate` on PPO runs: the values stage (the critic's forward) and PPO's update (actor +
critic, its epochs and mini-batches as features) fitted on alternate steps and validated on the others, the `ppo`
section (the simulator's PPO structure beside the run's measured ratios), and the refusals naming the field. A
tiny real PPO run (module fixture) and run dirs written here from a known machine."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlhfless.cli import main
from rlhfless.core.errors import DataError
from rlhfless.core.records import TraceRow
from rlhfless.sim.perf import PPO_MODELS
from rlhfless.sim.validate import (
    PPO_STAGES,
    _context,
    decode_features,
    ppo_update_features,
    unique_prompt_tokens,
    validate,
    trained_tokens,
)
from rlhfless.sim.workload import replay_trace
from rlhfless.core.traces import TraceWriter

TINY_PPO = ["algo.name=ppo", "algo.group_size=1", "algo.ppo_mini_batches=2", "algo.kl_coef=0.05",
            "task.arith.num_train=48", "rollout.prompts_per_step=6", "rollout.max_new_tokens=32",
            "train.steps=6", "train.checkpoint_every=100", "train.eval_prompts=0", "train.eval_every=0",
            "train.threads=1", "tracking.mode=disabled", "predictor.name=ewma"]


@pytest.fixture(scope="module")
def ppo_run(sft_checkpoint, tmp_path_factory) -> Path:
    """Six real PPO steps from the SFT checkpoint, inline, with a reference forward (kl_coef > 0)."""
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train

    out = tmp_path_factory.mktemp("ppo") / "run"
    train(load_run_config(None, TINY_PPO + [f"policy.checkpoint={sft_checkpoint}"]), out, progress=False)
    return out


def test_a_real_ppo_run_validates_with_its_values_stage(ppo_run, capsys):
    out = ppo_run.parent / "v.json"
    assert main(["simulate", "--validate", str(ppo_run), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    m = json.loads(out.read_text())["modes"]["inline"]
    assert m["algo"] == "ppo" and tuple(m["stages"]) == PPO_STAGES + ("decode_from_tpot_profile",)
    assert m["steps_validated"] == 3  # calibrated on steps 1, 3, 5
    for st in PPO_STAGES:
        assert math.isfinite(m["stages"][st]["rel_error"]) and m["stages"][st]["measured"] > 0, st
    sim = {k: v["simulated"] for k, v in m["stages"].items()}
    cal = m["calibration"]
    # the simulated step is rollout + the critic's forward + update + the remainder; the remainder (plan, reward,
    # reference, observe) is fitted after the values stage is taken out, so it does not hold the critic's forward
    assert sim["step"] == pytest.approx(sim["rollout"] + sim["values"] + sim["update"] + cal["step_other_s"])
    rows = [json.loads(x) for x in (ppo_run / "metrics.jsonl").read_text().splitlines()]
    rest = [r["timing_s/step"] - r["timing_s/rollout"] - r["timing_s/values"] - r["timing_s/update"]
            for r in rows if r.get("step") in (1, 3, 5) and "timing_s/step" in r]
    assert sim["values"] > 0 and cal["step_other_s"] == pytest.approx(np.mean(rest))
    assert "values" in printed


def test_the_ppo_section_sets_the_simulators_structure_beside_the_measured_ratios(ppo_run):
    from rlhfless.sim.perf import FITTED

    p = validate(ppo_run)["modes"]["inline"]["ppo"]
    assert p["steps"] == 6 and p["ppo_mini_batches"] == 2 and p["old_logprob_recomputed"]
    # the simulator's update per token: actor (+ critic) training at 6 x params, the old log-prob forward at 2 x
    eff = FITTED["cpu-core"]
    t, f = 6 / eff.train_mfu, 2 / eff.fwd_mfu
    assert p["update_over_actor_update"]["simulated"] == pytest.approx((PPO_MODELS * t + f) / (t + f))
    assert p["update_over_actor_update"]["simulated_training_only"] == pytest.approx(PPO_MODELS)
    assert p["values_over_reference"]["simulated"] == PPO_MODELS - 1
    # measured on the run: the critic's steps are part of the update and the reference forward ran (kl_coef > 0)
    upd = p["update_over_actor_update"]["measured"]
    assert 1.0 < upd < 10 and math.isfinite(p["update_over_actor_update"]["rel_error"])
    vr = p["values_over_reference"]["measured"]
    assert vr > 0 and vr == pytest.approx(p["mean_s"]["values"] / p["mean_s"]["reference"])


def _copy(run: Path, dst: Path, cfg_edit=None, metrics_edit=None) -> Path:
    shutil.copytree(run, dst)
    if cfg_edit:
        cfg = yaml.safe_load((dst / "config.yaml").read_text())
        cfg_edit(cfg)
        (dst / "config.yaml").write_text(yaml.safe_dump(cfg))
    if metrics_edit:
        rows = [metrics_edit(json.loads(x)) for x in (dst / "metrics.jsonl").read_text().splitlines()]
        (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def test_what_a_ppo_validation_cannot_use_is_refused_naming_the_field(ppo_run, tmp_path):
    def algo(**kw):
        return lambda c: c["algo"].update(kw)

    cases = [
        (dict(cfg_edit=algo(name="dpo")), r"config\.yaml: algo\.name 'dpo'"),
        (dict(cfg_edit=lambda c: c["runtime"].update(mode="serverless")), r"config\.yaml: .*runtime\.mode"),
        (dict(cfg_edit=algo(ppo_mini_batches=0)), r"config\.yaml: algo\.ppo_mini_batches"),
        (dict(cfg_edit=algo(ppo_epochs=None)), r"config\.yaml: algo\.ppo_epochs"),
        (dict(cfg_edit=algo(kl_coef="high")), r"config\.yaml: algo\.kl_coef"),
        (dict(cfg_edit=lambda c: c.update(algo=["ppo"])), r"config\.yaml: algo must be a mapping"),
        (dict(metrics_edit=lambda r: {k: v for k, v in r.items() if k != "timing_s/values"}),
         r"metrics\.jsonl: .*timing_s/values"),
    ]
    for i, (edit, msg) in enumerate(cases):
        with pytest.raises(DataError, match=msg):
            validate(_copy(ppo_run, tmp_path / str(i), **edit))
    grpo = _copy(ppo_run, tmp_path / "grpo", cfg_edit=algo(name="grpo"))
    with pytest.raises(DataError, match="algo.name.*calibration run .* is grpo"):
        validate(ppo_run, calibrate_from=grpo)


def test_a_run_without_the_critics_timing_says_the_ratio_is_missing(ppo_run, tmp_path):
    old = _copy(ppo_run, tmp_path / "old", metrics_edit=lambda r: {k: v for k, v in r.items()
                                                                  if k != "timing_s/update_critic"})
    p = validate(old)["modes"]["inline"]["ppo"]
    assert "timing_s/update_critic" in p["update_over_actor_update"]["missing"]
    assert "measured" in p["values_over_reference"]


# ---- run dirs measured on a known machine ---------------------------------------------------------------
OV, BW = 0.0015, 2e9
VAL0, VAL1 = 0.02, 3e-6  # values: intercept, seconds per token of the critic's forward
UPD_TOK, UPD_OPT = 4e-5, 0.25  # update: seconds per token-pass, per optimiser step (actor + critic)


def _write_ppo_run(d: Path, epochs: int, mini_batches: int, steps: int = 8, seed: int = 0) -> None:
    """A PPO run dir (G = 1, 16 prompts a step) whose stage seconds follow the constants above exactly."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True)
    rows = [TraceRow(f"p{p}", "x", s // 4, s, 0, int(rng.integers(8, 40)), int(rng.integers(5, 120)), False,
                     float(rng.integers(0, 2))) for s in range(1, steps + 1) for p in range(16)]
    with TraceWriter(d / "traces" / "rollouts.jsonl") as w:
        w.write(rows)
    cfg = {"algo": {"name": "ppo", "group_size": 1, "ppo_epochs": epochs, "ppo_mini_batches": mini_batches,
                    "kl_coef": 0.0, "skip_zero_variance_groups": True}, "train": {"threads": 2},
           "runtime": {"mode": "inline"}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    work = replay_trace(d / "traces" / "rollouts.jsonl")
    feats = decode_features(work, [1] * len(work), 16, _context(work), "round_robin")
    upd = ppo_update_features(work, cfg) @ np.array([UPD_TOK, UPD_OPT])
    with (d / "metrics.jsonl").open("w") as fh:
        for s, f, u in zip(work, feats, upd):
            dec, pre = f @ np.array([OV, 1 / BW]), 0.002 + 1e-5 * unique_prompt_tokens(s)
            val = VAL0 + VAL1 * trained_tokens(s, False)
            roll = pre + dec + 0.001
            fh.write(json.dumps({"step": s.step, "timing_s/decode": dec, "timing_s/prefill": pre,
                                 "timing_s/rollout": roll, "timing_s/values": val, "timing_s/update": u,
                                 "timing_s/update_critic": u / 2, "timing_s/reference": 0.0,
                                 "timing_s/step": roll + val + u + 0.01}) + "\n")


def test_validate_recovers_a_known_machines_ppo_stages(tmp_path):
    _write_ppo_run(tmp_path / "run", epochs=1, mini_batches=2)
    m = validate(tmp_path / "run")["modes"]["inline"]
    for st in ("rollout", "decode", "prefill", "values", "update", "step"):
        assert m["stages"][st]["rel_error"] < 1e-3, st
    assert m["calibration"]["values"] == pytest.approx((VAL0, VAL1), rel=1e-3)
    assert m["ppo"]["update_over_actor_update"]["measured"] == pytest.approx(2.0)  # the critic's half, written
    assert m["ppo"]["update_over_actor_update"]["simulated"] == pytest.approx(1.75)  # 2 mini-batches: old log-probs
    assert "kl_coef is 0" in m["ppo"]["values_over_reference"]["missing"]


def test_ppo_epochs_and_mini_batches_carry_over_from_a_calibration_run(tmp_path):
    """Calibrated on 1 epoch x 2 mini-batches, validated on 2 epochs x 4: the update scales with the token passes
    and the optimiser steps. A per-run constant for the optimiser steps would be off by 1.5 s here."""
    _write_ppo_run(tmp_path / "a", epochs=1, mini_batches=2)
    _write_ppo_run(tmp_path / "b", epochs=2, mini_batches=4, seed=1)
    m = validate(tmp_path / "b", calibrate_from=tmp_path / "a")["modes"]["inline"]
    assert m["stages"]["update"]["rel_error"] < 1e-3 and m["stages"]["step"]["rel_error"] < 1e-3
    assert m["calibration"]["update"]["s_per_optimizer_step"] == pytest.approx(UPD_OPT, rel=1e-3)
