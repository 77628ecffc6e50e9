"""Typed records passed between modules.

Records are plain frozen dataclasses (or small mutable ones where a stage fills them in). Modules exchange these,
never string-keyed dicts, so a missing field is an error at construction, not a `KeyError` three stages later.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prompt:
    """One task prompt, revisited every epoch.

    prompt_id: stable id across epochs (length history is keyed on it).
    text: the prompt as the model sees it (template applied).
    answer: the verifiable reference answer (for the reward).
    meta: task-specific facts used only for analysis (for example the number of terms).
    """

    prompt_id: str
    text: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class PromptGroup:
    """A prompt and its G samples for one step; filled in stage by stage.

    token_ids: prompt token ids (no padding).
    predicted_len: the predictor's estimate of the response length (tokens), set by the planner stage.
    """

    prompt: Prompt
    token_ids: list[int]
    group_size: int
    predicted_len: float | None = None


@dataclass(frozen=True)
class Sample:
    """One generated response with its reward.

    response_ids: generated token ids, EOS included when the model emitted it, no padding.
    truncated: True when generation stopped at max_new_tokens without EOS.
    """

    group_index: int
    sample_index: int
    response_ids: tuple[int, ...]
    response_text: str
    truncated: bool
    reward: float
    correct: bool
    well_formed: bool

    @property
    def response_len(self) -> int:
        return len(self.response_ids)


@dataclass(frozen=True)
class TraceRow:
    """One line of a length trace (JSONL): the raw material for predictors and the simulator.

    response_len counts generated tokens including EOS; prompt_len counts prompt tokens.
    """

    prompt_id: str
    prompt: str
    epoch: int
    step: int
    sample: int
    prompt_len: int
    response_len: int
    truncated: bool
    reward: float
