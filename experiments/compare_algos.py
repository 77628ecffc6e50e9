"""PPO beside GRPO: accuracy against the generated tokens each run spent, and where PPO's step time goes.

usage: python experiments/compare_algos.py runs/ppo_seed0 runs/grpo_seed0 [...]

Per run (from config.yaml, metrics.jsonl and summary.json): the algorithm, steps, sequences and tokens generated,
held-out sampled and greedy accuracy before -> after, the critic's explained variance over the first and last 10%
of steps (PPO), wall seconds, and the learner's seconds per trained response token (GRPO trains only the
groups whose rewards differ) with PPO's value forward beside it: the measured counterpart of the simulator's
assumption that PPO's learner costs 2x GRPO's per token (`rlhfless.sim.perf.PerfModel.learner_s_per_token`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def _rows(run: Path) -> list[dict]:
    return [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines())
            if "reward/mean" in r]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def describe(run: Path) -> dict:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    summary = json.loads((run / "summary.json").read_text())
    rows = _rows(run)
    algo = cfg["algo"]
    seqs = cfg["rollout"]["prompts_per_step"] * algo["group_size"]
    k = max(1, len(rows) // 10)
    trained = [r["perf/total_tokens"] * (1 - r.get("actor/groups_skipped_frac", 0.0)) for r in rows]
    out = {
        "run": run.name, "algo": algo.get("name", "grpo"), "steps": len(rows), "sequences": seqs * len(rows),
        "tokens": int(sum(r["perf/total_tokens"] for r in rows)),
        "sampled": (summary["eval_accuracy_initial"], summary["eval_accuracy_final"]),
        "greedy": (summary["eval_greedy_accuracy_initial"], summary["eval_greedy_accuracy_final"]),
        "wall_s": summary["wall_s"], "step_s": _mean([r["timing_s/step"] for r in rows]),
        "update_us_per_token": 1e6 * sum(r["timing_s/update"] for r in rows) / sum(trained),
        "values_us_per_token": 1e6 * sum(r.get("timing_s/values", 0.0) for r in rows) / sum(trained),
    }
    if "critic/vf_explained_var" in rows[0]:
        ev = [r["critic/vf_explained_var"] for r in rows]
        out["explained_var"] = (_mean(ev[:k]), _mean(ev[-k:]))
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for p in paths:
        if not (Path(p) / "summary.json").is_file():
            print(f"error: {Path(p) / 'summary.json'} not found (did the run finish?)", file=sys.stderr)
            return 2
    print("| run | algo | steps | sequences | generated tokens | held-out sampled | held-out greedy | critic explained "
          "var (first -> last 10%) | wall s | s/step | update us/trained token | value fwd us/token |")
    print("|---" * 12 + "|")
    for p in paths:
        d = describe(Path(p))
        acc = {k: f"{100 * a:.2f} -> {100 * b:.2f} ({100 * (b - a):+.2f})" for k, (a, b) in
               ((k, d[k]) for k in ("sampled", "greedy"))}
        ev = "-" if "explained_var" not in d else "{:.2f} -> {:.2f}".format(*d["explained_var"])
        print(f"| {d['run']} | {d['algo']} | {d['steps']} | {d['sequences']:,} | {d['tokens']:,} | {acc['sampled']} | "
              f"{acc['greedy']} | {ev} | {d['wall_s']:.0f} | {d['step_s']:.2f} | {d['update_us_per_token']:.1f} | "
              f"{d['values_us_per_token']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
