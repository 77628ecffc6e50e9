"""A whole training run: set-up, initial eval, the step loop, checkpoints, traces, final eval, summary.

Output folder layout (`--out DIR`):
    summary.json         headline numbers (see `Summary` keys below)
    config.yaml          the resolved config
    metrics.jsonl        one line of metrics per step (mirrors W&B)
    traces/rollouts.jsonl every generated response (TraceRow), the raw material for predictors and the simulator
    tables/*.jsonl       decision tables (completions, predicted vs actual lengths)
    checkpoints/last     the policy after the last good checkpoint; checkpoints/final at the end
    wandb/               the offline W&B run (`wandb sync DIR/wandb/offline-run-*`)
"""

from __future__ import annotations

import copy
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch
import yaml

from rlhfless import metrics as M
from rlhfless.config import RunConfig
from rlhfless.errors import ConfigError, TrainingError
from rlhfless.evaluate import EvalResult, evaluate
from rlhfless.learner import Learner
from rlhfless.loop import Stages, StepReport, run_step
from rlhfless.model.factory import load_checkpoint, save_checkpoint
from rlhfless.model.tokenizer import ByteTokenizer
from rlhfless.planning import Planner
from rlhfless.records import Prompt, PromptGroup
from rlhfless.rollout.engine import SamplingParams
from rlhfless.tasks.arith import make_splits
from rlhfless.traces import TraceWriter
from rlhfless.tracking import Tracker

EVAL_SEED = 10_007  # the same sampling streams before and after training: a paired comparison


def prompt_stream(train: list[Prompt], batch: int, seed: int, group_size: int) -> Iterator[tuple[int, list[PromptGroup]]]:
    """Yield (epoch, groups) forever: each epoch visits every train prompt once in a seeded shuffled order."""
    tok = ByteTokenizer()
    rng = random.Random(seed)
    order: list[Prompt] = []
    epoch, pos = -1, 0
    while True:
        take: list[Prompt] = []
        while len(take) < batch:
            if pos >= len(order):
                order, pos, epoch = rng.sample(train, len(train)), 0, epoch + 1
            n = min(batch - len(take), len(order) - pos)
            take += order[pos:pos + n]
            pos += n
        yield epoch, [PromptGroup(p, tok.encode(p.text, bos=True), group_size) for p in take]


def run_eval(model, prompts: list[Prompt], cfg: RunConfig) -> dict[str, EvalResult]:
    if not prompts:
        return {}
    sampled = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p)
    res = {"sampled": evaluate(model, prompts, cfg.algo.group_size, sampled, seed=EVAL_SEED)}
    if cfg.train.eval_greedy:
        res["greedy"] = evaluate(model, prompts, 1, SamplingParams(cfg.rollout.max_new_tokens, 0.0), seed=EVAL_SEED)
    return res


def completions_table(report: StepReport, limit: int = 16) -> list[list]:
    rows = []
    for s in report.samples[:limit]:
        g = report.groups[s.group_index]
        rows.append([g.prompt.prompt_id, g.prompt.text, s.response_text, s.response_len, s.reward])
    return rows


def train(cfg: RunConfig, out_dir: str | Path, progress: bool = True) -> dict:
    """Run GRPO as configured and return the summary (also written to OUT/summary.json)."""
    from tqdm.auto import tqdm

    torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.train.seed)
    policy = load_checkpoint(cfg.policy.resolved())
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if cfg.algo.kl_coef > 0 else None
    learner = Learner(policy, cfg.optim, cfg.algo, reuse_prefix=cfg.rollout.reuse_prefix_forward)
    planner = Planner(cfg.predictor, cfg.plan) if cfg.train.plan else None
    stages = Stages(cfg, learner, reference, planner)
    train_prompts, eval_prompts = make_splits(cfg.task)
    eval_prompts = eval_prompts[: cfg.train.eval_prompts]
    _check_fits_context(train_prompts + eval_prompts, cfg, policy.config.max_position_embeddings)
    out = _fresh_run_dir(Path(out_dir))  # only once every check has passed: a bad config leaves nothing behind
    (out / "config.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
    tracker = Tracker(cfg.tracking, out, asdict(cfg))
    traces = TraceWriter(out / "traces" / "rollouts.jsonl")
    t_start = time.perf_counter()
    initial = run_eval(policy, eval_prompts, cfg)
    if initial:
        tracker.log(_eval_metrics(initial), step=0)
    rewards: list[float] = []
    stream = prompt_stream(train_prompts, cfg.rollout.prompts_per_step, cfg.train.seed, cfg.algo.group_size)
    bar = tqdm(range(1, cfg.train.steps + 1), desc="GRPO", disable=not progress)
    try:
        for step in bar:
            epoch, groups = next(stream)
            report = run_step(stages, groups, step, epoch, seed=cfg.train.seed * 1_000_003 + step)
            traces.write(report.trace_rows())
            log_step(tracker, report, cfg.train.table_every)
            rewards.append(report.metrics[M.REWARD_MEAN])
            bar.set_postfix(reward=f"{report.metrics[M.REWARD_MEAN]:.3f}",
                            len=f"{report.metrics[M.RESP_LEN_MEAN]:.0f}")
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                tracker.log(_eval_metrics(run_eval(policy, eval_prompts, cfg)), step=step)
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                save_checkpoint(policy, out / "checkpoints" / "last", {"step": step})
    except TrainingError as exc:
        traces.close()
        tracker.finish()
        kept = out / "checkpoints" / "last"
        raise TrainingError(f"{exc}; stopped. Last good checkpoint: "
                            f"{kept if kept.exists() else cfg.policy.resolved()} (the starting weights)") from None
    traces.close()
    save_checkpoint(policy, out / "checkpoints" / "final", {"step": cfg.train.steps})
    final = run_eval(policy, eval_prompts, cfg)
    if final:
        tracker.log(_eval_metrics(final), step=cfg.train.steps)
    summary = _summary(cfg, initial, final, rewards, time.perf_counter() - t_start, out, tracker)
    tracker.summary(summary)
    tracker.finish()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def log_step(tracker: Tracker, report: StepReport, table_every: int) -> None:
    """Scalars every step; decision tables (scaler candidates, assignment, predictions, completions) every N
    steps: a W&B table per step costs more than the step's planning itself."""
    scalars = {k: v for k, v in report.metrics.items() if not isinstance(v, list)}
    tracker.log(scalars, step=report.step)
    if table_every and report.step % table_every == 0:
        if report.plan is not None:
            rows = report.plan.decision.table_rows()
            tracker.table("scaler_candidates", list(rows[0]), [list(r.values()) for r in rows], report.step)
        tracker.table("completions", ["prompt_id", "prompt", "response", "length", "reward"],
                      completions_table(report), report.step)
        if report.prediction_rows:
            cols = ["prompt_id", "predicted", "actual_mean", "actual_max", "abs_error"]
            tracker.table("predicted_vs_actual", cols,
                          [[getattr(r, c) for c in cols] for r in report.prediction_rows], report.step)
        if report.plan is not None:
            tracker.table("assignment", ["actor", "prompt_id", "n_seqs", "predicted_len"],
                          [[a, j.group_id, j.n_seqs, j.tokens / j.n_seqs]
                           for a, jobs in enumerate(report.plan.decision.plan.actor_jobs) for j in jobs],
                          report.step)


def _check_fits_context(prompts: list[Prompt], cfg: RunConfig, context: int) -> None:
    """The longest prompt plus rollout.max_new_tokens must fit the model's context (fail before any work)."""
    longest = max(len(p.text.encode()) + 1 for p in prompts)  # bytes + BOS
    if longest + cfg.rollout.max_new_tokens > context:
        raise ConfigError(
            f"rollout.max_new_tokens: the longest prompt has {longest} tokens, so at most {context - longest} "
            f"new tokens fit the checkpoint's context of {context} (got {cfg.rollout.max_new_tokens}); "
            "lower rollout.max_new_tokens or task.k_max")


def _fresh_run_dir(out: Path) -> Path:
    """Create `out`; an earlier run there is moved aside to `out.<timestamp>` (never overwritten or mixed)."""
    if out.exists() and any(out.iterdir()):
        aside = out.with_name(f"{out.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        out.rename(aside)
        print(f"rlhfless: {out} held an earlier run; moved it to {aside}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _eval_metrics(res: dict[str, EvalResult]) -> dict[str, float]:
    m = {}
    if "sampled" in res:
        m[M.EVAL_ACC] = res["sampled"].accuracy
    if "greedy" in res:
        m[M.EVAL_ACC_GREEDY] = res["greedy"].accuracy
    return m


def _summary(cfg: RunConfig, initial: dict, final: dict, rewards: list[float], wall_s: float, out: Path,
             tracker: Tracker) -> dict:
    """reward_mean_first/last average the first/last max(1, steps // 10) steps (one step is noisy)."""
    k = max(1, len(rewards) // 10)

    def acc(res: dict, kind: str):
        return res[kind].accuracy if kind in res else None

    return {
        "steps": len(rewards),
        "eval_prompts": initial["sampled"].num_prompts if initial else 0,
        "eval_samples_per_prompt": cfg.algo.group_size,
        "eval_accuracy_initial": acc(initial, "sampled"),
        "eval_accuracy_final": acc(final, "sampled"),
        "eval_greedy_accuracy_initial": acc(initial, "greedy"),
        "eval_greedy_accuracy_final": acc(final, "greedy"),
        "eval_accuracy_per_k_initial": {str(k): v for k, v in initial["sampled"].per_k.items()} if initial else {},
        "eval_accuracy_per_k_final": {str(k): v for k, v in final["sampled"].per_k.items()} if final else {},
        "reward_mean_first": sum(rewards[:k]) / k,
        "reward_mean_last": sum(rewards[-k:]) / k,
        "wall_s": round(wall_s, 1),
        "trace_path": str(out / "traces" / "rollouts.jsonl"),
        "wandb_dir": tracker.wandb_dir,
        "seed": cfg.train.seed,
    }
