"""The weight store: the learner's (and PPO's critic's) state as versioned files, the one way weights move.

The rule it keeps: weights move only as the learner's state file `learner-v<k>.safetensors` (k = optimiser steps
done), kept until the version after next is written, so a killed learner is re-run from it exactly and a worker
pre-warmed moments before an update may still load the version it was started with.
"""

from __future__ import annotations

from pathlib import Path


class WeightStore:
    """Versioned state files in the run's scratch folder: what a new function loads, what an update writes."""

    def __init__(self, scratch: Path, learner, critic=None):
        from rlhfless.learn.learner import save_learner_state

        self.scratch = scratch
        self.version = learner.updates
        save_learner_state(learner, self.state_path(self.version))
        self.ppo = critic is not None
        if self.ppo:  # the critic moves between its functions as a state file, like the policy
            from rlhfless.learn.critic import save_critic_state

            save_critic_state(critic, self.critic_path(self.version))

    def state_path(self, version: int) -> Path:
        return self.scratch / f"learner-v{version}.safetensors"

    def critic_path(self, version: int) -> Path:
        return self.scratch / f"critic-v{version}.safetensors"

    def updates_done(self) -> int:
        """The state version: optimiser steps done so far."""
        return self.version

    def next_state_path(self) -> Path:
        return self.state_path(self.version + 1)

    def next_critic_path(self) -> Path:
        return self.critic_path(self.version + 1)

    def state_setup(self) -> dict:
        """What a function loads the current policy from (a worker's setup, a request's fields)."""
        return {"state_path": str(self.state_path(self.version)), "version": self.version}

    def critic_setup(self) -> dict:
        """PPO: where the critic of this step's version is (`runtime.devices.ppo_worker.sync_critic`)."""
        return {"critic_state": str(self.critic_path(self.version)), "critic_version": self.version}

    def advance(self) -> None:
        """An update wrote the next version: it is current now, and the one before the previous goes (the previous
        stays: a worker started moments ago may still be loading it)."""
        self.version += 1
        self.state_path(self.version - 2).unlink(missing_ok=True)
        self.critic_path(self.version - 2).unlink(missing_ok=True)

    def sync_learner(self, learner) -> None:
        """Bring the driver's learner (for eval and checkpoints) to the latest version."""
        from rlhfless.learn.learner import load_learner_state

        if learner.updates != self.version:
            load_learner_state(learner, self.state_path(self.version))

    def sync_critic(self, critic) -> None:
        """PPO: bring the driver's critic (for checkpoints) to the latest version."""
        from rlhfless.learn.critic import load_critic_state

        if critic.updates != self.version:
            load_critic_state(critic, self.critic_path(self.version))
