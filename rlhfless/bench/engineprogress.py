"""What `rlhfless bench engine` will run and roughly how long, and its progress bar (the timing is in `bench.py`).

The estimate is rough on purpose: CPU seconds per (row x response-token cap) of each arm on each workload, measured
once at one torch thread (`REF_CPU`), times rows x cap x modes x repeats, divided by `threads ** THREAD_EXPONENT`
(a model this small gains less than linearly from threads). It leaves out loading and waiting for a busy core.
The bar counts in these estimated seconds, so its remaining time weighs a slow HF `generate` on ~900-token GSM8K
prompts more than a fast engine call, and tqdm's measured rate corrects the estimate to this machine as calls end.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

REF_CPU = "2-core AMD EPYC (shared), torch 2.13 CPU, 1 thread"
# CPU seconds per row x token cap, mean of greedy and sampled, at the default sizes (B=32 x G=8 arithmetic prompts,
# cap 192; B=8 x G=8 GSM8K 2-shot prompts of ~930 tokens, cap 64): 97 CPU-s a repeat. HF generate on the long
# prompts grows faster than the row count, so smaller batches come out overestimated. vLLM was not measured here:
# it is estimated like this engine.
REF_S_PER_ROW_TOKEN = {
    "arith": {"engine": 1.0e-5, "hf_generate": 7.0e-5, "hf_generate_dedup": 5.1e-5, "engine_hf_step": 1.1e-5},
    "gsm8k": {"engine": 1.9e-4, "hf_generate": 4.9e-3, "hf_generate_dedup": 4.0e-3, "engine_hf_step": 1.1e-3},
}
VLLM_START_S = 60.0  # vLLM's engine start (model compile) is tens of seconds on these CPUs
THREAD_EXPONENT = 0.6
ARM_LABELS = {"engine": "own", "hf_generate": "hf generate", "hf_generate_dedup": "hf generate+dedup",
              "engine_hf_step": "own (hf step)", "vllm": "vllm"}
MODES = ("greedy", "sampled")


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: int
    rows: int
    max_new: int


def engine_arms(cfg) -> list[str]:
    """The timed arms of each mode, in the order `bench._engine_mode` runs them."""
    arms = ["engine"]
    if "hf" in cfg.engines:
        arms += ["hf_generate", "hf_generate_dedup"] + (["engine_hf_step"] if cfg.hf_step_ablation else [])
    if "vllm" in cfg.engines and vllm_skipped(cfg) is None:
        arms.append("vllm")
    return arms


def vllm_skipped(cfg) -> str | None:
    """Why the vLLM arm will not run (None: it will); the bench imports vLLM right after anyway."""
    from rlhfless.rollout.vllm_engine import vllm_available

    return vllm_available() if "vllm" in cfg.engines else "not in --engines"


def engine_workloads(cfg) -> tuple[list[Workload], dict[str, str]]:
    """(the workloads that will run, {skipped workload: why}), decided the way `bench.bench_engine` decides."""
    runs = [Workload("arith", cfg.prompts, cfg.prompts * cfg.group_size, cfg.max_new_tokens)]
    skipped = {}
    if cfg.gsm8k_prompts == 0:
        skipped["gsm8k"] = "--gsm8k-prompts 0"
    elif not Path(cfg.gsm8k_path).is_file():
        skipped["gsm8k"] = f"no file at {cfg.gsm8k_path}"
    else:
        runs.append(Workload("gsm8k", cfg.gsm8k_prompts, cfg.gsm8k_prompts * cfg.group_size,
                             cfg.gsm8k_max_new_tokens))
    return runs, skipped


def call_estimate_s(workload: Workload, arm: str, threads: int) -> float:
    rates = REF_S_PER_ROW_TOKEN[workload.name]
    return rates.get(arm, rates["engine"]) * workload.rows * workload.max_new / max(1, threads) ** THREAD_EXPONENT


def total_estimate_s(cfg) -> float:
    runs, _ = engine_workloads(cfg)
    arms = engine_arms(cfg)
    total = sum(call_estimate_s(w, a, cfg.threads) for w in runs for a in arms) * len(MODES) * cfg.repeats
    if "vllm" in arms:  # one start per workload and one untimed warm-up call per mode
        total += sum(VLLM_START_S + len(MODES) * call_estimate_s(w, "vllm", cfg.threads) for w in runs)
    return total


def describe(cfg) -> str:
    """Two lines for the start of a run: what runs, and roughly how long."""
    runs, skipped = engine_workloads(cfg)
    parts = [f"{w.name} (B={w.prompts} x G={cfg.group_size}, cap {w.max_new} tokens)" for w in runs]
    parts += [f"{name} skipped ({why})" for name, why in skipped.items()]
    if "vllm" in cfg.engines and "vllm" not in engine_arms(cfg):
        parts.append(f"vllm skipped ({vllm_skipped(cfg)})")
    arms = ", ".join(ARM_LABELS[a] for a in engine_arms(cfg))
    est = total_estimate_s(cfg)
    return (f"bench engine: workloads {'; '.join(parts)}; arms {arms}; greedy and sampled, {cfg.repeats} repeat(s), "
            f"{cfg.threads} thread(s)\n"
            f"bench engine: roughly {_duration(est)} of compute (estimated from {REF_CPU}; a busy or slower machine "
            f"takes longer; --repeats, --prompts, --gsm8k-prompts 0 and --threads shorten it)")


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class Progress:
    """One tqdm bar over the whole bench in estimated seconds; its label names the workload, mode, arm and repeat.
    Disabled (`enabled=False`), every method is a no-op."""

    def __init__(self, cfg, enabled: bool):
        from tqdm.auto import tqdm

        self.threads = cfg.threads
        self.arms = engine_arms(cfg)
        self.workloads = {w.name: w for w in engine_workloads(cfg)[0]}
        self.bar = tqdm(total=total_estimate_s(cfg), disable=not enabled, file=sys.stderr,
                        desc="bench engine", bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
        self.workload: Workload | None = None
        self.mode = ""

    def begin_workload(self, name: str) -> None:
        self.workload, self.mode = self.workloads.get(name), ""

    def begin_mode(self, mode: str) -> None:
        self.mode = mode

    def estimate(self, arm: str) -> float:
        """Estimated seconds of one call of `arm` on the current workload."""
        return call_estimate_s(self.workload, arm, self.threads) if self.workload is not None else 0.0

    def start(self, arm: str, repeat: int, repeats: int) -> None:
        name = self.workload.name if self.workload else "?"
        self.bar.set_description_str(f"{name}/{self.mode} {ARM_LABELS.get(arm, arm)} {repeat + 1}/{repeats}")

    def done(self, arm: str) -> None:
        self._advance(self.estimate(arm))

    def _advance(self, seconds: float) -> None:
        # float sums may overshoot the total by a rounding error; tqdm would warn
        self.bar.update(max(0.0, min(seconds, self.bar.total - self.bar.n)))

    @contextlib.contextmanager
    def untimed(self, label: str, estimate_s: float):
        """An untimed piece of the plan (vLLM's start, its warm-up call)."""
        name = self.workload.name if self.workload else "?"
        self.bar.set_description_str(f"{name} {label}")
        yield
        self._advance(estimate_s)

    def close(self) -> None:
        self.bar.close()
