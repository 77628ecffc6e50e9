"""The training runs behind tests/test_runtime_ray.py, executed INSIDE a loopback-only network namespace.

    python tests/_ray_runs.py OUT      (run by the test under `unshare -n`; refuses to run anywhere else)

Runs the same tiny serverless config (two decode functions, migration forced) four times: on the local backend
(the reference), on a single-node Ray cluster started by the runtime, on that cluster with one busy decode actor
killed by `ray.kill`, and on a real two-node cluster (head on 127.0.0.1, a second node on 127.0.0.2, both started
with `ray start`) joined at the head's address. Writes OUT/<run>/ (the run folders) and OUT/summary.json.
Not a test module (leading underscore): pytest does not collect it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["train.steps=3", "rollout.prompts_per_step=6", "algo.group_size=4", "rollout.max_new_tokens=64",
        "train.eval_prompts=0", "train.checkpoint_every=0", "train.table_every=1", "tracking.mode=disabled",
        "runtime.gantt_every=0", "task.arith.k_max=6", "runtime.mode=serverless",
        # two decode functions every step, cuts at a low tau: rows really move (across nodes on two nodes)
        "plan.scale=false", "plan.max_actors=2", "plan.migrate=true", "runtime.migrate=always", "plan.tau=0.3",
        "runtime.progress_every=2",
        # a request that never arrives becomes a re-run after 60 s instead of a 10-minute hang (the killed-actor
        # run once queued a fresh actor behind warm workers holding every CPU; rows now go to a warm one first)
        "runtime.invocation_timeout_s=60"]
RAY = Path(sys.executable).with_name("ray")
WARM = "runtime.keep_alive_s=60"
"""Keeps actors across steps (a Ray actor's cold start, ~20 s on 2 busy cores, would dominate every step): the
single-node run exercises scale-to-zero, the other two keep the test set's wall time small. Samples do not
depend on it."""


def only_loopback() -> bool:
    """True inside a namespace whose only interface is lo: nothing Ray sends can leave the machine."""
    return {name for _, name in socket.if_nameindex()} == {"lo"}


def run(out: Path, name: str, extra: list[str]) -> dict:
    from rlhfless.config import load_run_config
    from rlhfless.run.launch import train

    t0 = time.monotonic()
    summary = train(load_run_config(str(ROOT / "experiments/configs/quickstart.yaml"), TINY + extra), out / name,
                    progress=False)
    return {"wall_s": time.monotonic() - t0, "runtime": summary["runtime"]}


def kill_a_busy_decode_actor(killed: list):
    """A runtime hook: `ray.kill` the first decode actor seen working (Ray's own way to lose an actor)."""
    import ray

    def hook(runtime):
        def loop():
            t_end = time.monotonic() + 300
            while not killed and time.monotonic() < t_end:
                for h in list(runtime.workers.pool.handles.values()):
                    stream = runtime.workers.stream  # a hybrid function that went on as a learner rank is not decoding
                    if ("decode" in h.kinds and h.ready_s is not None and h.worker in runtime.workers.pool.working
                            and not (stream is not None and stream.owns(h))):
                        ray.kill(h.actor, no_restart=True)
                        killed.append(h.worker)
                        return
                time.sleep(0.01)
        threading.Thread(target=loop, daemon=True).start()
    return hook


def stop_ray_here() -> None:
    """Stop the cluster started here. `ray stop --force` would kill every Ray process on the machine, another user's
    or another test run's included (it finds them by name); every process in this loopback-only network namespace
    is this run's (this process, its children, and the daemons `ray start` detached), so those are the ones ended."""
    here, me = os.readlink("/proc/self/ns/net"), os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/net") == here:
                os.kill(int(entry), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to read
            continue


def two_nodes(env: dict) -> None:
    common = ["--num-cpus=4", "--disable-usage-stats"]
    subprocess.run([str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", "--port=6379",
                    "--include-dashboard=false", "--resources={\"nodeA\": 1}", *common], env=env, check=True)
    subprocess.run([str(RAY), "start", "--address=127.0.0.1:6379", "--node-ip-address=127.0.0.2",
                    "--resources={\"nodeB\": 1}", *common], env=env, check=True)


def main(out: Path) -> None:
    if not only_loopback():
        sys.exit("tests/_ray_runs.py: refusing to start Ray outside a loopback-only network namespace")
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
                      WANDB_MODE="disabled", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    from rlhfless.runtime import executor

    res = {"local": run(out, "local", []), "ray": run(out, "ray", ["runtime.backend=ray"]),
           "local_warm": run(out, "local_warm", [WARM])}  # the like-for-like reference of the two-node run
    killed: list = []
    executor.RUNTIME_HOOKS.append(kill_a_busy_decode_actor(killed))
    try:
        res["killed"] = run(out, "killed", ["runtime.backend=ray", WARM])
    finally:
        executor.RUNTIME_HOOKS.clear()
    res["killed"]["killed_workers"] = killed
    try:
        two_nodes(dict(os.environ))
        shared = out / "shared-scratch"  # what a cluster of several machines needs: a folder all nodes mount
        shared.mkdir()
        # the head's address, not `auto`: auto reads /tmp/ray's note of the newest cluster, which may be another
        # test run's, started at the same time on this machine in its own namespace
        res["two_node"] = run(out, "two_node", ["runtime.backend=ray", "runtime.ray_address=127.0.0.1:6379", WARM,
                                                f"runtime.scratch_dir={shared}"])
    finally:
        stop_ray_here()
    res["two_node_vs_local_step_time"] = (res["two_node"]["runtime"]["step_time_s"]
                                          / res["local_warm"]["runtime"]["step_time_s"])
    (out / "summary.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
