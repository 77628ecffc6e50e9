"""`rlhfless bench loop`: the GRPO step with an optimization on vs off, measured side by side in one run.

Two policies start from the same checkpoint and see the same prompts and sampling seeds; their steps alternate
(A, B, A, B, ...) so machine load hits both alike. Because the engine's samples do not depend on how the prefill
was computed, the two runs must produce the same tokens, rewards and updates: the bench checks that the learning
curves are identical and reports the median step time of each arm and their ratio.
`--feature engine` compares whole GRPO steps with the own rollout engine ("on") and vLLM ("off", the optional
extra, run from `.venv-vllm`): there the curves differ by construction (vLLM samples from its own random streams),
so only the step times and their ratio are the result.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rlhfless.core import metrics as M
from rlhfless.core.cliargs import count
from rlhfless.core.jsonl import write_json

ARMS = {
    "dedup_prefill": ("rollout.dedup_prefill=true", "rollout.dedup_prefill=false"),
    "reuse_prefix_forward": ("rollout.reuse_prefix_forward=true", "rollout.reuse_prefix_forward=false"),
    "engine": ("rollout.engine=own", "rollout.engine=vllm"),
}
LABELS = {"engine": ("own", "vllm")}
"""What the two arms are called in the printout (default: on, off)."""


@dataclass
class LoopArm:
    name: str
    stages: object
    times: dict[str, list[float]]
    rewards: list[float]
    lengths: list[list[int]]


def _arm(name: str, config: str | None, overrides: list[str]) -> LoopArm:
    from rlhfless.config import load_run_config
    from rlhfless.learn.learner import Learner
    from rlhfless.step.loop import Stages
    from rlhfless.model.factory import load_policy

    cfg = load_run_config(config, overrides)
    policy = load_policy(cfg.policy.resolved())
    learner = Learner(policy, cfg.optim, cfg.algo, reuse_prefix=cfg.rollout.reuse_prefix_forward)
    return LoopArm(name, Stages(cfg, learner), {}, [], [])


def run_loop_bench(feature: str = "dedup_prefill", steps: int = 20, config: str | None = None,
                   overrides: list[str] | None = None, threads: int = 2, progress: bool = True) -> dict:
    """Alternate `steps` steps of each arm; return medians, ratios and whether the curves are identical."""
    import torch
    from tqdm.auto import tqdm

    from rlhfless.step.loop import run_step
    from rlhfless.run.runner import prompt_stream

    if feature not in ARMS:
        from rlhfless.core.errors import UserError

        raise UserError(f"bench loop: unknown feature {feature!r}; allowed: {sorted(ARMS)}")
    torch.set_num_threads(threads)
    base = list(overrides or []) + ["train.plan=false"]
    on, off = (_arm(n, config, base + [o]) for n, o in zip(("on", "off"), ARMS[feature]))
    cfg = on.stages.cfg
    env = on.stages.env
    train_prompts, _ = env.task.splits()
    stream = prompt_stream(train_prompts, cfg.rollout.prompts_per_step, cfg.train.seed, cfg.algo.group_size, env)
    try:
        for step in tqdm(range(1, steps + 1), desc=f"bench loop ({feature})", disable=not progress):
            epoch, groups = next(stream)
            for arm in (on, off) if step % 2 else (off, on):
                rep = run_step(arm.stages, groups, step, epoch, seed=step)
                for k, v in rep.metrics.items():
                    if k.startswith("timing_s/"):
                        arm.times.setdefault(k, []).append(v)
                arm.rewards.append(rep.metrics[M.REWARD_MEAN])
                arm.lengths.append([s.response_len for s in rep.samples])
    finally:
        for arm in (on, off):
            arm.stages.close()  # the vLLM arm's engine
    return _report(feature, steps, on, off)


def _report(feature: str, steps: int, on: LoopArm, off: LoopArm) -> dict:
    skip = 1  # the first step pays one-off warm-up costs
    med = {a.name: {k[len("timing_s/"):]: statistics.median(v[skip:]) for k, v in a.times.items()} for a in (on, off)}
    return {
        "feature": feature,
        "steps": steps,
        "median_s_on": med["on"],
        "median_s_off": med["off"],
        "step_time_ratio_off_over_on": med["off"]["step"] / med["on"]["step"],
        "stage_ratio_off_over_on": {k: med["off"][k] / med["on"][k] for k in med["on"] if med["on"][k] > 0},
        "identical_lengths": on.lengths == off.lengths,
        "identical_rewards": on.rewards == off.rewards,
        "reward_curve_on": on.rewards,
        "reward_curve_off": off.rewards,
    }


def cmd_bench_loop(args) -> int:
    res = run_loop_bench(args.feature, args.steps, args.config, args.overrides, args.threads, not args.no_progress)
    on, off = LABELS.get(res["feature"], ("on", "off"))
    print(f"feature {res['feature']}: median step {res['median_s_on']['step']:.3f} s {on} vs "
          f"{res['median_s_off']['step']:.3f} s {off} -> {res['step_time_ratio_off_over_on']:.3f}x; "
          f"identical lengths {res['identical_lengths']}, rewards {res['identical_rewards']}")
    for stage, r in sorted(res["stage_ratio_off_over_on"].items()):
        print(f"  {stage:10s} {on} {res['median_s_on'][stage]:.4f} s  {off} {res['median_s_off'][stage]:.4f} s  "
              f"{r:.2f}x")
    if args.json:
        write_json(res, args.json)
    return 0


def register(sub, bench) -> None:
    p = bench.add_parser(
        "loop", help="GRPO steps with an optimization on vs off, alternating, same prompts and seeds",
        description="Measure the whole GRPO step with one optimization on and off, side by side; checks that the "
                    "learning curves are identical (the optimizations are exact).",
        epilog="example: rlhfless bench loop --feature dedup_prefill --steps 20 --json runs/bench/loop.json")
    p.add_argument("--feature", default="dedup_prefill", choices=sorted(ARMS), help="what to switch")
    p.add_argument("--steps", type=count(2, 100_000), default=20, help="steps per arm (default 20)")
    p.add_argument("--config", default="experiments/configs/quickstart.yaml", help="run config")
    p.add_argument("--threads", type=count(1, 1024), default=2, help="torch threads")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for both arms")
    p.set_defaults(func=cmd_bench_loop)
