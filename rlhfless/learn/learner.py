"""The learner: one GRPO update of the policy from a scored rollout batch (model + optimiser, math in `algo`).

Deviation from a literal reading of "old log-probs recomputed": with `algo.inner_epochs == 1` the sampling
policy and the policy being updated are the same weights, so the old log-probs are the detached log-probs of the
update's own forward pass (bitwise identical to a separate no-grad pass, one forward cheaper). With more inner
epochs they are recomputed once, before the first update, under `torch.no_grad()`.
Groups whose G rewards are all equal carry no signal; they are dropped before the forward pass, not masked after.

Data parallelism (`update(..., shard=Shard)`, see `rlhfless.learn.dataparallel`): advantages and the group filter run on
the full batch on every rank; rank r trains the r-th contiguous chunk of the kept groups (`split_groups`, balanced
by response tokens + G per group), with the full batch's loss normaliser; gradients are summed across ranks before
clipping and every rank steps its own AdamW, so replicas stay bitwise equal and match the single-process update up
to float rounding. `save_learner_state` / `load_learner_state` hand the whole learner (weights, AdamW state,
counters) between processes as one safetensors file, never pickle.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from rlhfless.core import metrics as M
from rlhfless.algo import GRPOConfig, advantage_estimator, grpo_loss
from rlhfless.learn.config import OptimConfig
from rlhfless.learn.dataparallel import POLICY_ROW, RowLayout, Shard, reduce_step, split_groups
from rlhfless.core.errors import DataError, TrainingError
from rlhfless.rollout.forward import response_logprobs


class Learner:
    """Owns the trainable policy and its AdamW state."""

    def __init__(self, model, optim: OptimConfig, algo: GRPOConfig, reuse_prefix: bool = True):
        self.model = model
        self.reuse_prefix = reuse_prefix
        self.algo = algo
        self.optim_cfg = optim
        self.opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
        self.updates = 0
        """Optimizer steps taken or skipped (a batch without reward variance still counts: warm-up is per step)."""
        self.last_grad_norm: float | None = None

    def _lr(self) -> float:
        w = self.optim_cfg.warmup_steps
        return self.optim_cfg.lr * min(1.0, (self.updates + 1) / w) if w else self.optim_cfg.lr

    def update(self, prompts: list[list[int]], responses: list[list[int]], rewards: torch.Tensor,
               ref_logp: torch.Tensor | None = None, shard: Shard | None = None) -> dict[str, float]:
        """One GRPO update. prompts: B token lists; responses: B*G (group-major); rewards: [B*G].

        ref_logp: [B*G, T] reference log-probs (needed when algo.kl_coef > 0).
        shard: this rank of a data-parallel group, every rank passing the SAME full batch (None: one process).
            Every rank returns the same full-batch metrics and ends with the same weights.
        Raises TrainingError on a non-finite loss or gradient, before the optimiser step (on every rank alike).
        """
        G = self.algo.group_size
        adv, metrics = advantage_estimator(self.algo.estimator).fn(rewards, G, self.algo)
        keep_groups = (~adv.zero_variance).nonzero().squeeze(-1).tolist()
        if self.algo.skip_zero_variance_groups:
            if not keep_groups:
                lr = self._lr()
                self.updates += 1
                return {**metrics, M.LR: lr}
        else:
            keep_groups = list(range(len(prompts)))
        denom = None
        if shard is not None:
            denom = batch_denominator([len(responses[g * G + s]) for g in keep_groups for s in range(G)],
                                 self.algo.loss_agg)
            weights = [sum(len(responses[g * G + s]) + 1 for s in range(G)) for g in keep_groups]
            lo, hi = split_groups(weights, shard.world)[shard.rank]
            keep_groups = keep_groups[lo:hi]
        rows = [g * G + s for g in keep_groups for s in range(G)]
        sub_prompts = [prompts[g] for g in keep_groups]
        sub_resp = [responses[r] for r in rows]
        dev = next(self.model.parameters()).device  # the loss runs where the model is; advantages come from the CPU
        sub_adv = adv.advantages[rows].to(dev)
        sub_ref = ref_logp[rows].to(dev) if ref_logp is not None else None
        old = None
        if self.algo.inner_epochs > 1 and rows:
            with torch.no_grad():
                old = response_logprobs(self.model, sub_prompts, sub_resp, G, reuse_prefix=self.reuse_prefix).logp
        for g in self.opt.param_groups:
            g["lr"] = self._lr()
        for _ in range(self.algo.inner_epochs):
            loss, m, n_tok = None, {}, 0
            if rows:  # a rank whose chunk is empty still joins the all-reduce below, with zeros
                out = response_logprobs(self.model, sub_prompts, sub_resp, G, with_entropy=True,
                                        reuse_prefix=self.reuse_prefix)
                mask = out.mask.bool()
                ref = sub_ref[:, : out.logp.shape[1]] if sub_ref is not None else None
                loss, m = grpo_loss(out.logp, out.logp.detach() if old is None else old, ref, sub_adv, mask,
                                    self.algo, entropy=out.entropy, denom=denom)
                n_tok = int(mask.sum().item())
            if shard is None:
                self._step(loss)
            else:
                m = self.step_shard(loss, m, n_tok, shard, with_kl=ref_logp is not None)
            metrics.update(m)
        metrics[M.GRAD_NORM] = self.last_grad_norm
        metrics[M.LR] = self._lr()
        self.updates += 1
        return metrics

    def lr_for_update(self) -> float:
        """Set this update's learning rate (warm-up counts updates) on the optimizer and return it."""
        lr = self._lr()
        for g in self.opt.param_groups:
            g["lr"] = lr
        return lr

    def step_loss(self, loss: torch.Tensor) -> None:
        """Backward `loss`, clip, step (one optimiser step of an update driven from outside, e.g. `ppo.ppo_update`);
        raises TrainingError on a non-finite loss or gradient norm before stepping."""
        self._step(loss)

    def _step(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise TrainingError(f"non-finite loss ({loss.item()}) at update {self.updates}")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
        if not math.isfinite(norm.item()):
            raise TrainingError(f"non-finite gradient norm at update {self.updates}")
        self.last_grad_norm = norm.item()
        self.opt.step()

    def step_shard(self, loss: torch.Tensor | None, local: dict[str, float], n_tok: int, shard: Shard,
                   with_kl: bool, layout: RowLayout = POLICY_ROW) -> dict[str, float]:
        """Backward this rank's share, all-reduce gradients + metrics, then clip and step like `_step`."""
        self.opt.zero_grad(set_to_none=True)
        if loss is not None:
            # a non-finite local loss is not raised here: the other ranks would wait in the all-reduce until
            # their timeout; it poisons the summed loss instead, so every rank raises below
            loss.backward()
        return self.step_reduced(local, n_tok, shard, with_kl, layout)

    def step_reduced(self, local: dict[str, float], n_tok: int, shard: Shard, with_kl: bool,
                     layout: RowLayout = POLICY_ROW) -> dict[str, float]:
        """All-reduce the gradients already in .grad (+ this rank's metric row), then clip and step like `_step`
        (also the end of `accumulate.AccumulatedUpdate`)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        metrics = reduce_step(params, shard, local, n_tok, with_kl, layout)
        if not math.isfinite(metrics[M.LOSS]):
            raise TrainingError(f"non-finite loss ({metrics[M.LOSS]}) at update {self.updates}")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
        if not math.isfinite(norm.item()):
            raise TrainingError(f"non-finite gradient norm at update {self.updates}")
        self.last_grad_norm = norm.item()
        self.opt.step()
        return metrics


def batch_denominator(lengths: list[int], mode: str) -> float:
    """`algo.grpo.loss_denominator` of the full kept batch from its response lengths (no mask needed)."""
    n = sum(lengths) if mode == "token_mean" else sum(1 for n in lengths if n > 0)
    return float(max(n, 1))


# --- hand-off between processes ---------------------------------------------------------------------------
STATE_FORMAT = "rlhfless-learner-state"
STATE_VERSION = "1"


def save_learner_state(learner: Learner, path: Path | str) -> Path:
    """Write weights + AdamW state + counters to ONE safetensors file, atomically (tmp file, then os.replace).

    Tensors: ``model/<state_dict name>`` (tied aliases stored once), ``optim/<param index>/<name>`` (exp_avg,
    exp_avg_sq, step). Metadata (strings): format, version, updates, last_grad_norm (JSON), optimizer_groups
    (JSON). A reader never sees a half-written file: it sees the old one or the new one.
    """
    from safetensors.torch import save_file

    from rlhfless.learn.optimstate import optimizer_tensors

    path = Path(path)
    tensors, seen = {}, set()
    for name, t in learner.model.state_dict().items():
        if t.data_ptr() in seen:  # tied lm_head / embedding: safetensors refuses shared storage
            continue
        seen.add(t.data_ptr())
        tensors[f"model/{name}"] = t.detach().contiguous()
    opt_tensors, groups = optimizer_tensors(learner.opt)
    tensors.update({f"optim/{k}": v for k, v in opt_tensors.items()})
    meta = {"format": STATE_FORMAT, "version": STATE_VERSION, "updates": str(learner.updates),
            "last_grad_norm": json.dumps(learner.last_grad_norm), "optimizer_groups": json.dumps(groups)}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_learner_state(learner: Learner, path: Path | str) -> None:
    """Load a `save_learner_state` file into `learner` (same architecture); anything off raises `DataError`."""
    from safetensors import SafetensorError, safe_open

    from rlhfless.learn.optimstate import set_optimizer_tensors

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            flat = {k: fh.get_tensor(k) for k in fh.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable learner state ({exc})") from None
    if meta.get("format") != STATE_FORMAT or meta.get("version") != STATE_VERSION:
        raise DataError(f"{path}: not an rlhfless learner state v{STATE_VERSION} "
                        f"(format {meta.get('format')!r}, version {meta.get('version')!r})")
    weights = {k[len("model/"):]: v for k, v in flat.items() if k.startswith("model/")}
    own = learner.model.state_dict()
    by_ptr = {t.data_ptr(): n for n, t in own.items() if n in weights}
    missing = [n for n, t in own.items() if n not in weights and t.data_ptr() not in by_ptr]
    unexpected = sorted(set(weights) - set(own))
    bad = [n for n, t in weights.items() if n in own and t.shape != own[n].shape]
    if missing or unexpected or bad:
        raise DataError(f"{path}: weights do not fit the model (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}, wrong shape {bad[:3]})")
    try:
        updates = int(meta["updates"])
        grad_norm = json.loads(meta["last_grad_norm"])
        groups = json.loads(meta["optimizer_groups"])
    except (KeyError, ValueError) as exc:
        raise DataError(f"{path}: corrupt learner state metadata ({exc})") from None
    with torch.no_grad():
        for name, t in weights.items():
            own[name].copy_(t)  # in place: tied aliases and the optimiser's parameter references stay valid
    set_optimizer_tensors(learner.opt, {k[len("optim/"):]: v for k, v in flat.items() if k.startswith("optim/")},
                          groups, path)
    learner.updates = updates
    learner.last_grad_norm = grad_norm


def load_policy_weights(model, path: Path | str) -> None:
    """Load only the weights of a `save_learner_state` file into `model` (a decode replica: no optimizer)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            weights = {k[len("model/"):]: fh.get_tensor(k) for k in fh.keys() if k.startswith("model/")}
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable learner state ({exc})") from None
    if meta.get("format") != STATE_FORMAT:
        raise DataError(f"{path}: not an rlhfless learner state (format {meta.get('format')!r})")
    own = model.state_dict()
    unexpected = sorted(set(weights) - set(own))
    if unexpected or any(t.shape != own[n].shape for n, t in weights.items() if n in own):
        raise DataError(f"{path}: weights do not fit the model (unexpected {unexpected[:3]})")
    with torch.no_grad():
        for name, t in weights.items():
            own[name].copy_(t)
