"""One request as the scheduler and block manager see it."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

from engine.api import SamplingParams

_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Sequence:
    """Token state of one request.

    ``token_ids`` holds the prompt followed by the generated tokens. ``num_computed_tokens`` counts the tokens
    whose KV is in the cache; the rest are computed in the next steps (chunked prefill, or decode).
    """

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    num_hashed_blocks: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    arrival_time: float = field(default_factory=time.monotonic)
    arrival_order: int = field(default_factory=lambda: next(_counter))
    num_preemptions: int = 0
    #: speculative decoding (``engine/core/speculative.py``): tokens this step should verify after the last one,
    #: how many the scheduler may reserve for them, and how far the draft model's own KV reaches
    draft_token_ids: list[int] = field(default_factory=list)
    num_spec_wanted: int = 0
    num_draft_computed: int = 0

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def generated_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_uncomputed_tokens > 1

    @property
    def sort_key(self) -> tuple[int, int]:
        """Smaller runs first: lower priority value, then earlier arrival."""
        return (self.priority, self.arrival_order)
