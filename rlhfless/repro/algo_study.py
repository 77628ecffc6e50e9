"""PPO beside GRPO: does RLHFless gain more on GRPO than on PPO, as the paper reports?

Simulated: the testbed's four cases (Qwen2.5-3B/7B x GRPO/PPO on 16 x L40S) under verl (tuned, and as the
paper ran it) and RLHFless, time and billed device-seconds by stage, plus two what-ifs per model (PPO drawing 8
samples per prompt, GRPO drawing one) that split "GRPO draws more samples" from the algorithm's own stages.
Measured on this machine: the quickstart's PPO and GRPO inline at the same number of sequences (rollout vs the
rest of each step), then both in the serverless runtime against the serverful control. The rule it keeps: the
arms compared hold the sequences per step (or the seed and prompts) equal. The runtime half needs 2 cores (left
out, saying so, with fewer). Each case's sizes and conditions: docs/internals.md#reproalgo_studypy.

Deviations from the paper: 1. The simulator's assumptions (`rlhfless.sim.scenario`: batch and group sizes; PPO's
critic has the policy's size). 2. The measured runs use the tiny byte-level model on CPU cores, inline.
"""

from __future__ import annotations

from pathlib import Path

from rlhfless.core.rundir import CONFIG, METRICS, SUMMARY, RunDir
from rlhfless.repro.plots import save, theme
from rlhfless.repro.records import PaperRow, StudyResult

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"ppo": REPO / "experiments" / "configs" / "quickstart_ppo.yaml",
           "grpo": REPO / "experiments" / "configs" / "quickstart.yaml"}
SIM_POLICIES = ("verl-paper", "verl", "rlhfless")
STAGES = ("rollout_s", "score_s", "update_s")
WHAT_IFS = {"ppo": ["group_size=8", "prompts_per_step=64", "n_prompts=256"],
            "grpo": ["group_size=1", "prompts_per_step=1024", "n_prompts=8192"]}
"""Per algorithm: the testbed case with the other algorithm's samples per prompt, same sequences per step and
steps per epoch (PPO 2,048 prompts / 512 = 4; GRPO 1,024 / 128 = 8)."""


# ------------------------------------------------------------------------------------------------ simulated
def sim_cases(steps: int | None, sim: tuple[str, ...] = ()) -> list[dict]:
    """The testbed's cases and the what-ifs, each {name, algo, G, what_if, baselines, policies}."""
    from rlhfless.sim.scenario import case_configs, run_case

    base = case_configs("paper-testbed", steps, list(sim))
    configs = [(cfg, what_if) for i, c in enumerate(base)  # each case, then its what-if beside it
               for cfg, what_if in ((c, False), (case_configs("paper-testbed", steps, [*sim, *WHAT_IFS[c.algo]])[i],
                                                                  True))]
    out = []
    for cfg, what_if in configs:
        case = run_case(cfg, only=SIM_POLICIES)
        name = f"{cfg.model}/{cfg.algo} G={cfg.group_size}" + (" (what-if)" if what_if else "")
        out.append({"name": name, "model": cfg.model, "algo": cfg.algo, "G": cfg.group_size, "what_if": what_if,
                    "seqs_per_step": case["seqs_per_step"], "baselines": case["baselines"],
                    "policies": {p: {k: case["policies"][p][k] for k in ("step_time_s", "cost_device_s", *STAGES)}
                                 for p in SIM_POLICIES}})
    return out


def mean_stage(cases: list[dict], policy: str, stage: str) -> float:
    """Mean seconds per step `policy` spends in `stage` over `cases`."""
    return sum(c["policies"][policy][stage] for c in cases) / len(cases)


def mean_gain(cases: list[dict], baseline: str, key: str) -> float:
    """Mean of `key` (speedup or cost_reduction) against `baseline` over `cases`."""
    return sum(c["baselines"][baseline][key] for c in cases) / len(cases)


def after_rollout_share(cases: list[dict], policy: str = "rlhfless") -> float:
    """Mean fraction of `policy`'s step spent after the rollout (scoring and update still running)."""
    return sum((c["policies"][policy]["score_s"] + c["policies"][policy]["update_s"])
               / c["policies"][policy]["step_time_s"] for c in cases) / len(cases)


def _pick(cases: list[dict], algo: str, G: int) -> list[dict]:
    return [c for c in cases if c["algo"] == algo and c["G"] == G]


def _gains(cases: list[dict], baseline: str) -> str:
    return f"{mean_gain(cases, baseline, 'speedup'):.2f}x / {mean_gain(cases, baseline, 'cost_reduction'):.1%}"


TIE = 0.005
"""Mean gains closer than this (0.005x of speedup, half a point of cost reduction) are called alike: the printed
numbers round to the same value, or nearly."""


def verdict(grpo: list[dict], ppo: list[dict], baseline: str) -> str:
    """Whether GRPO's mean speedup and cost reduction exceed PPO's (or are alike, within `TIE`), each said, with
    the numbers."""
    says = []
    for key, label in (("speedup", "speed"), ("cost_reduction", "cost")):
        diff = mean_gain(grpo, baseline, key) - mean_gain(ppo, baseline, key)
        says.append(f"{label}: " + ("alike" if abs(diff) < TIE else f"{'GRPO' if diff > 0 else 'PPO'} gains more"))
    return f"GRPO {_gains(grpo, baseline)}, PPO {_gains(ppo, baseline)} ({'; '.join(says)})"


def sim_row(cases: list[dict]) -> PaperRow:
    grpo, ppo = _pick(cases, "grpo", 8), _pick(cases, "ppo", 1)
    ppo8, grpo1 = _pick(cases, "ppo", 8), _pick(cases, "grpo", 1)
    why = (f"what-ifs vs paper verl: PPO drawing 8 samples per prompt {_gains(ppo8, 'paper')}, GRPO drawing one "
           f"{_gains(grpo1, 'paper')}; after the rollout RLHFless still spends {after_rollout_share(ppo):.0%} of "
           f"a PPO step vs {after_rollout_share(grpo):.0%} of a GRPO one (value forward and critic update); the "
           f"optimizer steps take paper verl {mean_stage(ppo, 'verl-paper', 'update_s'):.1f} s of a PPO step "
           f"(actor and critic, 4 mini-batches) vs {mean_stage(grpo, 'verl-paper', 'update_s'):.1f} s of a GRPO "
           f"one, RLHFless {mean_stage(ppo, 'rlhfless', 'update_s'):.1f} vs "
           f"{mean_stage(grpo, 'rlhfless', 'update_s'):.1f} s")
    return PaperRow("GRPO gains more than PPO (testbed mean speedup / cost reduction vs verl)",
                    "yes (GRPO draws more samples per prompt)", verdict(grpo, ppo, "paper"), "simulated", why,
                    verdict(grpo, ppo, "tuned"))


# ------------------------------------------------------------------------------------------------- measured
def real_sizes(quick: bool) -> dict[str, dict]:
    """Steps and prompts per step of each real run: the same generated sequences (steps x prompts x G)."""
    if quick:
        return {"ppo": {"steps": 4, "prompts": 16, "G": 1}, "grpo": {"steps": 1, "prompts": 8, "G": 8}}
    return {"ppo": {"steps": 16, "prompts": 64, "G": 1}, "grpo": {"steps": 4, "prompts": 32, "G": 8}}


RUNTIME = ["plan.max_actors=2", "plan.objective=min_cost_at_deadline", "plan.deadline_ratio=1.0",
           "runtime.keep_alive_s=2.0", "runtime.gantt_every=0"]
"""The platform conditions of the serverless-vs-serverful configs, for both algorithms."""
MODES = ("serverful", "serverless")


def real_run(ctx, algo: str, size: dict, mode: str = "inline") -> Path:
    """One quickstart run of `algo` at `size` (no held-out eval: only step times matter here), inline on one
    thread or in runtime mode `mode` (RUNTIME conditions), reused while its summary.json exists."""
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train

    name = algo if mode == "inline" else f"{algo}-{mode}"
    out = ctx.out / "ppo-vs-grpo" / "runs" / f"{name}-{'quick' if ctx.quick else 'full'}-seed{ctx.seed}"
    if RunDir(out).summary.is_file():
        return out
    overrides = [f"train.steps={size['steps']}", f"rollout.prompts_per_step={size['prompts']}",
                 f"algo.group_size={size['G']}", "train.eval_prompts=0", "train.table_every=0",
                 f"train.seed={ctx.seed}", f"tracking.mode={ctx.tracking}", "tracking.group=ppo-vs-grpo"]
    overrides += ["train.threads=1"] if mode == "inline" else [f"runtime.mode={mode}", *RUNTIME]
    train(load_run_config(str(CONFIGS[algo]), overrides), out, progress=False)
    return out


def runtime_gain(serverful: Path, serverless: Path) -> dict:
    """Serverless over serverful: mean step time and billed device-seconds per step (each run's summary.json),
    and whether the two drew the same samples every step."""
    import json

    from rlhfless.run.compare import samples_match

    a, b = (json.loads(RunDir(p).summary.read_text())["runtime"] for p in (serverful, serverless))
    same, _, n = samples_match(serverful, serverless)
    return {"step_time_ratio": b["step_time_s"] / a["step_time_s"],
            "cost_ratio": b["cost_device_s"] / a["cost_device_s"], "samples_identical": same, "steps": n,
            "serverful_step_s": a["step_time_s"], "serverless_step_s": b["step_time_s"]}


def runtime_row(gains: dict[str, dict]) -> PaperRow:
    p, g = gains["ppo"], gains["grpo"]
    ours = (f"serverless / serverful, step time and billed device-seconds: GRPO {g['step_time_ratio']:.2f}x / "
            f"{g['cost_ratio']:.2f}x, PPO {p['step_time_ratio']:.2f}x / {p['cost_ratio']:.2f}x")
    why = (f"the same workloads in the runtime on this machine's 2 cores, GRPO {g['steps']} steps, PPO "
           f"{p['steps']} (identical samples in both modes: GRPO {g['samples_identical']}, PPO "
           f"{p['samples_identical']}); the first step's cold starts weigh more in the shorter run; every step "
           f"keeps both cores busy, so there is no idle decode tail for serverless to give back (docs/runtime.md); "
           f"the paper's gains come from idle devices at scale (the simulated row)")
    return PaperRow("RLHFless vs a held pool on real runs, GRPO vs PPO", "GRPO gains more than PPO", ours,
                    "measured", why)


def step_split(metrics_path: Path, seqs_per_step: int) -> dict:
    """Totals over a run's steps: seconds in the rollout and after it (values, reference, update, ...), generated
    sequences and tokens, and the mean fraction of groups the update skipped, read from metrics.jsonl (its rows
    with timing_s/step)."""
    tot = {"steps": 0, "step_s": 0.0, "rollout_s": 0.0, "values_s": 0.0, "update_s": 0.0, "sequences": 0,
           "tokens": 0.0, "groups_skipped": 0.0}
    for row in RunDir(metrics_path.parent).read_step_metrics().values():
        tot["steps"] += 1
        tot["step_s"] += row["timing_s/step"]
        tot["rollout_s"] += row["timing_s/rollout"]
        tot["values_s"] += row.get("timing_s/values", 0.0)  # PPO only
        tot["update_s"] += row["timing_s/update"]
        tot["sequences"] += seqs_per_step
        tot["tokens"] += row["response_length/mean"] * seqs_per_step
        tot["groups_skipped"] += row.get("actor/groups_skipped_frac", 0.0)  # GRPO: equal rewards, no gradient
    tot["after_rollout_share"] = 1.0 - tot["rollout_s"] / tot["step_s"]
    tot["groups_skipped"] /= tot["steps"]
    tot["ms_per_token"] = {k: 1e3 * tot[f"{k}_s"] / tot["tokens"] for k in ("rollout", "values", "update", "step")}
    return tot


def real_row(split: dict[str, dict]) -> PaperRow:
    p, g = split["ppo"], split["grpo"]
    ours = (f"after the rollout: PPO {p['after_rollout_share']:.0%} of its step time (values "
            f"{p['values_s'] / p['step_s']:.0%}, update {p['update_s'] / p['step_s']:.0%}), GRPO "
            f"{g['after_rollout_share']:.0%} (update {g['update_s'] / g['step_s']:.0%}); per generated token "
            f"{p['ms_per_token']['step']:.2f} vs {g['ms_per_token']['step']:.2f} ms")
    why = (f"same task and {p['sequences']:,} generated sequences each ({p['tokens']:,.0f} vs {g['tokens']:,.0f} "
           f"tokens; PPO {p['steps']} steps at G=1, GRPO {g['steps']} at G=8), inline on this machine's cores: "
           f"PPO's value forward and critic update are per-token work the rollout optimizations do not shorten, "
           f"while GRPO's update skipped {g['groups_skipped']:.0%} of its groups (equal rewards: no gradient) and "
           f"runs each prompt's forward once per group")
    return PaperRow("share of a step the rollout optimizations cannot shorten, PPO vs GRPO (real runs)",
                    "- (the paper: PPO gains less)", ours, "measured", why)


# ---------------------------------------------------------------------------------------------------- study
def _figure(cases: list[dict], split: dict[str, dict], gains: dict | None, path: Path) -> Path:
    """Top: seconds and device-seconds per simulated step per case and policy, and RLHFless's gains over paper
    verl; bottom: the measured runs' milliseconds per generated token by stage, and serverless over serverful on
    real runs of each algorithm (when measured)."""
    import pandas as pd

    plt, sns = theme()
    fig = plt.figure(figsize=(20, 10))
    grid = fig.add_gridspec(2, 6, hspace=0.55, wspace=0.6)
    top = [fig.add_subplot(grid[0, 2 * i:2 * i + 2]) for i in range(3)]
    bottom = [fig.add_subplot(grid[1, :3]), fig.add_subplot(grid[1, 3:])]
    df = pd.DataFrame([{"case": c["name"].replace(" (what-if)", "\n(what-if)"), "policy": p, **q}
                       for c in cases for p, q in c["policies"].items()])
    for ax, y, label in ((top[0], "step_time_s", "seconds per step"),
                         (top[1], "cost_device_s", "device-seconds per step")):
        sns.barplot(data=df, x="case", y=y, hue="policy", hue_order=list(SIM_POLICIES), ax=ax)
        ax.set(xlabel="", ylabel=label, title=f"{label} (simulated 16 x L40S)")
    sim_gains = pd.DataFrame([{"case": c["name"].replace(" (what-if)", "\n(what-if)"), "gain": label,
                               "vs paper verl": c["baselines"]["paper"][key] - (1.0 if key == "speedup" else 0.0)}
                              for c in cases for key, label in (("speedup", "speedup - 1"),
                                                                ("cost_reduction", "cost reduction"))])
    sns.barplot(data=sim_gains, x="case", y="vs paper verl", hue="gain", ax=top[2])
    top[2].axhline(0, color="grey", lw=0.6)
    top[2].set(xlabel="", title="RLHFless vs verl as the paper ran it (simulated)")
    for ax in top:
        ax.tick_params(axis="x", rotation=35, labelsize=7)
    real = pd.DataFrame([{"algo": f"{a} ({s['steps']} steps)", "stage": k, "ms per generated token": v}
                         for a, s in split.items() for k, v in s["ms_per_token"].items() if k != "step"])
    sns.barplot(data=real, x="algo", y="ms per generated token", hue="stage", ax=bottom[0])
    bottom[0].set(xlabel="", title="measured here: the quickstart inline, same generated sequences")
    if gains:
        ratios = pd.DataFrame([{"algo": a.upper(), "ratio": label, "serverless / serverful": g[key]}
                               for a, g in gains.items() for key, label in (("step_time_ratio", "step time"),
                                                                            ("cost_ratio", "billed device-s"))])
        sns.barplot(data=ratios, x="algo", y="serverless / serverful", hue="ratio", ax=bottom[1])
        bottom[1].axhline(1.0, color="grey", lw=0.6)
        bottom[1].set(xlabel="", title="measured here: serverless vs the serverful pool, same samples (1 = parity)")
    else:
        bottom[1].axis("off")
        bottom[1].text(0.5, 0.5, "serverless vs serverful: not measured (needs 2 cores)", ha="center")
    fig.suptitle("PPO beside GRPO: where RLHFless gains, and the stages it cannot shorten")
    fig.subplots_adjust(left=0.05, right=0.98, top=0.92, bottom=0.08)
    return save(fig, path, tight=False)  # the grid's spacing is set above (tight_layout cannot span cells)


def ppo_vs_grpo(ctx) -> StudyResult:
    """The simulated testbed comparison, its what-ifs, and the measured stage split (module header)."""
    from rlhfless.core.jsonl import write_json

    steps = 6 if ctx.quick else None
    sizes = real_sizes(ctx.quick)
    res = StudyResult("ppo-vs-grpo", "PPO beside GRPO: RLHFless's gain on each (simulated testbed) and the stages "
                      "it cannot shorten (measured here)",
                      {"scenario": "paper-testbed", "steps": steps or "scenario default (24 GRPO, 12 PPO)",
                       "what_ifs": WHAT_IFS, "real_sizes": sizes, "seed": ctx.seed, "threads": 1})
    cases = sim_cases(steps, ctx.sim)
    runs = {a: real_run(ctx, a, sizes[a]) for a in ("ppo", "grpo")}
    split = {a: step_split(RunDir(runs[a]).metrics, sizes[a]["prompts"] * sizes[a]["G"]) for a in runs}
    from rlhfless.runtime.config import available_cores  # here: it imports torch, and `--help` must not

    gains = None
    if available_cores() >= 2:
        modes = {a: {m: real_run(ctx, a, sizes[a], m) for m in MODES} for a in ("ppo", "grpo")}
        gains = {a: runtime_gain(modes[a]["serverful"], modes[a]["serverless"]) for a in modes}
        res.artifacts += [RunDir(modes[a][m]).summary for a in modes for m in MODES]
    else:
        res.notes.append("the runtime half was left out: it needs 2 cores (runtime.units), this process has fewer")
    res.figures.append(_figure(cases, split, gains, ctx.out / "ppo-vs-grpo" / "ppo_vs_grpo.png"))
    res.rows += [sim_row(cases), real_row(split)] + ([runtime_row(gains)] if gains else [])
    res.artifacts += [write_json(cases, ctx.out / "ppo-vs-grpo" / "cases.json")]
    res.artifacts += [runs[a] / f for a in runs for f in (METRICS, SUMMARY, CONFIG)]
    res.notes.append("the stage-split runs are inline, one thread each; the runtime runs use one core per "
                     "function; all on cores that may be shared: ratios are side by side, absolute seconds are not "
                     "clean")
    res.numbers = {"cases": cases, "measured": split, "runtime": gains}
    return res
