"""Data-parallel learner: 2 real processes (gloo on 127.0.0.1) end equal to the single-process update.

The 2-rank run (tests/_dp_worker.py, started as separate interpreters, data through files) covers token_mean
(its second batch keeps one group, so one rank trains nothing) and a per-sequence mode with inner_epochs 2 and
kl_coef > 0;
after each of two updates both ranks' weights must equal the single-process weights (atol 1e-6) and each other
bitwise, and the metrics must match. Removing the all-reduce or the global denominator breaks these (the
in-process controls below show the tolerance is tight enough to see it). Also: the balanced split, the learner
state round trip (bitwise), and that a dead peer surfaces as an exception within seconds.

The model runs in float64 here (both paths). In float32 the summed rank gradients equal the full-batch gradient
to ~5e-8 absolute (float rounding: other padding widths and summation order), but AdamW's first step is close to
lr * sign(g) and turns that rounding into up to ~2e-6 weight differences (lr 1e-4) on the few elements whose
gradient is within a few eps (1e-8) of zero; that is Adam's sensitivity, not a data-parallel error, and float64
removes it so atol 1e-6 tests the math and not the rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhfless.core import metrics as M
from rlhfless.algo import GRPOConfig
from rlhfless.learn.config import OptimConfig
from rlhfless.learn.dataparallel import Shard, split_groups
from rlhfless.learn.learner import Learner, load_learner_state, save_learner_state
from rlhfless.model.factory import load_checkpoint
from rlhfless.rollout.forward import response_logprobs
from rlhfless.runtime.devices.dist import free_port

REPO = Path(__file__).resolve().parents[1]
CKPT = REPO / "data" / "checkpoints" / "sft"
G = 4
OPTIM = {"lr": 1e-4, "grad_clip": 1.0, "weight_decay": 0.01}  # the default lr; weight moves ~1e-4 per step


def _batch(seed: int, varied: tuple[int, ...]) -> dict:
    """4 prompts x G=4 with varied prompt and response lengths (one response empty); groups in `varied` get
    rewards with variance, the others a constant reward (filtered out)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (5, 9, 3, 7)]
    lengths = torch.randint(1, 14, (4 * G,), generator=gen).tolist()
    lengths[5] = 0
    responses = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in lengths]
    rewards = []
    for g in range(4):
        rewards += torch.rand(G, generator=gen).tolist() if g in varied else [1.0] * G
    return {"prompts": prompts, "responses": responses, "rewards": rewards}


CASES = [
    # update 2 keeps one group only, so one rank has nothing to train and joins the all-reduce with zeros
    {"name": "token_mean", "algo": {"group_size": G}, "ref": False,
     "batches": [_batch(1, (0, 2, 3)), _batch(5, (2,))]},
    {"name": "seq_mean_epochs2_kl",
     "algo": {"group_size": G, "loss_agg": "seq_mean_token_mean", "inner_epochs": 2, "kl_coef": 0.1},
     "ref": True, "batches": [_batch(3, (0, 1, 2, 3)), _batch(4, (1, 2))]},
]
for _c in CASES:
    _c["optim"] = OPTIM


def _ref_logp(batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return response_logprobs(_model(), batch["prompts"], batch["responses"], G).logp


def _model():
    return load_checkpoint(CKPT).double()  # see the module docstring


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.model.state_dict().items()}


def _single(case: dict, refs: dict) -> list[tuple[dict, dict]]:
    """(weights, metrics) after each update of the single-process learner."""
    learner = Learner(_model(), OptimConfig(**case["optim"]), GRPOConfig(**case["algo"]))
    out = []
    for u, b in enumerate(case["batches"]):
        m = learner.update(b["prompts"], b["responses"], torch.tensor(b["rewards"]), refs.get(f"{case['name']}/{u}"))
        out.append((_weights(learner), m))
    return out


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    """Runs the 2 ranks (while the single-process reference runs here); returns (workdir, single results)."""
    from safetensors.torch import save_file

    work = tmp_path_factory.mktemp("dp")
    refs = {f"{c['name']}/{u}": _ref_logp(b).contiguous() for c in CASES if c["ref"]
            for u, b in enumerate(c["batches"])}
    save_file(refs, str(work / "ref.safetensors"))
    (work / "spec.json").write_text(json.dumps({"checkpoint": str(CKPT), "dtype": "float64", "cases": CASES}))
    port, dead_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "_dp_worker.py"), str(r), "2", str(port),
                               str(dead_port), str(work)], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    single = {c["name"]: _single(c, refs) for c in CASES}
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        errs.append((p.returncode, err[-3000:]))
    assert all(rc == 0 for rc, _ in errs), errs
    return work, single


@pytest.mark.parametrize("case", [c["name"] for c in CASES])
def test_two_process_update_equals_single_process(dp_run, case):
    from safetensors.torch import load_file

    work, single = dp_run
    for u, (want_w, want_m) in enumerate(single[case]):
        ranks = [load_file(str(work / f"{case}-r{r}-u{u}.safetensors")) for r in range(2)]
        for name, t in ranks[0].items():
            assert torch.equal(t, ranks[1][name]), f"replicas diverged at {name}"  # same AdamW on same grads
            if name.startswith("model/"):
                w = want_w[name[len("model/"):]]
                assert torch.allclose(t, w, atol=1e-6, rtol=0), (case, u, name, (t - w).abs().max().item())
        for r in range(2):
            got = json.loads((work / f"{case}-r{r}-u{u}.json").read_text())
            assert got.keys() == want_m.keys()
            for k, v in want_m.items():
                assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (case, u, r, k)
    assert any(single[case][0][1][k] != 0 for k in (M.LOSS, M.PG_LOSS))


def test_dead_peer_raises_within_the_timeout(dp_run):
    work, _ = dp_run
    dead = json.loads((work / "dead.json").read_text())
    assert dead["error"] is not None and dead["seconds"] < 10, dead


def _no_reduce_update(case: dict) -> dict[str, torch.Tensor]:
    """Rank 0's update if its gradients were never summed with rank 1's (the all-reduce removed)."""
    learner = Learner(_model(), OptimConfig(**case["optim"]), GRPOConfig(**case["algo"]))
    b = case["batches"][0]
    learner.update(b["prompts"], b["responses"], torch.tensor(b["rewards"]), shard=Shard(0, 2, lambda t: None))
    return _weights(learner)


def test_tolerance_is_tight_enough_to_catch_a_missing_all_reduce():
    case = CASES[0]
    (want, _), = _single({**case, "batches": case["batches"][:1]}, {})
    got = _no_reduce_update(case)
    assert max((got[k] - want[k]).abs().max().item() for k in want) > 2e-5


def test_world_one_shard_equals_single_process():
    case = CASES[1]
    refs = {f"{case['name']}/0": _ref_logp(case["batches"][0])}
    (want_w, want_m), = _single({**case, "batches": case["batches"][:1]}, refs)
    learner = Learner(_model(), OptimConfig(**case["optim"]), GRPOConfig(**case["algo"]))
    b = case["batches"][0]
    got = learner.update(b["prompts"], b["responses"], torch.tensor(b["rewards"]), refs[f"{case['name']}/0"],
                         shard=Shard(0, 1, lambda t: None))
    for k, w in want_w.items():
        assert torch.allclose(learner.model.state_dict()[k], w, atol=1e-6, rtol=0), k
    assert got == pytest.approx(want_m, rel=1e-5, abs=1e-6)


def test_split_groups_is_contiguous_balanced_and_total():
    assert split_groups([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    assert split_groups([30, 5, 5, 5, 5], 2) == [(0, 1), (1, 5)]
    assert split_groups([7], 3) == [(0, 0), (0, 1), (1, 1)]  # fewer groups than ranks: empty chunks
    assert split_groups([], 2) == [(0, 0), (0, 0)]
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(0, 50, (23,), generator=gen).tolist()
    for world in (1, 2, 3, 5):
        chunks = split_groups(w, world)
        assert chunks[0][0] == 0 and chunks[-1][1] == len(w)
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        loads = [sum(w[a:b]) for a, b in chunks]
        assert max(loads) - min(loads) <= 2 * max(w)
    with pytest.raises(ValueError):
        split_groups([1], 0)
    with pytest.raises(ValueError):
        Shard(2, 2, lambda t: None)


def test_learner_state_round_trip_continues_bitwise(tmp_path):
    case = CASES[0]
    b1, b2 = case["batches"]
    make = lambda: Learner(_model(), OptimConfig(**case["optim"]), GRPOConfig(**case["algo"]))  # noqa: E731
    a = make()
    a.update(b1["prompts"], b1["responses"], torch.tensor(b1["rewards"]))
    path = save_learner_state(a, tmp_path / "learner.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["learner.safetensors"]  # no temporary left behind
    b = make()
    load_learner_state(b, path)
    assert (b.updates, b.last_grad_norm) == (a.updates, a.last_grad_norm)
    ma = a.update(b2["prompts"], b2["responses"], torch.tensor(b2["rewards"]))
    mb = b.update(b2["prompts"], b2["responses"], torch.tensor(b2["rewards"]))
    assert ma == mb
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    sa, sb = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
    assert all(torch.equal(sa[i][n], sb[i][n]) for i in sa for n in sa[i])


def test_load_learner_state_refuses_other_files(tmp_path):
    from safetensors.torch import save_file

    from rlhfless.core.errors import DataError

    bad = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(1)}, str(bad), metadata={"format": "other"})
    learner = Learner(_model(), OptimConfig(), GRPOConfig(group_size=G))
    with pytest.raises(DataError, match="not an rlhfless learner state"):
        load_learner_state(learner, bad)
    (tmp_path / "junk.safetensors").write_bytes(b"garbage")
    with pytest.raises(DataError, match="not a readable"):
        load_learner_state(learner, tmp_path / "junk.safetensors")


def test_non_finite_loss_raises_after_the_all_reduce_on_every_rank():
    from rlhfless.core.errors import TrainingError

    calls = []
    learner = Learner(_model(), OptimConfig(**OPTIM), GRPOConfig(group_size=G))
    with torch.no_grad():
        learner.model.get_input_embeddings().weight.fill_(float("nan"))
    b = CASES[0]["batches"][0]
    with pytest.raises(TrainingError, match="non-finite loss"):
        learner.update(b["prompts"], b["responses"], torch.tensor(b["rewards"]), shard=Shard(0, 1, calls.append))
    assert len(calls) == 1  # reached the collective, so the peers are not left waiting in it
