"""The Ray backend end to end: same samples as the local backend, the same meter, two real nodes, a killed actor.

Ray must never send a packet off these machines, so every run happens in `tests/_ray_runs.py`, executed inside a
loopback-only network namespace (`unshare -n`); the tests here only read what it wrote. Marked `ray` (not in the
default run: `make test-ray`); skipped with the reason when Ray is missing or the namespace cannot be made.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfless.plan.cost import price
from rlhfless.run.compare import samples_match
from rlhfless.runtime.meter import bill_run
from rlhfless.runtime.records import InvocationRecord, WorkerRecord

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[1]
HOME, OTHER = "127.0.0.1", "127.0.0.2"


def _why_not() -> str | None:
    """Why the Ray runs cannot happen here, or None."""
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install -e '.[ray]')"
    if shutil.which("unshare") is None:
        return "no unshare(1): cannot make the loopback-only network namespace Ray must run in here"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    if probe.returncode:
        return ("cannot make a loopback-only network namespace (unshare -n needs root or CAP_SYS_ADMIN: "
                f"{probe.stderr.strip()[:200]}); Ray must not run outside one on these machines")
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("ray")
    script = f"ip link set lo up && exec {shlex.quote(sys.executable)} tests/_ray_runs.py {shlex.quote(str(out))}"
    r = subprocess.run(["unshare", "-n", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, f"ray runs failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return out, json.loads((out / "summary.json").read_text())


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _records(run: Path) -> tuple[list[WorkerRecord], list[InvocationRecord]]:
    def build(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if k in ("kinds", "cores") else v for k, v in d.items() if k in names})
    return ([build(WorkerRecord, d) for d in _rows(run / "workers.jsonl")],
            [build(InvocationRecord, d) for d in _rows(run / "invocations.jsonl")])


def test_single_node_ray_gives_the_local_backends_samples_every_step(runs):
    out, _ = runs
    identical, first, n = samples_match(out / "local", out / "ray")
    assert n == 3 and identical, f"ray samples differ from the local backend's from step {first}"


def test_ray_records_feed_the_same_meter(runs):
    out, res = runs
    workers, invocations = _records(out / "ray")
    assert workers and all(w.released_s is not None for w in workers), "every actor is released (scale to zero)"
    ready = [w for w in workers if w.ready_s is not None]  # one released before it connected has no node
    assert ready and {w.node for w in ready} == {HOME} and all(w.pid > 0 for w in ready)
    rt = res["ray"]["runtime"]
    bill = bill_run(workers, invocations, 1e9, price("cpu-core"), False, 0.001)
    assert bill.device_s == pytest.approx(rt["cost_device_s"], rel=1e-9)
    assert {"decode", "learner"} <= set(rt["billed_s_by_kind"]) and rt["migrated_seqs"] > 0


def test_two_node_cluster_places_functions_on_both_nodes_and_matches(runs):
    out, _ = runs
    identical, first, n = samples_match(out / "local", out / "two_node")
    assert n == 3 and identical, f"two-node samples differ from step {first}"
    workers = {w["worker"]: w for w in _rows(out / "two_node" / "workers.jsonl")}
    assert {w["node"] for w in workers.values() if w["ready_s"] is not None} == {HOME, OTHER}
    assert all(w["node"] == HOME for w in workers.values() if w["kinds"] == ["learner"])
    decode = [i for i in _rows(out / "two_node" / "invocations.jsonl") if i["kind"] == "decode" and i["groups"]]
    for step in {i["step"] for i in decode}:  # locality: the largest share of rows runs on the learner's node
        sent = [i for i in decode if i["step"] == step and i["attempt"] == 1]
        most = max(len(i["groups"]) for i in sent)
        assert any(workers[i["worker"]]["node"] == HOME for i in sent if len(i["groups"]) == most), step


def test_a_ray_killed_actor_is_a_dead_worker_whose_work_is_re_run(runs):
    out, res = runs
    k = res["killed"]
    assert k["killed_workers"], "the hook never found a busy decode actor to kill"
    assert k["runtime"]["workers_killed"] >= 1 and k["runtime"]["retries"] >= 1
    identical, first, n = samples_match(out / "local", out / "killed")
    assert n == 3 and identical, f"samples after the kill differ from step {first}"
    failed = [i for i in _rows(out / "killed" / "invocations.jsonl") if not i["ok"]]
    assert failed and failed[0]["worker"] == k["killed_workers"][0]


def test_overlap_streams_groups_on_ray_and_ends_with_the_local_backends_weights(runs):
    """runtime.overlap is on (serverless, kl 0): finished groups reach the learner during decode on Ray too, on one
    node and across two, and the final weights equal the local backend's byte for byte."""
    from rlhfless.run.compare import weights_digest

    out, _ = runs
    for name in ("ray", "two_node"):
        assert sum(r["runtime/learner_compute_before_rollout_end"] for r in _rows(out / name / "metrics.jsonl")) > 0, name
        assert weights_digest(out / name) == weights_digest(out / "local") is not None, name
