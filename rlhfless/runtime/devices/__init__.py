"""The worker process on one device unit: `worker` (the process entry, cpu and cuda), `emulated` (compute replaced
by the simulator's modelled time), one op table for both (`ops`: the `Device` protocol), the request bodies
(`decoding`, `ppo_worker`), the learner's reduction (`dist`), CUDA units (`gpus`) and the decode-time profile
(`profile`). Nothing here knows of modes, plans or billing."""
