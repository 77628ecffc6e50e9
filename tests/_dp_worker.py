"""Child process of tests/test_learner_dp.py: one rank of a real 2-process data-parallel learner.

Usage: python tests/_dp_worker.py RANK WORLD PORT DEAD_PORT WORKDIR. Reads WORKDIR/spec.json (cases, batches) and
WORKDIR/ref.safetensors (reference log-probs); writes, per case and update, the learner state
(`save_learner_state`) and the returned metrics; then joins a second group on DEAD_PORT where rank 1 leaves
before the all-reduce and rank 0 records what its all-reduce raised (dead.json). Data travels through files and
arguments only, never pickled models.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def main(rank: int, world: int, port: int, dead_port: int, work: Path) -> None:
    torch.set_num_threads(1)
    from safetensors.torch import load_file

    from rlhfless.algo import GRPOConfig
    from rlhfless.learn.config import OptimConfig
    from rlhfless.learn.dataparallel import Shard
    from rlhfless.learn.learner import Learner, save_learner_state
    from rlhfless.model.factory import load_checkpoint
    from rlhfless.runtime.devices.dist import destroy_group, init_group

    spec = json.loads((work / "spec.json").read_text())
    refs = load_file(str(work / "ref.safetensors"))
    t0 = time.perf_counter()
    shard = Shard(rank, world, init_group(rank, world, port, timeout_s=60))
    init_s = time.perf_counter() - t0
    for case in spec["cases"]:
        model = load_checkpoint(spec["checkpoint"]).to(getattr(torch, spec["dtype"]))
        learner = Learner(model, OptimConfig(**case["optim"]), GRPOConfig(**case["algo"]))
        for u, b in enumerate(case["batches"]):
            m = learner.update(b["prompts"], b["responses"], torch.tensor(b["rewards"]),
                               refs.get(f"{case['name']}/{u}"), shard=shard)
            save_learner_state(learner, work / f"{case['name']}-r{rank}-u{u}.safetensors")
            (work / f"{case['name']}-r{rank}-u{u}.json").write_text(json.dumps(m))
    destroy_group()

    all_reduce = init_group(rank, world, dead_port, timeout_s=5)
    if rank == 1:
        return  # leaves without joining the all-reduce: the process exits and its connections close
    t0 = time.perf_counter()
    try:
        all_reduce(torch.ones(8))
        err = None
    except RuntimeError as exc:
        err = str(exc)[:300]
    (work / "dead.json").write_text(json.dumps({"error": err, "seconds": time.perf_counter() - t0,
                                                "init_s": init_s}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
