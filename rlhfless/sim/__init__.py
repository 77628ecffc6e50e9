"""Large-scale discrete-event simulator that runs the real planner (predictor, balancer, cut-and-migrate, scaler,
cost model) over modelled devices and reports time and cost for every policy side by side.

Layout: `hardware` (device and model catalogs), `perf` (roofline performance model -> `plan.TimeModel`),
`calibrate` (fits to Vidur's GPU profiles and to this machine's measurements), `events` (event loop and the
timeline observer), `step` (the mechanism of one step), `policies` (verl, RLHFuse-like, RLHFless, oracle),
`workload` (trace replay, synthetic, GSM8K prompt lengths), `scenario` (configs, paper scenarios, the run),
`report` (Gantt and stage figures), `validate` (simulated vs measured on real runs), `cli` (`rlhfless simulate`).
"""

MAX_SIM_STEPS = 10_000
"""Most steps a case may simulate (the paper averages three epochs: 8 to 200 steps here); far beyond, a run would
take days, so `--steps` and `steps=` refuse it."""

SCENARIO_HELP = {
    "paper-testbed": "16 x L40S; Qwen2.5-3B/7B; GRPO and PPO",
    "paper-sim": "160 x H100; Llama-70B, TP 8",
    "local-cpu": "2 CPU cores; the tiny model replaying the quickstart trace",
    "quick": "8 x L40S; a small case for tests",
}
"""One line per scenario of `scenario.SCENARIOS`, for `simulate --help` without importing numpy (a test checks that
the two name the same scenarios)."""
