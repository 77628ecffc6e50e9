"""The real runtime: a step's stages run by worker processes (functions), decided by a mode's policy, and billed.

Reading order: `executor` (the `Runtime`: one step's stages, the step window, the bill; the one owner of the run's
mutable state), `context` (`StepContext`: the typed view of one step a stage is given), `policy` (`ModePolicy`:
every decision that differs by mode), `stages` (decode with live cut-and-migrate; the reference), `streaming`
(the learner as a stream of finished groups; serverless ranks leave at their share, the last one in reduces),
`pool` (worker lifecycles, keep-alive as an event), `meter` (records to device-seconds). Then by concern:
  * policy: `policy` (splits, pre-warm rules, prefix-KV shipping, roles, fault scope, billing; a new platform is
    a registered `ModePolicy` subclass), `plan.ranks` (when a learner rank goes);
  * workers: `worker` (the request loop and handlers), `decoding` (the decode body), `ppo_worker`, `emulated`
    (compute replaced by the simulator's modelled time), `wire` (messages and tensor files), `dist` (the
    learner's reduction: the pool's gathered all-reduce, the serverless shares; one rank-order sum);
  * platforms: `backend` (local processes), `raybackend` (Ray actors), `gpus` (CUDA units);
  * PPO: `ppo_stages`; the loop's view: `loop_stages`;
  * measurement: `records`, `profile` (the studies of runs live above: `run.compare`, `run.gantt`,
    `run.contention`, `bench.faults`; the emulated arms' report in `sim.emulated`);
  * `config` (`RuntimeConfig`).
Rule kept: nothing here imports the loop, the runner or the run config at the top (a test holds the boundary).
"""
