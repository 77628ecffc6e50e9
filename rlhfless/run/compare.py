"""`runtime.mode=compare`: the serverful control and the serverless runtime on the same seed and prompts.

Three arms, each a whole run in OUT/<arm>: `serverful` (a pool held for the run, work split by count, no overlap),
`serverful-overlap` (the same with `runtime.overlap=true`, separating what streaming the tail buys from what
serverless buys) and `serverless`; PPO runs the overlap arm only when its value forward streams in chunks
(`critic.values_chunk`), emulated devices add `serverless-paper` and, for GRPO, `serverful-paper-engine` (verl with
the paper's engine settings beside the tuned one: `PAPER_ENGINE_ARM`). Then OUT/comparison.json (ratios, identity of
samples, weights and final state, scaling, the planner's accuracy, the cost gap by component) and side-by-side
Gantt charts. The rule it keeps: every arm runs the same seed and prompts, so samples, weights and final state
compare byte for byte; the arms run one after another, so the ratios are clean only when `other_cpu_fraction_max`
is near 0. The fields of comparison.json: docs/internals.md#runcomparepy.
Its scaling fields count learner ranks let go at their share (`ranks_released_early`) among mid-step releases.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import replace
from pathlib import Path

from rlhfless.core.jsonl import write_json
from rlhfless.core.rundir import RunDir
from rlhfless.run.contention import CpuWindow
from rlhfless.run.gantt import gantt_steps, plot_steps, read_records
from rlhfless.run.runner import train

ARMS = ("serverful", "serverful-overlap", "serverless")
BASE, TREATED = "serverful", "serverless"


def read_digests(run_dir: Path) -> dict[int, str]:
    return RunDir(run_dir).read_digests()


def samples_match(a: Path, b: Path) -> tuple[bool, int | None, int]:
    """(identical, first step that differs or None, steps compared) of two runs' per-step sample digests."""
    da, db = read_digests(a), read_digests(b)
    steps = sorted(set(da) | set(db))
    diff = [s for s in steps if da.get(s) != db.get(s)]
    return (not diff and bool(steps)), (diff[0] if diff else None), len(steps)


PAPER_ARM = "serverless-paper"
"""With emulated devices (`runtime.device=emulated`) an arm of serverless as the paper designed it
(`runtime.design=paper`), beside `serverless` as configured (design extended: ours)."""
PAPER_ENGINE_ARM = "serverful-paper-engine"
"""With emulated devices and GRPO, verl as the paper ran it: the serverful pool with `runtime.emulated_engine=paper`
(the simulator's paper-verl settings: verl's example TP, KV sleep and wake, full reshard), beside `serverful`, verl
with the tuned engine. The serverless arms' ratios are reported against both."""
ARM_LABELS = {"serverful": "verl (tuned engine, TP {tp})", PAPER_ENGINE_ARM: "verl (paper's settings, TP {tp})",
              "serverful-overlap": "verl (tuned engine, TP {tp}) + overlap", "serverless": "serverless (ours, TP {tp})",
              PAPER_ARM: "serverless (paper's design, TP {tp})"}
"""What each arm is, for reports and figures (`label`), with the TP its replicas run at; `serverless` is the
configured design (ours by default)."""


def label(arm: str, cfg=None) -> str:
    """An arm's label (`ARM_LABELS`; the arm's name when it has none) with its TP: `cfg`'s (the tuned engine's and
    every function's: `runtime.emulated_tp` resolved; the paper-settings engine's own), TP 1 without a cfg (the
    paper-settings engine's then without its TP)."""
    tp = 1
    if cfg is None and arm == PAPER_ENGINE_ARM:
        return "verl (paper's settings)"
    if cfg is not None:
        tp = arm_config(cfg, arm).runtime.pool_worker_units() if arm == PAPER_ENGINE_ARM else \
            cfg.runtime.function_units()
    return ARM_LABELS.get(arm, arm).format(tp=tp)


def arms(cfg) -> tuple[str, ...]:
    """The arms of a comparison: PPO has an overlap arm only when its value forward streams in chunks
    (critic.values_chunk > 0: nothing of its update can stream, `ppo_stages`); emulated devices add the paper's
    design (`PAPER_ARM`) and, for GRPO, verl at the paper's engine settings (`PAPER_ENGINE_ARM`; PPO's update is
    one rank, so a TP replica has no PPO path yet)."""
    out = tuple(a for a in ARMS if a != "serverful-overlap" or cfg.algo.name == "grpo" or cfg.critic.values_chunk)
    if cfg.runtime.device != "emulated":
        return out
    return out[:1] + ((PAPER_ENGINE_ARM,) if cfg.algo.name == "grpo" else ()) + out[1:] + (PAPER_ARM,)


def arm_config(cfg, arm: str):
    """The run config of one arm (module header)."""
    if arm == PAPER_ENGINE_ARM:
        return replace(cfg, runtime=replace(cfg.runtime, mode="serverful", overlap=False, emulated_engine="paper"))
    if arm == PAPER_ARM:
        return replace(cfg, runtime=replace(cfg.runtime, mode="serverless", design="paper", overlap=None,
                                            hybrid=None))
    if arm == "serverful":
        return replace(cfg, runtime=replace(cfg.runtime, mode="serverful", overlap=False))
    if arm == "serverful-overlap":
        return replace(cfg, runtime=replace(cfg.runtime, mode="serverful", overlap=True))
    return replace(cfg, runtime=replace(cfg.runtime, mode="serverless"))


STATE_FILES = ("model.safetensors", "optimizer.safetensors", "critic.safetensors")
"""The learned state a run ends with (`runstate`, OUT/checkpoints/last): the policy, AdamW's tensors and, for PPO,
the critic (weights, AdamW state, counters). Every one must be bitwise equal across arms."""


def safetensors_digest(path: Path) -> str:
    """SHA-256 of a safetensors file's content: its header as a sorted mapping, then every tensor byte. The header's
    metadata map is written in a per-process order (two identical critic states differed only there), so the raw
    bytes are no content check; the tensor bytes and each tensor's dtype, shape and offsets are."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    h = hashlib.sha256(json.dumps(json.loads(raw[8:8 + n]), sort_keys=True).encode())
    h.update(raw[8 + n:])
    return h.hexdigest()


def state_digests(run_dir: Path) -> dict[str, str]:
    """Content digest (`safetensors_digest`) of each learned-state file of the run's last checkpoint (those it
    has; {} if none)."""
    ckpt = RunDir(run_dir).checkpoint("last")
    return {f: safetensors_digest(ckpt / f) for f in STATE_FILES if (ckpt / f).is_file()}


def states_match(digests: dict[str, dict[str, str]]) -> bool:
    """Whether every arm ended with the same learned state: the same files, each byte for byte (pure)."""
    ds = list(digests.values())
    return bool(ds) and all(ds[0] and d == ds[0] for d in ds)


def weights_digest(run_dir: Path) -> str | None:
    """SHA-256 of the final checkpoint's weight file (None if the run wrote none)."""
    p = RunDir(run_dir).final_weights
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None


CALIBRATION_STEPS = 3
"""Steps the planner needs before it prices with measured cold starts and speed (the runtime's calibration: the
first step prices the configured assumptions): planner accuracy leaves them out."""


def priced_key(whole_step: bool) -> str:
    """The billed metric of what the planner priced: the whole step (plan.learner.whole_step) or the decode
    functions alone (each decode function's billed seconds: cold start, busy and held-idle until its release)."""
    return "cost/device_seconds" if whole_step else "function/decode/billed_s"


def planner_accuracy(rows: list[dict], whole_step: bool, skip: int = CALIBRATION_STEPS) -> dict:
    """The planner's predicted device-seconds against the billed ones of what it priced, over ONE set of steps.

    rows: a run's metrics rows (`metrics.jsonl`); a step counts when it is past the first `skip` steps and logged
    both `plan/predicted_device_s` and the priced key. Both sums run over exactly those steps, so the ratio is
    sum(predicted) / sum(billed) (= the ratio of the per-step means). The one definition: `compare` reports it,
    the tests check it, the benchmark measures it."""
    key = priced_key(whole_step)
    pairs = [(r["plan/predicted_device_s"], r[key]) for r in rows if r.get("step", 0) > skip
             and r.get("plan/predicted_device_s") is not None and r.get(key) is not None]
    out = {"priced": key, "skipped_steps": skip, "steps": len(pairs)}
    if not pairs:
        return out
    pred, billed = (sum(x) for x in zip(*pairs))
    return {**out, "predicted_device_s": pred / len(pairs), "billed_device_s": billed / len(pairs),
            "predicted_over_billed": pred / billed if billed > 0 else None}


def run_planner_accuracy(run_dir: Path, whole_step: bool, skip: int = CALIBRATION_STEPS) -> dict:
    return planner_accuracy(RunDir(run_dir).read_metrics(), whole_step, skip)


def core_seconds_per_step(run_dir: Path, runtime: dict) -> dict:
    """Where one step's billed device-seconds went: cold starts, invocations by kind (busy) and the rest of the
    held time (idle: waiting for work, a peer, or release). Sums to `billed`."""
    workers, invocations = read_records(run_dir)
    steps = max(1, runtime["steps"])
    cold = sum(w["cold_start_s"] * w["units"] for w in workers if w["ready_s"] is not None) / steps
    busy: dict[str, float] = {}
    for i in invocations:  # a learner rank's compute intervals (`busy`): waiting for groups is held idle
        spans = i.get("busy") or [(i["started_s"], i["finished_s"])]
        busy[i["kind"]] = busy.get(i["kind"], 0.0) + sum(b - a for a, b in spans) * i["units"] / steps
    billed = runtime["cost_device_s"] / steps
    return {"billed": billed, "cold_start": cold, "busy": busy,
            "held_idle": billed - cold - sum(busy.values())}


def compare(cfg, out: Path, progress: bool = True) -> dict:
    """Every arm of `cfg` run by the runner into OUT/<arm>, then OUT/comparison.json (module header); called by
    `run.launch.train`, which claims OUT."""
    out.mkdir(parents=True, exist_ok=True)
    summaries, machine = {}, {}
    for arm in arms(cfg):
        window = CpuWindow.open()
        summaries[arm] = train(arm_config(cfg, arm), out / arm, progress=progress)
        machine[arm] = window.close()
        _label_summary(out / arm, arm, cfg)
    ran = list(summaries)
    digests = {arm: weights_digest(out / arm) for arm in ran}
    states = {arm: state_digests(out / arm) for arm in ran}
    same = [samples_match(out / BASE, out / arm) for arm in ran if arm != BASE]
    rs = {arm: summaries[arm]["runtime"] for arm in ran}
    result = {
        **_ratios(rs[TREATED], rs[BASE]),
        "samples_identical": all(ok for ok, _, _ in same),
        "first_divergent_step": min((d for _, d, _ in same if d is not None), default=None),
        "steps_compared": min(n for _, _, n in same),
        "weights_identical": None not in digests.values() and len(set(digests.values())) == 1,
        "final_state_identical": states_match(states),
        # the same runs billed per lifetime (commercial platforms) and per invocation (the paper's proxy)
        "cost_ratio_by_billing": {k: rs[TREATED]["cost_device_s_by_billing"][k] / v
                                  for k, v in rs[BASE]["cost_device_s_by_billing"].items()},
        "final_state_files": sorted(states[BASE]),
        # does the serverless arm scale to zero? (released at a keep-alive's lapse mid-step; nothing held at all)
        "released_mid_step": rs[TREATED].get("released_mid_step"),
        "released_expired": rs[TREATED].get("released_expired"),
        "ranks_released_early": rs[TREATED].get("ranks_released_early"),
        "zero_held_intervals": rs[TREATED].get("zero_held_intervals"),
        "overlap_only": _ratios(rs["serverful-overlap"], rs[BASE]) if "serverful-overlap" in rs else None,
        # the serverless arm against verl as the paper ran it (the ratios above are against the tuned engine)
        "against_paper_engine": _ratios(rs[TREATED], rs[PAPER_ENGINE_ARM]) if PAPER_ENGINE_ARM in rs else None,
        "arms": ran, "arm_labels": {arm: label(arm, cfg) for arm in ran}, "seed": cfg.train.seed,
        "steps": cfg.train.steps,
        **{arm: {**rs[arm], "eval_accuracy_final": summaries[arm]["eval_accuracy_final"],
                 "eval_greedy_accuracy_final": summaries[arm]["eval_greedy_accuracy_final"],
                 "wall_s": summaries[arm]["wall_s"], "weights_sha256": digests[arm],
                 "final_state_sha256": states[arm],
                 "planner": run_planner_accuracy(out / arm, cfg.plan.learner.whole_step),
                 "core_s_per_step": core_seconds_per_step(out / arm, rs[arm]),
                 "machine": machine[arm]} for arm in ran},
    }
    shares = [m["other_cpu_fraction"] for m in machine.values() if m["other_cpu_fraction"] is not None]
    result["other_cpu_fraction_max"] = max(shares) if shares else None
    result["gap_core_s_per_step"] = _gap(result[TREATED]["core_s_per_step"], result[BASE]["core_s_per_step"])
    charts = []
    for k in gantt_steps(cfg.train.steps, cfg.runtime.gantt_every):
        p = plot_steps({label(arm, cfg): out / arm for arm in ran}, k, RunDir(out).gantt(k),
                       cfg.runtime.time_scale if cfg.runtime.device == "emulated" else 1.0)  # modelled seconds
        if p is not None:
            charts.append(str(p))
    result["gantt"] = charts
    if cfg.runtime.device == "emulated":  # the same numbers in modelled seconds (runtime.time_scale undone)
        from rlhfless.sim.modelled import modelled_report

        result["modelled"] = modelled_report(out, ran, cfg.runtime.time_scale)
    write_json(result, RunDir(out).comparison)
    return result


def _label_summary(run: Path, arm: str, cfg) -> None:
    """The arm's name and label into its summary.json (what it is, for a reader of that file alone)."""
    rd = RunDir(run)
    s = rd.read_summary()
    if s is not None:
        write_json({**s, "arm": arm, "arm_label": label(arm, cfg)}, rd.summary)


def _gap(a: dict, b: dict) -> dict:
    """a - b, component by component (the serverless arm's extra core-seconds per step over the control's)."""
    kinds = sorted(set(a["busy"]) | set(b["busy"]))
    return {"billed": a["billed"] - b["billed"], "cold_start": a["cold_start"] - b["cold_start"],
            "held_idle": a["held_idle"] - b["held_idle"],
            "busy": {k: a["busy"].get(k, 0.0) - b["busy"].get(k, 0.0) for k in kinds}}


def _ratios(a: dict, b: dict) -> dict:
    return {"step_time_ratio": a["step_time_s"] / b["step_time_s"],
            "cost_ratio": a["cost_device_s"] / b["cost_device_s"], "usd_ratio": a["cost_usd"] / b["cost_usd"]}
