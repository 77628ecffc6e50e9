"""What a worker's death costs the work it interrupts: the runtime's one rule of attempts, in both modes.

A piece of a step's work (a decode function's rows, a learner rank's groups, the serverful pool's start) has
`runtime.max_attempts` attempts. The rule (issue 43):

- **Only a failure of the work while it runs uses an attempt**: the worker that died had been sent the work and
  was ready (its cold start over), so it was running it.
- **A restart is not a failed attempt.** Work that starts over because another worker died (the serverful pool
  restarts whole: its gloo group is broken) uses none of its attempts; nor does a death of its own worker before
  the worker could run it (still starting). Those deaths are counted on a separate budget of the same size,
  `lost_starts`, so a worker that can never start still stops the run instead of looping.
- **Failures count while consecutive**: the work succeeding starts its count again.

Before this rule every restart of the serverful pool charged one attempt to every decode function still owed,
so kills of other workers during restarts stopped 2 of 3 serverful fault-bench runs (issue 43).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfless.runtime.records import fail


def running(sent: bool, ready_s: float | None) -> bool:
    """Whether a worker that just died was running a piece of work: it had been sent it and had said ready (a
    worker sent work during its cold start runs it only once started). Pure."""
    return sent and ready_s is not None


@dataclass
class Attempts:
    """The attempts of one piece of work: `number` is the attempt running now (1 + the consecutive failures while
    it ran), `lost_starts` the consecutive deaths before it could run. `label` names the work in the error."""

    label: str
    limit: int
    number: int = 1
    lost_starts: int = 0

    def failed(self, was_running: bool) -> bool:
        """Its worker died. Returns whether that used an attempt (the record of the next try carries `number`);
        raises TrainingError (the run stops with its last good checkpoint) once `limit` are used."""
        if not was_running:
            self.lost_starts += 1
            if self.lost_starts >= self.limit:
                raise fail(f"the worker of {self.label} (it died before it could start the work)", self.lost_starts)
            return False
        self.lost_starts = 0
        if self.number >= self.limit:
            raise fail(self.label, self.number)
        self.number += 1
        return True

    def succeeded(self) -> None:
        """The work is done: a later failure of it (a step restarted from its start) starts a new count."""
        self.number, self.lost_starts = 1, 0
