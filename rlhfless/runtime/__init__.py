"""The real runtime: a step's stages run by worker processes (functions), decided by a mode's policy, and billed.

Four concerns, one floor each (tests/test_layering.py holds the order: a folder imports only those below it):
  * the driver (this folder's modules): `executor` (the thin `Runtime`: the step API, the bill) over four
    collaborators that own the run's state: `workerset` (placement, start / keep / release), `ledger` (invocations,
    counts), `weights` (versioned state files), `clock` (windows, history, pre-warm times, calibration as data);
    `context` (`StepContext`: the typed view of one step a stage is given), `stages` (decode with live
    cut-and-migrate; the reference), `streaming` (the learner as a stream of finished groups), `ppo_stages`,
    `loop_stages` (the step loop's `Stages` port), `meter` (records to device-seconds), `config` (`RuntimeConfig`);
  * `modes/`: every decision that differs by mode (`policy`: `ModePolicy` and its registry), returned as data
    that `workerset` carries out (a mode never starts, keeps or releases a worker itself);
  * `platform/`: where workers run: `backend` (local processes), `raybackend` (Ray actors), `pool` (lifecycles,
    keep-alive as an event, the units budget);
  * `devices/`: the worker process: `worker` (cpu, cuda), `emulated` (modelled compute), one op table (`ops`), what
    a device asks of the driver (`setup`), `decoding`, `ppo_worker`, `dist` (one rank-order sum), `gpus`, `profile`;
  * shared by all four: `wire` (messages, tensor files, the fork server's preload), `records` (typed records).
Studies of runs live above: `run.compare`, `run.gantt`, `run.contention`, `bench.faults`, `sim.modelled`.
Rule kept: nothing here imports the runner, the benchmarks, `repro` or the CLI (a test holds the boundary); the
driver reads the run config (`rlhfless.config`) and drives the step loop's `Stages` port (`step.loop`).
"""
