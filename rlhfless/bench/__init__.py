"""Benchmarks the CLI runs (`rlhfless bench prefill|engine|faults`): above the packages they measure.

The engine benchmarks load tasks and checkpoints to make realistic workloads, which the rollout engine itself
must not know of (it sees token ids only), and the fault benchmark runs whole training runs; so both live here,
above `rollout/`, `runtime/` and the runner, and import downward only. `benchmarks/` at the repository root
holds the standalone scripts; `rlhfless.bench.loop_bench` and `rlhfless.plan.bench` are the other `bench` commands.
"""
