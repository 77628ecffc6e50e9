"""The checks a run makes before its first step, and `train --dry-run`, which makes them without importing torch.

`runner` calls the torch-free checks here as it sets a run up (`held_out`, `check_fits_context`, `ensure_policy`,
`plan_config`); `dry_run` makes every one of them in the run's order, with the run's own refusals, but reads the
checkpoints' files instead of loading models (issue 42: a dry run is a check, and torch alone costs seconds):
* a byte checkpoint (the policy, a resumed run's `checkpoints/last`, PPO's critic trunk, the reference) through
  `factory.check_policy`: config.json, the safetensors header, every tensor finite (numpy), the checks
  `load_policy` makes, raised by the same functions;
* a resumed PPO run's critic state through `critic_files.check_state`; the vocabulary match of critic and policy;
* the planner, a resumed run's predictor, the task's splits, the held-out count, the context fit (the context
  from config.json's max_position_embeddings and the tokenizer's limit, as `context_of` takes it).
Where only transformers or torch can judge (a Hugging Face folder: transformers 5 imports torch to read even its
config and tokenizer; a byte checkpoint whose files are not as rlhfless writes them; a critic state numpy cannot
read), the dry run loads that part for real, as the run would, so a refusal is always the run's own line.
Deviations from the run: `policy.build` building the policy folder first is a real action the run would take
first, and imports torch (its progress phase says so). A resumed run's optimizer and generator files are checked
as `runner._resume` checks them, then its records (`runfolder.check_outputs`); not checked: the initial
evaluation kept in its state.json (`runner._initial_eval`, which needs the evaluation's types).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rlhfless.core.errors import ConfigError, DataError, quote

if TYPE_CHECKING:
    from rlhfless.config import RunConfig
    from rlhfless.core.records import Prompt
    from rlhfless.step.textenv import TextEnv

BUILD_PHASE = "build the policy folder (imports torch)"


def plan_config(cfg: RunConfig):
    """The planner prices with the rules the runtime's meter bills with (one set of billing rules), so its
    predicted device-seconds (`plan/predicted_device_s`) can be read beside the billed ones every step."""
    if not cfg.runtime.executes:
        return cfg.plan
    from rlhfless.runtime.meter import billing_rules

    return replace(cfg.plan, billing=billing_rules(cfg.runtime, decode=not cfg.plan.learner.whole_step))


def held_out(split: list[Prompt], n: int | None, task: str) -> list[Prompt]:
    """The first `n` prompts of the held-out `split` (all when None); more than it holds is refused, not cut."""
    if n is not None and n > len(split):
        raise ConfigError(f"train.eval_prompts: the {task} task's held-out split has {len(split)} prompts (got "
                          f"{quote(n)}); set at most {len(split)}, null for all of them, or 0 to skip the evaluation")
    return split if n is None else split[:n]


def context_of(policy, env: TextEnv) -> int:
    """Longest sequence the policy may see: the model's positions, or less where the tokenizer says so."""
    return context_limit(int(policy.config.max_position_embeddings), env)


def context_limit(max_positions: int, env: TextEnv) -> int:
    """`context_of` from config.json's max_position_embeddings."""
    return min(max_positions, env.tok.max_length) if env.tok.max_length else max_positions


def check_fits_context(prompts: list[Prompt], cfg: RunConfig, context: int, env: TextEnv) -> None:
    """The longest prompt plus rollout.max_new_tokens must fit the model's context (fail before any work)."""
    longest, worst = max((len(env.encode(p)), p.prompt_id) for p in prompts)
    if longest >= context:  # no count of new tokens fits: say so, never a negative "at most"
        raise ConfigError(
            f"task.{cfg.task.name}: the longest prompt ({worst}) has {longest} tokens, the checkpoint's whole context "
            f"of {context} or more, so no response fits; make the task's prompts shorter (task.{cfg.task.name}.*) "
            "or use a checkpoint with a longer context (policy.checkpoint)")
    if longest + cfg.rollout.max_new_tokens > context:
        raise ConfigError(
            f"rollout.max_new_tokens: the longest prompt ({worst}) has {longest} tokens, so at most "
            f"{context - longest} new tokens fit the checkpoint's context of {context} (got "
            f"{cfg.rollout.max_new_tokens}); lower rollout.max_new_tokens, or make the task's prompts shorter "
            f"(task.{cfg.task.name}.*)")


def placed(cfg: RunConfig, model):
    """`model` on `train.device` in `train.dtype` (the same object on cpu/float32, the default)."""
    from rlhfless.core.devices import place, resolve_device, resolve_dtype

    return place(model, resolve_device(cfg.train.device), resolve_dtype(cfg.train.dtype))


def must_build(cfg: RunConfig) -> bool:
    """Whether `ensure_policy` builds the policy folder (it is missing and `policy.build` says how)."""
    return cfg.policy.build != "none" and not (cfg.policy.resolved() / "config.json").is_file()


def ensure_policy(cfg: RunConfig, progress: bool = True) -> None:
    """Build the policy folder first when it is missing and `policy.build` says how (see `PolicyConfig.build`)."""
    if not must_build(cfg):
        return
    from rlhfless.model.hf import TinyHFConfig, ensure_tiny_hf
    from rlhfless.tasks.config import corpus_problem, tokenizer_corpus

    path = cfg.policy.resolved()
    why = corpus_problem(cfg.task)
    if why:  # before announcing a build that cannot start
        raise DataError(why)
    label = cfg.task.gsm8k.path if cfg.task.name == "gsm8k" else None
    print(f"rlhfless: building the policy {path} (policy.build={cfg.policy.build})", file=sys.stderr)
    after = (lambda folder: _warm_start(cfg, folder, progress)) if cfg.policy.build_sft_steps else None
    # the corpus is read only when the folder must be built
    ensure_tiny_hf(path, lambda: tokenizer_corpus(cfg.task), TinyHFConfig(seed=cfg.train.seed), label=label,
                   after=after)


def _warm_start(cfg: RunConfig, folder: Path, progress: bool) -> dict:
    """Supervised warm start of a freshly built policy folder on the task's train solutions (`model.warmstart`)."""
    import torch

    from rlhfless.model.factory import load_policy
    from rlhfless.run.warmstart import WarmStartConfig, solution_pairs, warm_start
    from rlhfless.step.textenv import make_env

    torch.set_num_threads(cfg.train.threads)
    model = load_policy(folder)
    env = make_env(cfg, folder)
    pairs = solution_pairs(env, env.task.splits()[0], context_of(model, env))
    done = warm_start(model, pairs, WarmStartConfig(steps=cfg.policy.build_sft_steps, seed=cfg.train.seed), progress)
    model.save_pretrained(folder, safe_serialization=True)
    print(f"rlhfless: warm start: {done}", file=sys.stderr)
    return {"warm_start": done}


# --- the dry run ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checked:
    """What a checked checkpoint folder tells the later checks."""

    vocab_size: int
    max_positions: int
    raw: dict | None
    """config.json as `factory.check_policy` checked it; None where the folder was loaded for real."""


def check_checkpoint(path: Path) -> Checked:
    """`load_policy(path)`'s checks: torch-free for a byte checkpoint rlhfless wrote, else the real load."""
    from rlhfless.model.factory import check_policy

    raw = check_policy(path)
    if raw is not None:
        return Checked(int(raw["vocab_size"]), int(raw["max_position_embeddings"]), raw)
    from rlhfless.model.factory import load_policy

    model = load_policy(path)
    return Checked(int(model.config.vocab_size), int(model.config.max_position_embeddings), None)


def dry_run(cfg: RunConfig, out: str | None, resume: bool, allow_config_change: bool,
            progress: bool) -> tuple[list[Prompt], list[Prompt]]:
    """Every check `train` makes before its first step, in its order and with its refusals, writing nothing;
    returns the (train, held-out) prompts. The policy folder is built first when `policy.build` says so, as the run
    would (the one part that imports torch, named in the progress phase)."""
    from rlhfless.core.progress import phases
    from rlhfless.run.inputs import check_inputs
    from rlhfless.run.runfolder import check_outputs_of, check_resume

    checkpoint = BUILD_PHASE if must_build(cfg) else "checkpoint"
    names = ["machine", "planner, input files"] + (["run folder"] if resume and out else []) + [
        checkpoint, "critic, reference, task"]
    with phases(names, "dry-run checks", progress) as step:
        step("machine")
        cfg.check_machine()
        step("planner, input files")
        check_inputs(cfg)  # the emulated length table, the time profile and the predictor, as `train` checks them
        ckpt = state = None
        if resume and out:
            step("run folder")
            ckpt, state = check_resume(cfg, Path(out), allow_config_change)
        step(checkpoint)
        ensure_policy(cfg, progress)
        policy = check_checkpoint(ckpt or cfg.policy.resolved())  # a resumed run starts from its own checkpoint
        step("critic, reference, task")
        prompts = _parts(cfg, policy, ckpt)
        if ckpt is not None:  # then `runner._resume`'s own checks: the optimizer, the generator, the records
            _check_tensor_files(cfg, policy, ckpt, state)
            check_outputs_of(Path(out), state)
    return prompts


def _parts(cfg: RunConfig, policy: Checked, ckpt: Path | None) -> tuple[list[Prompt], list[Prompt]]:
    """`runner.build_parts`' checks: the critic (trunk, vocabulary, a resumed run's state), the reference, the
    planner and a resumed run's predictor, the task's splits, the held-out count and the context fit."""
    start = cfg.policy.resolved()
    if cfg.algo.name == "ppo":
        _check_critic(cfg, policy, ckpt)
    if cfg.algo.kl_coef > 0 and ckpt is not None:  # the reference is the starting policy (checked above otherwise)
        check_checkpoint(start)
    if cfg.train.plan:
        from rlhfless.step.planner import Planner

        Planner(cfg.predictor, plan_config(cfg))
        if ckpt is not None:
            from rlhfless.predictor import load_predictor

            load_predictor(ckpt / "predictor")
    from rlhfless.step.textenv import make_env

    env = make_env(cfg)
    train_prompts, eval_prompts = env.task.splits()
    eval_prompts = held_out(eval_prompts, cfg.train.eval_prompts, cfg.task.name)
    if cfg.runtime.device != "emulated":  # emulated workers model another model's context; the checkpoint's is moot
        check_fits_context(train_prompts + eval_prompts, cfg, context_limit(policy.max_positions, env), env)
    return train_prompts, eval_prompts


def _check_tensor_files(cfg: RunConfig, policy: Checked, ckpt: Path, state) -> None:
    """`restore_optimizer` and `read_rng` of a resumed run: torch-free where the files allow, else for real."""
    from rlhfless.run.runfolder import check_tensor_files

    if policy.raw is not None:
        from rlhfless.model.factory import expected_tensors

        if check_tensor_files(ckpt, state, list(expected_tensors(policy.raw).values())):
            return
    from rlhfless.learn.learner import Learner
    from rlhfless.model.factory import load_policy
    from rlhfless.run.runstate import read_rng, restore_optimizer

    learner = Learner(placed(cfg, load_policy(ckpt)), cfg.optim, cfg.algo)
    restore_optimizer(learner.opt, ckpt, state.optimizer_groups)
    read_rng(ckpt)


def _check_critic(cfg: RunConfig, policy: Checked, ckpt: Path | None) -> None:
    """`critic.load_critic` and, resuming, `load_critic_state`: their refusals, torch-free where the files allow."""
    from rlhfless.learn import critic_files

    path = critic_files.trunk_folder(cfg.critic.checkpoint, cfg.critic.resolved(cfg.policy.resolved()))
    trunk = check_checkpoint(path)
    critic_files.check_vocab(path, trunk.vocab_size, policy.vocab_size)
    if ckpt is None:
        return
    state = ckpt / critic_files.STATE_FILE
    if trunk.raw is not None and critic_files.check_state(state, critic_files.value_model_shapes(trunk.raw)):
        return
    from rlhfless.learn.critic import load_critic, load_critic_state  # what only torch can judge: the real load

    load_critic_state(load_critic(cfg.critic, cfg.policy.resolved(), policy.vocab_size), state)


__all__ = ["BUILD_PHASE", "Checked", "check_checkpoint", "check_fits_context", "context_limit", "context_of",
           "dry_run", "ensure_policy", "held_out", "must_build", "placed", "plan_config"]
