"""The registry of studies `rlhfless repro` can run, in report order, and the context they share.

A study is `fn(ctx) -> StudyResult`; `ctx` gives the output folder, the size (`quick`: the CI size, minutes in
all; full: the sizes the report's numbers come from), the seed and the W&B mode. Studies write their figures
under `ctx.out/<study>/`; the real-run studies share one comparison run under `ctx.out/real-runs/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlhfless.core.errors import require
from rlhfless.repro import algo_study
from rlhfless.repro import emulated_sensitivity, emulated_study
from rlhfless.repro import real_studies as real
from rlhfless.repro import regimes
from rlhfless.repro import sim_studies as sim
from rlhfless.repro.records import StudyResult


@dataclass(frozen=True)
class ReproContext:
    out: Path
    quick: bool = False
    seed: int = 0
    tracking: str = "offline"
    """W&B mode of every run the repro makes: offline (default), online, or disabled."""
    sim: tuple[str, ...] = ()
    """key=value overrides of every simulated case (`SimConfig`: design, mechanisms, learner, the baseline's
    settings, ...), applied before each study's own (a swept key stays the study's)."""

    def __post_init__(self) -> None:
        require(self.tracking in ("offline", "online", "disabled"), "tracking",
                f"must be offline, online or disabled (got {self.tracking!r})")


@dataclass(frozen=True)
class Study:
    name: str
    fn: Callable[[ReproContext], StudyResult]
    source: str
    """real (measured on this machine), sim (simulated), or sim+real (both)."""
    about: str


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("headline", sim.headline, "sim", "testbed step time and cost per policy, per model and algorithm"),
    Study("large-scale", sim.large_scale, "sim", "the 160 x H100, 70B simulation"),
    Study("ablation", sim.ablation, "sim", "waterfall: tuned verl, paper verl, serverless + one mechanism per rung, "
                                           "oracle"),
    Study("pareto", sim.pareto, "sim", "speedup vs cost reduction over lambda and the deadline objective"),
    Study("overheads", sim.overhead_sensitivity, "sim", "each overhead constant halved and doubled"),
    Study("sensitivity", sim.sensitivity, "sim", "tau, lambda, and the actor-count sweet spot T(N), C(N)"),
    Study("tail-shape", sim.tail_shape, "sim", "the paper's design vs the paper's verl over the response tail"),
    Study("regimes", regimes.regimes, "sim", "regime map: speed and cost cut over tail, cluster, model, cold "
                                             "starts, keep-alive and price ratio, Shapley per region"),
    Study("ppo-vs-grpo", algo_study.ppo_vs_grpo, "sim+real", "RLHFless's gain on PPO vs GRPO (testbed, "
                                                             "what-ifs) and the stages it cannot shorten, measured"),
    Study("prefill", real.prefill_study, "real", "dedup prefill saving vs theory over G and shared-prefix length"),
    Study("predictor", real.predictor_study, "real", "EWMA length predictor: MAE and Kendall tau over epochs, window"),
    Study("timeline", real.timeline_study, "real", "one step's per-function Gantt, serverful beside serverless"),
    Study("sim-vs-real", real.sim_vs_real_study, "real", "the simulator's prediction of the real runs"),
    Study("emulated", emulated_study.emulated_study, "real", "the testbed on emulated L40S: every arm's step, bill "
                                                              "and one step's Gantt, and the simulator's prediction"),
    Study("emulated-sensitivity", emulated_sensitivity.emulated_sensitivity, "real",
          "the emulated arms over the cold-start constants and the keep-alive, against both verl readings"),
)}
