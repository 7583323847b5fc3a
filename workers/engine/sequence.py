"""A request inside the engine: its tokens, progress, KV blocks and output state."""

from __future__ import annotations

import enum
import time

from workers.engine.sampling_params import SamplingParams
from workers.protocol.kv_blocks import chain_hash
from workers.protocol.replica import DEFAULT_SHARE


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
        output_token_ids: list[int] = (),
    ):
        """`output_token_ids`: what this request already generated elsewhere (it is resumed on
        this engine after its replica failed); they count as output, not prompt."""
        self.request_id = request_id
        self.params = params
        self.token_ids: list[int] = [*prompt_token_ids, *output_token_ids]
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hash of each full, computed block
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at admission
        self.tier_cached_tokens: dict[str, int] = {}  # of those, the ones a KV tier served, by tier
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.text = ""  # detokenised output (stop strings removed)
        self.emitted_text_len = 0  # how much of `text` step() has reported
        self.eos_token_ids = () if params.ignore_eos else eos_token_ids
        self.detokenizer = None  # an IncrementalDetokenizer when the model has a tokenizer
        self.arrival_time = time.monotonic()
        self.scheduled_at: float | None = None  # when it was first scheduled (the end of its queueing)
        self.num_preemptions = 0
        self.hold_blocks = False  # keep the KV blocks after finishing (see LLMEngine.add_request)
        self.session_turn = False  # a turn of a session: its context starts the next turn's prompt
        self.share = DEFAULT_SHARE  # its priority and tenant (scheduler.py, fair_share.py)
        self.charged_output = 0  # generated tokens fair_share.py has counted
        # Structured output (structured.GrammarState): the grammar state after the output so far.
        self.grammar = None
        # Speculation's backoff (speculative/backoff.py): draft runs in a row that accepted nothing, and
        # steps left before this sequence drafts again.
        self.draft_misses = 0
        self.draft_pause = 0
        self._prefix_hashes: list[int] = []
        # Parallel sampling (parallel_sampling.py): this sample's index among the request's n,
        # and every sample of the request (this one included), sample 0 first.
        self.index = 0
        self.samples: list[Sequence] = [self]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def prefix_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of every full block of `token_ids` (kv_blocks.chain_hash), extended
        as tokens are added."""
        hashes = self._prefix_hashes
        prev = hashes[-1] if hashes else None
        for i in range(len(hashes), self.num_tokens // block_size):
            prev = chain_hash(prev, self.token_ids[i * block_size : (i + 1) * block_size])
            hashes.append(prev)
        return hashes

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"{self.status.value})"
        )
