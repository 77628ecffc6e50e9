"""The run configuration: one typed dataclass per part, loaded from YAML with dotted `key=value` overrides.

`load_run_config("experiments/configs/quickstart.yaml", ["algo.group_size=4"])` -> `RunConfig`. A YAML file may
name `defaults: other.yaml` (relative to itself) to inherit and override. Unknown keys, wrong types and
out-of-range values raise `ConfigError` naming the field before any work starts. Each default lives in exactly one
place: the dataclass field.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from rlhfless.algo.config import GRPOConfig
from rlhfless.configbase import build_config, load_yaml, merge
from rlhfless.devices import check_device, resolve_device, syntax_problem, wants_cuda
from rlhfless.errors import ConfigError, require
from rlhfless.plan.config import PlanConfig
from rlhfless.predictor.config import PredictorConfig
from rlhfless.runtime.config import RuntimeConfig
from rlhfless.tasks.config import TaskConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = "data/checkpoints/sft"


@dataclass
class PolicyConfig:
    """Which weights the policy starts from."""

    checkpoint: str = DEFAULT_CHECKPOINT
    """Checkpoint folder: the shipped tiny model (byte tokenizer, from `rlhfless pretrain`) or any local Hugging
    Face causal-LM folder (config.json, safetensors, its tokenizer files); relative paths resolve against the repo
    root, then the cwd. Nothing is downloaded."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Wrap each task prompt in the tokenizer's chat template as a user turn: auto = when the checkpoint has one."""
    build: Literal["none", "tiny-bpe"] = "none"
    """When `checkpoint` does not exist: none = error; tiny-bpe = build a small random-initialised Qwen2 model with
    a BPE tokenizer trained on the task's texts there first (`rlhfless build-hf-model`), then use it."""
    build_sft_steps: int = 0
    """With policy.build=tiny-bpe: supervised warm-start steps on the train split's worked solutions before the
    folder is saved (the GSM8K task has them), so GRPO starts from a model that sometimes earns a reward."""

    def __post_init__(self) -> None:
        require(self.chat_template in ("auto", "on", "off"), "policy.chat_template",
                f"must be auto, on or off (got {self.chat_template!r})")
        require(self.build in ("none", "tiny-bpe"), "policy.build", f"must be none or tiny-bpe (got {self.build!r})")
        require(self.build_sft_steps >= 0, "policy.build_sft_steps", f"must be >= 0 (got {self.build_sft_steps})")

    def resolved(self) -> Path:
        p = Path(self.checkpoint)
        if p.is_absolute() or p.exists():
            return p
        return REPO_ROOT / p


@dataclass
class RolloutConfig:
    """Sampling of B prompts x G responses per step (G is `algo.group_size`)."""

    prompts_per_step: int = 32
    """B: prompts per step."""
    max_new_tokens: int = 192
    """Response cap in tokens (EOS included); longer responses are truncated and get reward 0."""
    temperature: float = 1.0
    """Sampling temperature (> 0 for training; the eval uses it too)."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]."""
    dedup_prefill: bool = True
    """Compute each shared prompt prefix once (the paper's deduplicated prefill); False = naive prefill."""
    reuse_prefix_forward: bool = True
    """Learner and reference forward passes run each prompt once per group and reuse its KV for the G responses."""
    engine: Literal["own", "vllm"] = "own"
    """Training rollout engine: own (this project's) or vllm (the optional extra in its own venv, `make test-vllm`;
    given the learner's weights every step: inline, or in every decode worker of the runtime modes; greedy equals
    own, sampled tokens come from vLLM's random streams, and a migrated row continues from a new stream, so
    serverless and serverful samples agree only without migration). The held-out eval always uses the own engine."""

    def __post_init__(self) -> None:
        require(self.engine in ("own", "vllm"), "rollout.engine", f"must be own or vllm (got {self.engine!r})")
        require(self.prompts_per_step >= 1, "rollout.prompts_per_step", f"must be >= 1 (got {self.prompts_per_step})")
        require(self.max_new_tokens >= 1, "rollout.max_new_tokens", f"must be >= 1 (got {self.max_new_tokens})")
        require(self.temperature > 0, "rollout.temperature", f"must be > 0 (got {self.temperature})")
        require(0 < self.top_p <= 1, "rollout.top_p", f"must be in (0, 1] (got {self.top_p})")


@dataclass
class OptimConfig:
    """AdamW for the learner."""

    lr: float = 1e-4
    """Learning rate (> 0); 1e-4 measured best for the tiny model (2e-4 worse, 5e-5 flat)."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (> 0)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup steps (>= 0)."""

    def __post_init__(self) -> None:
        # above 10 AdamW moves every weight by more than its scale per step; past 3.4e38 torch cannot even hold it
        require(0 < self.lr <= 10, "optim.lr", f"must be in (0, 10] (got {self.lr})")
        require(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0 (got {self.weight_decay})")
        require(self.grad_clip > 0, "optim.grad_clip", f"must be > 0 (got {self.grad_clip})")
        require(self.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0 (got {self.warmup_steps})")


@dataclass
class CriticConfig:
    """PPO's value model (`rlhfless.critic`) and its own AdamW; unused with algo.name=grpo."""

    checkpoint: str | None = None
    """Folder whose causal LM's trunk the critic starts from (a scalar head replaces its LM head); None = the
    policy's starting checkpoint (policy.checkpoint, the SFT model). Any policy folder works, e.g. a smaller one."""
    lr: float = 1e-3
    """Critic learning rate (> 0); its head starts at zero, so it needs more than the policy's."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip of the critic (> 0)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup in critic updates (>= 0)."""
    values_chunk: int = 0
    """Sequences per value-forward chunk, rounded down to whole groups (at least one); 0 = the whole batch in one
    forward. Chunks are fixed by group index and computed alike in every mode, so with a chunk size the runtime's
    value function can take each chunk while the rest of the step decodes (runtime.overlap) and still give the
    same values to the last bit. 8 was the fastest here (0.23 s against 0.34 s for 64 sequences in one forward,
    one thread: less padding); 0 keeps the earlier measurements' numbers exact."""

    def __post_init__(self) -> None:
        require(isinstance(self.values_chunk, int) and self.values_chunk >= 0, "critic.values_chunk",
                f"must be an integer >= 0 (got {self.values_chunk!r})")
        require(0 < self.lr <= 10, "critic.lr", f"must be in (0, 10] (got {self.lr})")
        require(self.weight_decay >= 0, "critic.weight_decay", f"must be >= 0 (got {self.weight_decay})")
        require(self.grad_clip > 0, "critic.grad_clip", f"must be > 0 (got {self.grad_clip})")
        require(self.warmup_steps >= 0, "critic.warmup_steps", f"must be >= 0 (got {self.warmup_steps})")

    def resolved(self, policy_checkpoint: Path) -> Path:
        """The trunk's folder: `checkpoint` (repo root, then cwd, like policy.checkpoint), else the policy's."""
        return PolicyConfig(checkpoint=self.checkpoint).resolved() if self.checkpoint else policy_checkpoint


@dataclass
class TrainConfig:
    """Length of the run, evaluation and checkpoints."""

    steps: int = 400
    """GRPO steps."""
    seed: int = 0
    """Seeds prompt order and sampling."""
    threads: int = 2
    """torch threads."""
    device: str = "cpu"
    """Where the inline loop's models run (policy, learner, reference, evaluation): cpu, cuda (= cuda:0), cuda:k,
    or auto (cuda:0 when torch sees a CUDA device, else cpu). cpu by default so a config gives the same samples on
    every machine; a CUDA setting on a machine without one fails before any work (rlhfless.devices)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights, KV cache and activations: float32 or bfloat16 (sampling, log-probs and the loss stay float32;
    checkpoints are written as float32 either way)."""
    eval_prompts: int | None = None
    """Held-out prompts for the initial and final evaluation: the first N of the task's held-out split (0 = skip;
    None = the whole split; more than the split holds is refused, never cut silently)."""
    eval_samples: int | None = None
    """Sampled responses per held-out prompt for eval/accuracy (>= 1); None = algo.group_size. Set it when
    comparing runs of different G (PPO's G = 1 makes a noisy estimate)."""
    eval_greedy: bool = True
    """Also report greedy accuracy on the held-out prompts."""
    eval_every: int = 0
    """Evaluate every N steps in between (0 = only at start and end)."""
    table_every: int = 50
    """Log a table of sample completions every N steps (0 = never)."""
    checkpoint_every: int = 100
    """Save the policy every N steps (0 = only at the end); the last good checkpoint survives a NaN."""
    plan: bool = True
    """Run the planner every step (predict lengths, choose N actors and the assignment) and log its decisions."""

    def __post_init__(self) -> None:
        require(self.steps >= 1, "train.steps", f"must be >= 1 (got {self.steps})")
        require(self.threads >= 1, "train.threads", f"must be >= 1 (got {self.threads})")
        problem = syntax_problem(self.device)
        require(problem is None, "train.device", problem or "")
        require(self.eval_prompts is None or self.eval_prompts >= 0, "train.eval_prompts",
                f"must be >= 0 or null (got {self.eval_prompts})")
        # seeds feed random.Random strings and torch.manual_seed, which refuses negatives only deep in a run
        require(self.seed >= 0, "train.seed", f"must be >= 0 (got {self.seed})")
        require(self.eval_samples is None or self.eval_samples >= 1, "train.eval_samples",
                f"must be >= 1 or null (got {self.eval_samples})")
        for name in ("eval_every", "table_every", "checkpoint_every"):
            require(getattr(self, name) >= 0, f"train.{name}", f"must be >= 0 (got {getattr(self, name)})")


@dataclass
class TrackingConfig:
    """Weights & Biases logging (offline by default: files under the run dir, `wandb sync` later)."""

    mode: Literal["offline", "online", "disabled"] = "offline"
    """offline (default), online, or disabled."""
    project: str = "rlhfless"
    """W&B project name."""
    name: str | None = None
    """Run name (default: the output folder's name)."""
    group: str | None = None
    """Run group, e.g. one ablation."""


@dataclass
class RunConfig:
    """Everything one `rlhfless train` run needs."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def check_machine(self) -> None:
        """Reject, before any work, a setting this machine cannot run: the runtime's units and devices, and the
        inline loop's device (one line naming the field; every entry point and `--dry-run` call this).

        plan.max_actors above the units of a serverless or compare run is capped at the units, with one line
        saying so (the scaler could never start more decode functions than there are units; a config sized for
        a larger machine then still runs here as written)."""
        units = self.runtime.resolved_units() if self.runtime.mode in ("serverless", "compare") else None
        cap = units if units is not None and self.plan.max_actors > units else None
        self.runtime.check_machine(self.plan.max_actors if cap is None else cap, compare_dp=self.algo.name == "grpo")
        if cap is not None:  # after the runtime's own checks: a machine it refuses is named first
            self._cap_actors(cap)
        check_device(self.train.device, "train.device")
        # train.device=auto passes __post_init__'s check and may only resolve to a GPU here
        require(self.algo.name != "ppo" or resolve_device(self.train.device).type == "cpu", "train.device",
                f"{self.train.device} resolves to a GPU here, and PPO runs on the CPU only for now; use "
                "train.device=cpu")
        if self.algo.name == "ppo" and self.runtime.mode in ("serverless", "compare"):
            units = self.runtime.resolved_units()
            require(units >= 2, "runtime.units", f"PPO's actor and critic functions run side by side: at least 2 "
                    f"units (got {units}); use runtime.mode=serverful or inline on one unit")

    def _cap_actors(self, units: int) -> None:
        require(self.plan.min_actors <= units, "plan.min_actors", f"serverless decode functions need one unit each: "
                f"at most runtime.units={units} (got {self.plan.min_actors}); lower it or raise runtime.units")
        print(f"rlhfless: plan.max_actors={self.plan.max_actors} capped at runtime.units={units} (one unit per "
              "serverless decode function)", file=sys.stderr)
        self.plan = replace(self.plan, max_actors=units)

    def __post_init__(self) -> None:
        if self.runtime.mode in ("serverless", "compare"):
            require(self.train.plan, "train.plan", f"runtime.mode={self.runtime.mode} executes the planner's "
                    "decision, so the planner must run: set train.plan=true")
        require(self.plan.capacity >= self.algo.group_size, "plan.capacity",
                f"must hold one group: >= algo.group_size={self.algo.group_size} (got {self.plan.capacity})")
        # vLLM prefills inside its own engine (prefix cache): the prefill function's shipped KV cannot enter it
        require(self.rollout.engine == "own" or self.runtime.ship_prefix_kv != "always", "runtime.ship_prefix_kv",
                "always ships the prefill function's KV to the decode functions, which rollout.engine=vllm cannot "
                "take (vLLM prefills with its own prefix cache); use never or auto (auto never ships with vllm)")
        if self.algo.name == "ppo":
            # the critic, the values and the PPO targets are never moved to a GPU yet: refused, not a device error
            # mid-run (docs/ppo.md, "Not built yet")
            for name, spec in (("train.device", self.train.device), ("runtime.device", self.runtime.device)):
                require(not wants_cuda(spec), name, f"PPO runs on the CPU only for now (got {name}={spec}); use "
                        f"{name}=cpu")
        if self.algo.name == "ppo" and self.runtime.executes:
            self._check_ppo_runtime()
        if self.runtime.executes:
            # workers would hold bfloat16 replicas and all-reduce bfloat16 gradients through gloo: never run yet
            require(self.train.dtype == "float32", "train.dtype",
                    f"bfloat16 runs inline only for now (got runtime.mode={self.runtime.mode}); use train.dtype=float32")
            # the runtime's learner accumulates one pass over the step's groups (rlhfless.accumulate)
            require(self.algo.inner_epochs == 1, "algo.inner_epochs",
                    f"must be 1 with runtime.mode={self.runtime.mode}: the runtime's learner takes one pass over "
                    f"the step's groups as they finish (got {self.algo.inner_epochs}); use runtime.mode=inline")
        if self.algo.max_seq_len_norm is not None:
            require(self.algo.max_seq_len_norm >= self.rollout.max_new_tokens, "algo.max_seq_len_norm",
                    f"must be >= rollout.max_new_tokens={self.rollout.max_new_tokens}")

    def _check_ppo_runtime(self) -> None:
        """What the runtime's PPO (`runtime.ppo_stages`) does not do."""
        rt = self.runtime
        require(rt.overlap is not True or self.critic.values_chunk > 0, "runtime.overlap",
                "with PPO only the value forward can run while the rest decodes (its update whitens advantages "
                "over the whole batch), and only in chunks: set critic.values_chunk (e.g. 8), or runtime.overlap "
                "null (auto) or false")
        require(rt.learner_units <= 1, "runtime.learner_units",
                f"PPO's actor and critic run as one rank each for now (got {rt.learner_units}); leave it 0")


def _load_with_defaults(path: Path, depth: int = 0) -> dict:
    require(depth < 8, "defaults", f"{path}: 'defaults' chain is too deep (a cycle?)")
    data = load_yaml(path)
    parent = data.pop("defaults", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'defaults' must be a file name")
    return merge(_load_with_defaults(path.parent / parent, depth + 1), data)


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Build a validated `RunConfig` from a YAML file (or the defaults) plus dotted overrides."""
    data = _load_with_defaults(Path(path)) if path else {}
    return build_config(RunConfig, data, overrides or [], source=path)
