"""The GPU check (`scripts/gpu_check.sh OUT`, `make gpu-check`): one JSON of what this toolkit measures on one GPU
beside what its simulator assumes.

Parts, in order: 1. `profiles` (`rlhfless profile` of the Qwen2.5-0.5B and 1.5B shapes, measured / predicted);
2. `inline_grpo` (inline GRPO steps of the quickstart on the GPU); 3. `compare` (`runtime.mode=compare` on GPU 0);
4. `gpu_tests` (the `gpu`-marked tests). The rule it keeps: each part is timed, and a part that fails is recorded
with its one-line error while the rest still run. Without CUDA it exits 2 with one line; `--device cpu --models
tiny --steps 2` runs the same code on a CPU (the test). Needs no network and no vLLM; no NCCL weight transfer.
What each part measures: docs/internals.md#benchgpucheckpy.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "experiments" / "configs" / "quickstart.yaml"


def _part(report: dict, name: str, fn) -> None:
    t0 = time.perf_counter()
    try:
        report[name] = fn()
    except Exception as exc:  # noqa: BLE001  (one part failing must not lose the others' numbers)
        report[name] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"}
    report.setdefault("part_seconds", {})[name] = time.perf_counter() - t0
    print(f"gpu_check: {name} done in {report['part_seconds'][name]:.1f} s", file=sys.stderr)


def profiles(device: str, models: list[str], small: bool) -> dict:
    from rlhfless.bench.device_profile import ProfileConfig, run_profile

    out = {}
    for m in models:
        kw = dict(batch_sizes=(1, 4), contexts=(16,), prefill_tokens=(32,), iters=2, repeats=1) if small else {}
        doc = run_profile(ProfileConfig(model=m, device=device, **kw),
                          lambda line: print(f"gpu_check: {m}: {line}", file=sys.stderr))
        out[m] = doc
    return out


def inline_grpo(device: str, steps: int, small: bool) -> dict:
    from rlhfless.core import metrics as M
    from rlhfless.core.rundir import RunDir
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train

    over = [f"train.steps={steps}", "train.eval_prompts=0", "tracking.mode=disabled", f"train.device={device}",
            "train.checkpoint_every=0", "train.table_every=0"]
    if small:
        over += ["rollout.prompts_per_step=4", "algo.group_size=4", "rollout.max_new_tokens=32"]
    cfg = load_run_config(QUICKSTART, over)
    with tempfile.TemporaryDirectory(prefix="rlhfless-gpucheck-") as tmp:
        t0 = time.perf_counter()
        summary = train(cfg, Path(tmp) / "run", progress=False)
        wall = time.perf_counter() - t0
        lines = RunDir(Path(tmp) / "run").read_metrics()
    step, tok = M.timing("step"), M.TOKENS
    per_step = [{"step": i + 1, "step_s": x[step], "rollout_s": x[M.timing("rollout")],
                 "update_s": x[M.timing("update")], "tokens": x[tok], "tokens_per_s": x[tok] / x[step],
                 "reward": x[M.REWARD_MEAN]}
                for i, x in enumerate(row for row in lines if step in row)]
    later = per_step[1:] or per_step  # step 1 pays the kernels' first-call costs
    return {"config": str(QUICKSTART.relative_to(REPO)), "overrides": over, "wall_s": wall, "steps": per_step,
            "step_s_median": sorted(s["step_s"] for s in later)[len(later) // 2],
            "tokens_per_s_median": sorted(s["tokens_per_s"] for s in later)[len(later) // 2],
            "reward_first": per_step[0]["reward"], "reward_last": per_step[-1]["reward"],
            "summary_steps": summary["steps"]}


def compare(device: str, small: bool) -> dict:
    """The three-arm comparison on the GPU (4 functions per GPU) or, on the CPU, on 2 cores."""
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train

    over = ["runtime.mode=compare", "plan.max_actors=2", "train.steps=2", "rollout.prompts_per_step=6",
            "algo.group_size=4", "rollout.max_new_tokens=48", "train.eval_prompts=0", "train.checkpoint_every=0",
            "train.table_every=0", "tracking.mode=disabled", "runtime.gantt_every=0", "task.arith.k_max=6"]
    over += ["runtime.units=2"] if small else ["runtime.device=cuda", "runtime.functions_per_gpu=4",
                                               "runtime.units=4", f"train.device={device}"]
    cfg = load_run_config(QUICKSTART, over)
    with tempfile.TemporaryDirectory(prefix="rlhfless-gpucheck-") as tmp:
        c = train(cfg, Path(tmp) / "cmp", progress=False)
    keep = ("step_time_s", "cost_device_s", "cost_usd", "core_s_per_step")
    return {"overrides": over, "arms": c["arms"],
            "samples_identical": c["samples_identical"], "weights_identical": c["weights_identical"],
            "step_time_ratio": c["step_time_ratio"], "cost_ratio": c["cost_ratio"],
            **{a: {k: c[a].get(k) for k in keep} for a in c["arms"]}}


def gpu_tests() -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skipped": "pytest is not installed"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           "tests/test_devices.py"], cwd=REPO, capture_output=True, text=True, timeout=300)
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    return {"returncode": proc.returncode, "summary": tail[0], "output_tail": proc.stdout[-3000:]}


def machine(device: str) -> dict:
    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "host": platform.node()}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=p.total_memory / 2**30, gpus_visible=torch.cuda.device_count())
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the JSON to write")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--no-compare", action="store_true")
    args = ap.parse_args(argv)
    from rlhfless.core.devices import check_device, cuda_visible, no_cuda_message, wants_cuda
    from rlhfless.core.errors import ConfigError

    if wants_cuda(args.device) and not cuda_visible():
        print(f"gpu_check: {no_cuda_message()}; this check needs one CUDA GPU", file=sys.stderr)
        return 2
    try:
        check_device(args.device, "--device")
    except ConfigError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    small = not args.device.startswith("cuda")  # the CPU run checks the code path, not the numbers
    t0 = time.perf_counter()
    report: dict = {"format": "rlhfless.gpu_check", "version": 1, "machine": machine(args.device)}
    _part(report, "profiles", lambda: profiles(args.device, args.models.split(","), small))
    _part(report, "inline_grpo", lambda: inline_grpo(args.device, args.steps, small))
    if not args.no_compare:
        _part(report, "compare", lambda: compare(args.device, small))
    if not args.no_tests:
        _part(report, "gpu_tests", gpu_tests)
    report["wall_s"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(_headline(report), indent=1))
    failed = [k for k in ("profiles", "inline_grpo", "compare", "gpu_tests") if "error" in report.get(k, {})]
    return 1 if failed else 0


def _headline(r: dict) -> dict:
    """The few numbers to read first (the rest is in the file)."""
    out = {"wall_s": round(r["wall_s"], 1), "machine": r["machine"]}
    for m, doc in (r.get("profiles") or {}).items():
        if isinstance(doc, dict) and "profile" in doc:
            sim = doc["profile"]["simulator"]
            out[m] = {"decode_ms_b1": 1e3 * doc["rows"][0]["s_per_iter"],
                      "decode_ratio_median": sim.get("decode_ratio_median"),
                      "prefill_ratio_median": sim.get("prefill_ratio_median"),
                      "cold_start_s": (doc["profile"].get("cold_start") or {}).get("total_s")}
    g = r.get("inline_grpo", {})
    out["inline_grpo"] = {k: g.get(k) for k in ("step_s_median", "tokens_per_s_median", "error") if k in g}
    c = r.get("compare", {})
    out["compare"] = {k: c.get(k) for k in ("samples_identical", "weights_identical", "step_time_ratio", "cost_ratio",
                                              "error") if k in c}
    if "gpu_tests" in r:
        out["gpu_tests"] = r["gpu_tests"].get("summary", r["gpu_tests"])
    return out


if __name__ == "__main__":
    sys.exit(main())
