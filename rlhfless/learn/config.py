"""The learner's and the critic's settings (the `optim:` and `critic:` sections of a run config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhfless.core.errors import require
from rlhfless.core.outpaths import repo_path


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
    """PPO's value model (`rlhfless.learn.critic`) and its own AdamW; unused with algo.name=grpo."""

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
        return repo_path(self.checkpoint) if self.checkpoint else policy_checkpoint
