"""Behaviour digest: SHA-256s of a few small runs, so a refactor can show behaviour bitwise unchanged.

    python scripts/behaviour_digest.py run OUT.json [--work DIR] [--reuse] [--ppo]  # make the runs (--reuse: the
                                                    # ones in DIR; --ppo: the PPO runs too), write their digests
    python scripts/behaviour_digest.py stable A.json B.json [...] KEEP.json  # keep the keys all base runs agree on
    python scripts/behaviour_digest.py diff BEFORE.json AFTER.json    # every key of BEFORE that AFTER changed

The runs (small sizes, a few minutes on 2 CPU cores):
  * the quickstart (experiments/configs/quickstart.yaml), inline and serverless: final weights (per tensor) and
    traces/samples_digest.jsonl;
  * `runtime.mode=compare` (serverless_vs_serverful.yaml): every arm's samples digest and final weights;
  * one emulated compare (emulated_testbed_7b_grpo.yaml at `repro --quick`'s size, 2 steps): every arm's
    workers.jsonl, invocations.jsonl and metrics.jsonl, one digest per (file, field) over that field's column;
  * PPO: `runtime.mode=compare` (serverless_vs_serverful_ppo.yaml, every arm's samples digest and final weights) and
    one emulated PPO compare (emulated_testbed_3b_ppo.yaml on 8 units, the actor and critic on 8 ranks, 2 steps:
    every arm's records, as above).
Emulated records are timed in real seconds, so any field that depends on the wall clock (and any decision that
depends on a measured time) can differ between two runs of the same code: `stable` keeps only the keys two runs of
the base agree on, and `diff` compares only those.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "experiments" / "configs"
SMALL = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.max_new_tokens=24", "algo.group_size=4",
         "train.eval_prompts=0", "tracking.mode=disabled", "train.checkpoint_every=0"]
EMULATED_QUICK = ["runtime.units=8", "plan.max_actors=8", "runtime.emulated_model=qwen2.5-3b",
                  "rollout.prompts_per_step=16", "train.steps=2", "runtime.time_scale=0.05",
                  "runtime.keep_alive_s=0.25", "runtime.prewarm_buffer_s=0.0025", "train.seed=0",
                  "tracking.mode=disabled", "runtime.gantt_every=0"]
EMULATED_PPO_QUICK = ["runtime.units=8", "runtime.learner_units=8", "plan.max_actors=8", "rollout.prompts_per_step=16",
                      "rollout.max_new_tokens=256", "critic.values_chunk=4", "task.arith.num_train=16",
                      "train.steps=2", "runtime.time_scale=0.05", "runtime.keep_alive_s=0.25",
                      "runtime.prewarm_buffer_s=0.0025", "train.seed=0", "runtime.gantt_every=0"]
RECORDS = ("workers.jsonl", "invocations.jsonl", "metrics.jsonl")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def weights_digest(path: Path) -> dict[str, str]:
    """name -> SHA-256 of the tensor's bytes (a file digest would also cover the header's metadata)."""
    from safetensors.numpy import load_file

    return {k: _sha(v.tobytes()) for k, v in sorted(load_file(str(path)).items())}


def run_digest(out: Path) -> dict[str, str]:
    d = {"samples_digest": _sha((out / "traces" / "samples_digest.jsonl").read_bytes())}
    final = out / "checkpoints" / "final" / "model.safetensors"
    d |= {f"weights/{k}": v for k, v in weights_digest(final).items()}
    return d


def records_digest(out: Path) -> dict[str, str]:
    """(file, field) -> SHA-256 over that field's values, one per row in file order (missing: null); and the
    samples digest (an emulated device's tokens are a pure function of seed, row and position)."""
    d = {"samples_digest": _sha((out / "traces" / "samples_digest.jsonl").read_bytes())}
    for name in RECORDS:
        rows = [json.loads(line) for line in (out / name).read_text().splitlines() if line.strip()]
        d[f"{name}/rows"] = _sha(str(len(rows)).encode())
        for field in sorted({k for r in rows for k in r}):
            col = json.dumps([r.get(field) for r in rows], sort_keys=True).encode()
            d[f"{name}/{field}"] = _sha(col)
    return d


def make_runs(work: Path, flags: tuple[str, ...] = ()) -> None:
    try:
        from rlhfless.run.launch import train
    except ImportError:  # a tree from before issue 38, where the runner dispatched a comparison itself
        from rlhfless.run.runner import train
    from rlhfless.config import load_run_config

    for mode in ("inline", "serverless"):
        cfg = load_run_config(str(CONFIGS / "quickstart.yaml"), SMALL + [f"runtime.mode={mode}"])
        train(cfg, work / f"quick-{mode}", progress=False)
    cfg = load_run_config(str(CONFIGS / "serverless_vs_serverful.yaml"), SMALL + ["runtime.gantt_every=0"])
    train(cfg, work / "compare", progress=False)
    cfg = load_run_config(str(CONFIGS / "emulated_testbed_7b_grpo.yaml"), EMULATED_QUICK)
    train(cfg, work / "emulated", progress=False)
    if "--ppo" in flags:
        cfg = load_run_config(str(CONFIGS / "serverless_vs_serverful_ppo.yaml"), SMALL + ["runtime.gantt_every=0"])
        train(cfg, work / "compare-ppo", progress=False)
        cfg = load_run_config(str(CONFIGS / "emulated_testbed_3b_ppo.yaml"), EMULATED_PPO_QUICK)
        train(cfg, work / "emulated-ppo", progress=False)


def digest_runs(work: Path) -> dict[str, str]:
    """The digests of the runs `make_runs` left in `work`."""
    out: dict[str, str] = {}
    for mode in ("inline", "serverless"):
        out |= {f"quickstart/{mode}/{k}": v for k, v in run_digest(work / f"quick-{mode}").items()}
    for name, digest in (("compare", run_digest), ("emulated", records_digest),
                         ("compare-ppo", run_digest), ("emulated-ppo", records_digest)):
        if not (work / name).exists():  # the PPO runs are made only with --ppo
            continue
        for arm in json.loads((work / name / "comparison.json").read_text())["arms"]:
            out |= {f"{name}/{arm}/{k}": v for k, v in digest(work / name / arm).items()}
    return out


def main(argv: list[str]) -> int:
    cmd, *args = argv or ["--help"]
    if cmd == "run":
        work = Path(args[args.index("--work") + 1]) if "--work" in args else Path(tempfile.mkdtemp(prefix="bdig-"))
        if "--reuse" not in args:
            make_runs(work, tuple(a for a in args if a == "--ppo"))
        digests = digest_runs(work)
        Path(args[0]).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        print(f"{len(digests)} digests -> {args[0]} (runs in {work})")
        return 0
    if cmd == "stable":
        a, *rest = (json.loads(Path(p).read_text()) for p in args[:-1])
        keep = {k: v for k, v in a.items() if all(b.get(k) == v for b in rest)}
        for k in sorted(set(a) - set(keep)):
            print(f"unstable: {k}")
        Path(args[-1]).write_text(json.dumps(keep, indent=1, sort_keys=True) + "\n")
        print(f"{len(keep)} of {len(a)} keys stable -> {args[-1]}")
        return 0
    if cmd == "diff":
        before, after = (json.loads(Path(p).read_text()) for p in args[:2])
        changed = [k for k in sorted(before) if after.get(k) != before[k]]
        for k in changed:
            print(f"changed: {k}")
        print(f"{len(before) - len(changed)} of {len(before)} stable keys unchanged")
        return 1 if changed else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
