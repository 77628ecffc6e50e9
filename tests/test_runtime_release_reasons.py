"""Why the pool let each worker go (`WorkerRecord.release_reason`), stamped where it decides, on real (emulated,
torch-free) worker processes: at a share, at a keep-alive's lapse, evicted for units, stopped, killed, at the end.
The simulator's validation reads these instead of guessing them from timestamps (issue 30, item 8)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from rlhfless.core.errors import DataError
from rlhfless.runtime.platform.backend import LocalBackend
from rlhfless.runtime.platform.pool import Pool
from rlhfless.runtime.records import RELEASE_REASONS, WorkerRecord, now
from rlhfless.sim.devicemodel import LengthTable


def test_a_record_rejects_an_unknown_release_reason_and_old_rows_default_to_none():
    with pytest.raises(DataError, match="release_reason"):
        WorkerRecord("d-0", ("decode",), 1.0, (0,), 0.0, release_reason="bored")
    w = WorkerRecord("d-0", ("decode",), 1.0, (0,), 0.0, 0.1, 2.0)
    assert w.release_reason is None and json.loads(json.dumps(w.to_json()))["release_reason"] is None
    assert "share" in RELEASE_REASONS and "lapse" in RELEASE_REASONS


def _await_death(pool: Pool, h) -> None:
    """Wait for a killed worker's pipe to close (an event), then let the pool record it."""
    while not any(msg is None for _, msg in pool.backend.poll([h], 60.0)):
        pass
    pool.dead(h)


def test_the_pool_records_why_it_released_each_worker(tmp_path):
    from rlhfless.runtime.wire import EMULATED_PRELOAD as PRELOAD

    t = LengthTable([[[30, 40, 5, 12]]], None, "L40S", "qwen2.5-3b", 512, 400.0, "test")
    t.save(tmp_path / "lengths.json")
    setup = {"emulated": {"table": str(tmp_path / "lengths.json"), "time_scale": 0.01, "algo": "grpo", "G": 4,
                          "max_new_tokens": 64, "skip_zero_variance": False}, "version": 0}
    pool = Pool(LocalBackend("forkserver", PRELOAD), setup, now(), units=6, keep_alive_s=3600.0)
    try:
        hs = [pool.start(("decode", "learner"), (u,)) for u in range(6)]
        pool.await_ready(hs)
        share, evicted, lapsed, stopped, killed, last = hs
        for h in hs:
            pool.busy(h)  # all invoked: none idle, so each release below picks exactly the one meant
        pool.idle(share)
        pool.release(share, early=True)  # the plan had no work for it inside its keep-alive
        pool.idle(evicted)
        assert pool.make_room(2)  # one unit was free (share's): evicts the only idle worker
        pool.stop(stopped)
        os.kill(pool.records[killed.worker].pid, signal.SIGKILL)
        _await_death(pool, killed)
        pool.idle(lapsed)
        pool.keep_alive_s = 0.0  # its keep-alive lapses at once: no waiting on a clock
        assert pool.expire() == [lapsed.worker]
        pool.release_all()
        got = {w: r.release_reason for w, r in pool.records.items()}
        assert got == {share.worker: "share", evicted.worker: "evicted", lapsed.worker: "lapse",
                       stopped.worker: "stopped", killed.worker: "killed", last.worker: "end"}
        # what workers.jsonl holds (`Runtime.release` writes `to_json()`)
        assert {r.to_json()["release_reason"] for r in pool.records.values()} == set(got.values())
        assert [w for _, w in pool.released_early] == [share.worker]
        assert [w for _, w in pool.expired] == [lapsed.worker]
    finally:
        pool.release_all()
        pool.backend.close()
