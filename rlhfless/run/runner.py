"""A whole training run: set-up, initial eval, the step loop, checkpoints, traces, final eval, summary.

Output folder layout (`--out DIR`):
    summary.json         headline numbers (see `Summary` keys below)
    config.yaml          the resolved config
    metrics.jsonl        one line of metrics per step (mirrors W&B)
    traces/rollouts.jsonl every generated response (TraceRow), the raw material for predictors and the simulator
    tables/*.jsonl       decision tables (completions, predicted vs actual lengths)
    checkpoints/last     the policy after the last good checkpoint; checkpoints/final at the end
    wandb/               the offline W&B run (`wandb sync DIR/wandb/offline-run-*`)
    .rlhfless-run.lock   while the run is live: its claim on the folder (`outpaths.claim_run_dir`), deleted at the end
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml

from rlhfless.core import metrics as M
from rlhfless.config import RunConfig
from rlhfless.core.errors import ConfigError, DataError, Interrupted, TrainingError
from rlhfless.step.heldout import EvalResult, evaluate
from rlhfless.core.jsonl import write_atomic, write_json
from rlhfless.learn.learner import Learner
from rlhfless.step.loop import Stages, StepReport, run_step
from rlhfless.model.factory import load_policy, save_checkpoint
from rlhfless.step.planner import Planner, cut_report, tau_per_step
from rlhfless.core.records import Prompt, PromptGroup
from rlhfless.run.preflight import (
    check_fits_context,
    context_of,
    ensure_policy,
    held_out,
    placed,
    plan_config,
)
from rlhfless.run.runfolder import RunState, check_resume, find_checkpoint, output_files, read_state
from rlhfless.run.runstate import (
    check_outputs,
    file_sizes,
    nonfinite_parameter,
    read_rng,
    restore_optimizer,
    rewind_outputs,
    save_run_checkpoint,
)
from rlhfless.step.textenv import TextEnv, make_env
from rlhfless.core.traces import TraceWriter
from rlhfless.run.tracking import Tracker
from rlhfless.core.rundir import RunDir

EVAL_SEED = 10_007  # the same sampling streams before and after training: a paired comparison


class PromptStream:
    """Epochs over the train prompts, each in its own seeded order; the position (epoch, pos) is the whole state,
    so a resumed run continues with exactly the prompts an uninterrupted run would have drawn."""

    def __init__(self, train: list[Prompt], batch: int, seed: int, group_size: int, env: TextEnv, epoch: int = 0,
                 pos: int = 0):
        self.train, self.batch, self.seed, self.group_size, self.env = train, batch, seed, group_size, env
        self.epoch, self.pos = epoch, pos
        self._order = self._epoch_order(epoch)

    def _epoch_order(self, epoch: int) -> list[Prompt]:
        return random.Random(f"{self.seed}:{epoch}").sample(self.train, len(self.train))

    def next(self) -> tuple[int, list[PromptGroup]]:
        """(epoch of the last prompt drawn, the next `batch` prompt groups)."""
        take: list[Prompt] = []
        while len(take) < self.batch:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            n = min(self.batch - len(take), len(self._order) - self.pos)
            take += self._order[self.pos:self.pos + n]
            self.pos += n
        return self.epoch, [PromptGroup(p, self.env.encode(p), self.group_size) for p in take]


def prompt_stream(train: list[Prompt], batch: int, seed: int, group_size: int,
                  env: TextEnv) -> Iterator[tuple[int, list[PromptGroup]]]:
    """Yield (epoch, groups) forever (a generator view of `PromptStream`)."""
    stream = PromptStream(train, batch, seed, group_size, env)
    while True:
        yield stream.next()


def run_eval(model, prompts: list[Prompt], cfg: RunConfig, env: TextEnv,
             progress: bool = False) -> dict[str, EvalResult]:
    """Held-out accuracy, sampled (and greedy when `train.eval_greedy`); a bar over the prompts of each pass when
    `progress` (two passes over 500 prompts count to 500 twice, not to 1,000 "prompts")."""
    from rlhfless.core.progress import count_bar

    if not prompts:
        return {}
    r = cfg.rollout
    passes = {"sampled": (eval_samples(cfg), env.sampling(r.max_new_tokens, r.temperature, r.top_p))}
    if cfg.train.eval_greedy:
        passes["greedy"] = (1, env.sampling(r.max_new_tokens, 0.0))
    res = {}
    for kind, (samples, sampling) in passes.items():
        advance, close = count_bar(len(prompts), f"held-out eval, {kind}", progress, "prompt")
        try:
            res[kind] = evaluate(model, prompts, samples, sampling, env, seed=EVAL_SEED, progress=advance)
        finally:
            close()
    return res


def eval_samples(cfg: RunConfig) -> int:
    """Sampled responses per held-out prompt: train.eval_samples, else algo.group_size."""
    return cfg.train.eval_samples or cfg.algo.group_size


def completions_table(report: StepReport, limit: int = 16) -> list[list]:
    rows = []
    for s in report.samples[:limit]:
        g = report.groups[s.group_index]
        rows.append([g.prompt.prompt_id, g.prompt.text, s.response_text, s.response_len, s.reward])
    return rows


@dataclass
class Run:
    """Everything a run holds between set-up and summary."""

    cfg: RunConfig
    out: Path
    learner: Learner
    planner: Planner | None
    stages: Stages
    eval_prompts: list[Prompt]
    stream: PromptStream
    tracker: Tracker
    traces: TraceWriter
    state: RunState
    initial: dict[str, EvalResult]
    t_start: float
    runtime_summary: dict | None = None
    progress: bool = True
    cutting: str | None = None
    """What an interrupt now would cut short ("step 4", "the checkpoint after step 3"); None between them."""



def write_digest(out: Path, step: int, report: StepReport) -> None:
    """One SHA-256 over the step's responses (row order), so two runs can be checked sample for sample."""
    h = hashlib.sha256()
    for s in report.samples:
        h.update(bytes(str(list(s.response_ids)), "ascii") + b"\n")
    with RunDir(out).digests.open("a") as f:
        f.write(json.dumps({"step": step, "sha256": h.hexdigest()}) + "\n")


def train(cfg: RunConfig, out_dir: str | Path, progress: bool = True, resume: bool = False,
          allow_config_change: bool = False) -> dict:
    """Run GRPO as configured and return the summary (also written to OUT/summary.json).

    resume: continue the run in `out_dir` from its last checkpoint; the result equals an uninterrupted run's.
    allow_config_change: resume even if the config differs in keys that change results (listed in a warning).
    """
    from rlhfless.core.outpaths import claim_run_dir
    from rlhfless.run.inputs import check_inputs

    cfg.check_machine()
    check_inputs(cfg)  # before the folder exists: a refused input leaves nothing that blocks the fixed command
    # the folder is this run's alone from here on (an earlier, finished run there is moved aside; a live one
    # refuses this call); a run that fails before writing anything leaves no folder behind
    if cfg.runtime.mode == "compare":
        raise ConfigError("runtime.mode=compare runs several arms: call rlhfless.run.launch.train")
    with claim_run_dir(str(out_dir), resume, earlier_run_ok=True):
        torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        run = _resume(cfg, Path(out_dir), allow_config_change) if resume else _start(cfg, Path(out_dir), progress)
        run.progress = progress
        _steps(run, progress)
        return _finish(run)


def build_parts(cfg: RunConfig, policy, ckpt: Path | None) -> tuple[Learner, Planner | None, Stages, list, list]:
    """Learner, planner, PPO's critic and stages around `policy`, restored from a run checkpoint `ckpt` when given
    (the policy's optimizer is restored by the caller). `preflight.dry_run` makes the same checks in the same order
    without torch: a check added here belongs there too (tests/test_dry_run.py compares their refusals)."""
    critic = None
    if cfg.algo.name == "ppo":
        from rlhfless.learn.critic import STATE_FILE as CRITIC_FILE, load_critic, load_critic_state

        critic = load_critic(cfg.critic, cfg.policy.resolved(), int(policy.config.vocab_size))
        if ckpt is not None:
            load_critic_state(critic, ckpt / CRITIC_FILE)
    reference = None
    if cfg.algo.kl_coef > 0:  # the reference is always the run's starting policy, also when resuming
        reference = placed(cfg, load_policy(cfg.policy.resolved())).eval().requires_grad_(False)
    policy = placed(cfg, policy)  # before the optimizer is made: AdamW's state follows the parameters
    learner = Learner(policy, cfg.optim, cfg.algo, reuse_prefix=cfg.rollout.reuse_prefix_forward)
    planner = Planner(cfg.predictor, plan_config(cfg)) if cfg.train.plan else None
    if ckpt is not None and planner is not None:
        from rlhfless.predictor import load_predictor

        planner.predictor = load_predictor(ckpt / "predictor")
    env = make_env(cfg)
    train_prompts, eval_prompts = env.task.splits()
    eval_prompts = held_out(eval_prompts, cfg.train.eval_prompts, cfg.task.name)
    if cfg.runtime.device != "emulated":  # emulated workers model another model's context; the checkpoint's is moot
        check_fits_context(train_prompts + eval_prompts, cfg, context_of(policy, env), env)
    return learner, planner, Stages(cfg, learner, reference, planner, env, critic), train_prompts, eval_prompts


def _start(cfg: RunConfig, out_dir: Path, progress: bool = True) -> Run:
    ensure_policy(cfg, progress)
    policy = load_policy(cfg.policy.resolved())
    learner, planner, stages, train_prompts, eval_prompts = build_parts(cfg, policy, None)
    out = out_dir  # claimed by `train`: it holds nothing but the claim's lock file
    write_atomic(RunDir(out).config, yaml.safe_dump(asdict(cfg), sort_keys=False))
    tracker = Tracker(cfg.tracking, out, asdict(cfg))
    traces = TraceWriter(RunDir(out).trace)
    stream = PromptStream(train_prompts, cfg.rollout.prompts_per_step, cfg.train.seed, cfg.algo.group_size,
                          stages.env)
    state = RunState(0, 0, None, 0, 0, [], wandb_id=tracker.run_id)
    run = Run(cfg, out, learner, planner, stages, eval_prompts, stream, tracker, traces, state, {},
              time.perf_counter())
    run.initial = run_eval(learner.model, eval_prompts, cfg, stages.env, progress)
    if run.initial:
        tracker.log(_eval_metrics(run.initial), step=0)
    return run


def _resume(cfg: RunConfig, out: Path, allow_config_change: bool) -> Run:
    ckpt, state = check_resume(cfg, out, allow_config_change)
    policy = load_policy(ckpt)
    learner, planner, stages, train_prompts, eval_prompts = build_parts(cfg, policy, ckpt)
    restore_optimizer(learner.opt, ckpt, state.optimizer_groups)
    rng = read_rng(ckpt)
    check_outputs(out, state.file_sizes, state.step, output_files(out))  # every check before any file changes
    learner.updates, learner.last_grad_norm = state.learner_updates, state.last_grad_norm
    stream = PromptStream(train_prompts, cfg.rollout.prompts_per_step, cfg.train.seed, cfg.algo.group_size,
                          stages.env, state.stream_epoch, state.stream_pos)
    initial = _initial_eval(state, ckpt)
    rewind_outputs(out, state.file_sizes, state.step, output_files(out))
    kept = out / "resumed" / f"step-{state.step}"
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy2(RunDir(out).config, RunDir(kept).config)  # the config the run had before this resume
    for done in (RunDir(out).summary, RunDir(out).checkpoint("final")):  # a finished run being extended
        if done.exists():
            done.rename(kept / done.name)
    write_atomic(RunDir(out).config, yaml.safe_dump(asdict(cfg), sort_keys=False))
    tracker = Tracker(cfg.tracking, out, asdict(cfg), resume_id=state.wandb_id)
    traces = TraceWriter(RunDir(out).trace)
    torch.set_rng_state(rng)  # last: loading weights above may draw from the global generator
    print(f"rlhfless: resuming {out} after step {state.step} (checkpoint {ckpt})", file=sys.stderr)
    return Run(cfg, out, learner, planner, stages, eval_prompts, stream, tracker, traces, state, initial,
               time.perf_counter() - state.elapsed_s)


def _initial_eval(state: RunState, ckpt: Path) -> dict[str, EvalResult]:
    try:
        return {k: EvalResult(**{**v, "per_k": {int(a): b for a, b in v["per_k"].items()}})
                for k, v in state.initial_eval.items()}
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise DataError(f"{ckpt / 'state.json'}: corrupt initial evaluation ({exc!r})") from None


def _steps(run: Run, progress: bool) -> None:
    """The step loop; with runtime.mode serverless/serverful the stages run on worker processes."""
    if run.cfg.runtime.executes:
        from rlhfless.runtime.loop_stages import RuntimeStages

        run.stages = RuntimeStages(run.cfg, run.learner, run.planner, run.cfg.runtime.mode, run.out,
                                   env=run.stages.env, progress=progress, critic=run.stages.critic)
    try:
        _loop(run, progress)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (cli.signals_interrupt): stop the workers at once
        run.stages.interrupt()
        raise _interrupted(run, exc) from None
    finally:
        run.stages.close()  # the runtime releases every worker, then brings run.learner up to date
    run.runtime_summary = run.stages.summary()
    if run.runtime_summary:
        from rlhfless.run.gantt import gantt_steps, plot_steps

        for k in gantt_steps(run.cfg.train.steps, run.cfg.runtime.gantt_every):
            plot_steps({run.cfg.runtime.mode: run.out}, k, RunDir(run.out).gantt(k))


def _loop(run: Run, progress: bool) -> None:
    from tqdm.auto import tqdm

    cfg, st = run.cfg, run.state
    bar = tqdm(range(st.step + 1, cfg.train.steps + 1), desc=cfg.algo.name.upper(), disable=not progress,
               initial=st.step, total=cfg.train.steps)
    try:
        for step in bar:
            run.cutting = f"step {step} of {cfg.train.steps}"
            epoch, groups = run.stream.next()
            report = run_step(run.stages, groups, step, epoch, seed=cfg.train.seed * 1_000_003 + step)
            run.traces.write(report.trace_rows())
            write_digest(run.out, step, report)
            log_step(run.tracker, report, cfg.train.table_every)
            st.rewards.append(report.metrics[M.REWARD_MEAN])
            st.step = step
            if not cfg.runtime.executes:  # inline, the learner's model is the one that was just updated
                check_weights(run, step)
            bar.set_postfix(reward=f"{report.metrics[M.REWARD_MEAN]:.3f}",
                            len=f"{report.metrics[M.RESP_LEN_MEAN]:.0f}")
            # evaluations and checkpoints run on the driver between steps: billed to neither runtime mode
            run.cutting = None  # the step is done: its records are written
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                run.cutting = f"the evaluation after step {step}"
                with run.stages.off_clock():
                    run.stages.sync_learner()
                    result = run_eval(run.learner.model, run.eval_prompts, cfg, run.stages.env, progress)
                run.tracker.log(_eval_metrics(result), step=step)
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                run.cutting = f"the checkpoint after step {step}"
                with run.stages.off_clock():
                    run.stages.sync_learner()
                    _checkpoint(run)
            run.cutting = None
    except TrainingError as exc:
        raise _stopped(run, exc) from None
    except KeyboardInterrupt:
        bar.close()  # the interrupt's line goes below the bar, not onto it
        raise


def _interrupted(run: Run, exc: KeyboardInterrupt) -> Interrupted:
    """The interrupt, saying which step it cut short and how the run continues."""
    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    run.traces.close()
    try:
        done = read_state(find_checkpoint(run.out)).step
    except DataError:
        done = None
    # the part really cut short: a step, or the evaluation or checkpoint after one (`Run.cutting`); none when the
    # signal came between them (after a complete checkpoint, before the next step began)
    where = (f"{run.cutting} was cut short" if run.cutting else
             f"stopped after step {run.state.step} of {run.cfg.train.steps}, before the next began")
    if done is None:
        return Interrupted(signum, f"{where}, before the first checkpoint (train.checkpoint_every); nothing to "
                                   f"resume: start over with a new --out (or remove {run.out})")
    return Interrupted(signum, f"{where}; continue from the checkpoint of step {done} with the same command "
                               "and --resume")


def _stopped(run: Run, exc: TrainingError) -> TrainingError:
    """Close the run's files and say where the last good weights are."""
    run.traces.close()
    run.tracker.finish()
    kept = RunDir(run.out).checkpoint("last")
    where = kept if kept.exists() else f"{run.cfg.policy.resolved()} (the starting weights)"
    return TrainingError(f"{exc}; stopped. Last good checkpoint: {where}")


def check_weights(run: Run, step: int) -> None:
    """Stop the run when an update left any weight NaN or infinite (nothing non-finite is ever saved)."""
    name = nonfinite_parameter(run.learner.model)
    if name is not None:
        raise TrainingError(f"step {step}: weight {name} is not finite after the update (optim.lr="
                            f"{run.cfg.optim.lr:g}; lower optim.lr or optim.grad_clip)")


def _checkpoint(run: Run) -> None:
    check_weights(run, run.state.step)
    st = run.state
    st.learner_updates, st.last_grad_norm = run.learner.updates, run.learner.last_grad_norm
    st.stream_epoch, st.stream_pos = run.stream.epoch, run.stream.pos
    st.initial_eval = {k: asdict(v) for k, v in run.initial.items()}
    st.file_sizes = file_sizes(run.out, output_files(run.out))
    st.elapsed_s = time.perf_counter() - run.t_start
    save_run_checkpoint(RunDir(run.out).checkpoints, run.learner.model, run.learner.opt, st,
                        run.planner.predictor if run.planner is not None else None, tokenizer=run.stages.env.tok,
                        critic=run.stages.critic)


def _finish(run: Run) -> dict:
    cfg, out = run.cfg, run.out
    try:
        check_weights(run, run.state.step)  # in the runtime modes the learner was brought up to date on close
    except TrainingError as exc:
        raise _stopped(run, exc) from None
    run.traces.close()
    if not (cfg.train.checkpoint_every and cfg.train.steps % cfg.train.checkpoint_every == 0):
        _checkpoint(run)  # a finished run can be extended: --resume train.steps=<more>
    final_dir, tmp = RunDir(out).checkpoint("final"), RunDir(out).checkpoint("final.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # written beside, then renamed: a full disk never leaves a half-written `final`
        save_checkpoint(run.learner.model, tmp, {"step": cfg.train.steps}, tokenizer=run.stages.env.tok)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final_dir, ignore_errors=True)
    tmp.rename(final_dir)
    final = run_eval(run.learner.model, run.eval_prompts, cfg, run.stages.env, run.progress)
    if final:
        run.tracker.log(_eval_metrics(final), step=cfg.train.steps)
    summary = _summary(cfg, run.initial, final, run.state.rewards, time.perf_counter() - run.t_start, out,
                       run.tracker)
    if run.runtime_summary:
        summary["runtime"] = run.runtime_summary
    if run.planner is not None:  # what the planner did: cuts kept (and why not), the predictor's ranking per step
        rows = RunDir(out).read_metrics()
        summary.update(cuts=cut_report(rows), predictor_kendall_tau=tau_per_step(rows))
    run.tracker.summary(summary)
    run.tracker.finish()
    write_json(summary, RunDir(out).summary)
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
            index = {id(j): g for g, j in enumerate(report.plan.jobs)}
            tracker.table("assignment", ["actor", "group", "prompt_id", "n_seqs", "predicted_len"],
                          [[a, index[id(j)], j.group_id, j.n_seqs, j.tokens / j.n_seqs]
                           for a, jobs in enumerate(report.plan.decision.plan.actor_jobs) for j in jobs],
                          report.step)
        if report.invocations:
            cols = list(report.invocations[0])
            tracker.table("invocations", cols, [[json.dumps(v) if isinstance(v, (dict, list)) else v
                                                 for v in r.values()] for r in report.invocations], report.step)


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
        "eval_samples_per_prompt": eval_samples(cfg),
        "eval_accuracy_initial": acc(initial, "sampled"),
        "eval_accuracy_final": acc(final, "sampled"),
        "eval_greedy_accuracy_initial": acc(initial, "greedy"),
        "eval_greedy_accuracy_final": acc(final, "greedy"),
        "eval_accuracy_per_k_initial": {str(k): v for k, v in initial["sampled"].per_k.items()} if initial else {},
        "eval_accuracy_per_k_final": {str(k): v for k, v in final["sampled"].per_k.items()} if final else {},
        "reward_mean_first": sum(rewards[:k]) / k,
        "reward_mean_last": sum(rewards[-k:]) / k,
        "wall_s": round(wall_s, 1),
        "trace_path": str(RunDir(out).trace),
        "wandb_dir": tracker.wandb_dir,
        "seed": cfg.train.seed,
    }
