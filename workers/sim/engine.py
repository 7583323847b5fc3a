"""`SimEngine`: what the replica server calls on `LLMEngine` (workers/engine/llm_engine.py),
without a model. The scheduler, the block manager (paged KV cache, prefix caching,
preemption), parallel sampling and the output processor (detokenising, stop strings, max_tokens,
the context's end) are the real engine's own; the forward pass and the sampler are replaced by
a clock and a deterministic token generator:

- each step sleeps until the time its profile gives for what it computes (profile.py), so a
  replica's throughput, queueing and preemptions behave as the profiled engine's would;
- a request's tokens depend on its prompt and position only, so a request gives the same answer
  on any simulated replica (resumed or not) and a repeated prompt hits the prefix cache. Unless
  the request ignores EOS, the answer ends with EOS after a length also taken from the prompt
  (8 to 135 tokens), as a model's answers do.

Not simulated (refused with a clear error): grammars, speculation, KV tiers, parallel groups and
the prefill/decode roles (their KV transfer)."""

from __future__ import annotations

import json
import logging
import time
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

from workers.engine import admission
from workers.engine.block_manager import BlockManager
from workers.engine.errors import RequestError
from workers.engine.output_processor import OutputProcessor
from workers.engine.outputs import RequestDelta
from workers.engine.parallel_sampling import check_n, due_forks, fork, request_finished
from workers.engine.sampling_params import SamplingParams
from workers.engine.scheduler import Scheduler
from workers.engine.sequence import Sequence
from workers.protocol.model_files import max_context, model_file, read_config, served_context
from workers.protocol.replica import DEFAULT_SHARE, Share
from workers.protocol.tokenizer import Tokenizer
from workers.sim.profile import SimProfile

log = logging.getLogger(__name__)
MIN_ANSWER, ANSWER_SPREAD = 8, 128  # answer lengths when EOS is not ignored: 8 .. 135 tokens


@dataclass(frozen=True)
class SimConfig:
    model: str
    profile: SimProfile
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    kv_cache_bytes: int = 512 << 20
    fair_share: bool = True  # as EngineConfig's


@dataclass
class StepTiming:
    """The last steps' modelled and measured seconds (tests compare the two)."""

    modelled: float = 0.0
    measured: float = 0.0
    steps: int = 0


class SimEngine:
    def __init__(self, config: SimConfig):
        self.config = config
        self.profile = config.profile
        raw = read_config(config.model)
        self.vocab_size = int(raw.get("vocab_size") or 0)
        if self.vocab_size < 2:
            raise RequestError(f"{config.model}: config.json has no vocab_size")
        self.tokenizer = Tokenizer(config.model) if model_file(config.model, "tokenizer.json").is_file() else None
        self.eos_token_ids = _eos_ids(config.model, raw, self.tokenizer)
        blocks = config.kv_cache_bytes // (config.block_size * self.profile.kv_bytes_per_token)
        self.max_model_len = min(served_context(max_context(raw), config.max_model_len), blocks * config.block_size)
        if self.max_model_len < 2:
            raise RequestError("the KV cache budget is too small to hold a single request; raise it")
        self.block_manager = BlockManager(blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, fair_share=config.fair_share
        )
        self.output = OutputProcessor(self.tokenizer, self.max_model_len)
        self.requests: dict[str, Sequence] = {}
        self.num_generated_tokens = 0
        self.timing = StepTiming()

    # -- requests -----------------------------------------------------------------------------
    def check_grammar(self, params: SamplingParams) -> None:
        if params.grammar is not None:
            message = "structured outputs are not simulated: this replica runs the simulated engine"
            raise RequestError(message, "response_format")

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        admission.check_prompt(prompt_token_ids, self.vocab_size, self.max_model_len)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        hold_blocks: bool = False,
        output_token_ids: list[int] = (),
        emitted_text_len: int = 0,
        session_turn: bool = False,
        share: Share = DEFAULT_SHARE,
    ) -> Sequence:
        check_n(sampling_params, hold_blocks, output_token_ids)
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        self.check_grammar(sampling_params)
        self.check_prompt([*prompt_token_ids, *output_token_ids])
        admission.check_params(sampling_params, self.vocab_size)
        seq = Sequence(request_id, prompt_token_ids, sampling_params, self.eos_token_ids, output_token_ids)
        seq.session_turn = session_turn
        seq.share = share
        self.output.attach(seq)
        self.output.replay(seq, emitted_text_len)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id: str) -> bool:
        seq = self.requests.pop(request_id, None)
        if seq is None or all(sample.is_finished for sample in seq.samples):
            return False
        for sample in seq.samples:
            if not sample.is_finished:
                sample.finish_reason = "abort"
                self.scheduler.finish(sample)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """Schedule as the real engine does, wait out the profile's time for the batch, then
        hand each sequence that reached its last token the next one."""
        started = time.monotonic()
        batch = self.scheduler.schedule()
        if batch.is_empty:
            return []
        prefill_tokens = sum(item.num_tokens for item in batch.prefills)
        context_tokens = sum(item.seq.num_computed_tokens + 1 for item in batch.decodes)
        modelled = self.profile.step_seconds(prefill_tokens, len(batch.decodes), context_tokens)
        sampling = [item.seq for item in batch.all if item.samples]  # before marking: it reads the computed count
        for item in batch.all:
            self.block_manager.mark_computed(item.seq, item.num_tokens)
        for parent in due_forks(sampling):
            children = fork(parent, self.block_manager)
            for child in children:
                self.output.attach(child)
            self.scheduler.add_forked(children)
        remaining = started + modelled - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        self.timing.modelled += modelled
        self.timing.measured += time.monotonic() - started
        self.timing.steps += 1
        deltas = []
        for seq in sampling:
            token = self._next_token(seq)
            entry = {token: 0.0} if seq.logprobs is not None else None
            deltas.append(self._process(seq, token, entry))
        return deltas

    def _next_token(self, seq: Sequence) -> int:
        """The same prompt gives the same answer: tokens hash the prompt and the position (and the
        sample's index, so that `n` samples differ)."""
        seed = getattr(seq, "sim_seed", None)
        if seed is None:  # once per sequence: hashing a long prompt every step would cost O(prompt)
            prompt = array("q", seq.token_ids[: seq.num_prompt_tokens]).tobytes()
            seed = seq.sim_seed = zlib.crc32(prompt) + 7919 * seq.index
        position = seq.num_output_tokens
        if seq.eos_token_ids and position >= MIN_ANSWER + seed % ANSWER_SPREAD:
            return seq.eos_token_ids[0]
        token = (seed + 40503 * (position + 1)) % self.vocab_size
        while token in self.eos_token_ids:
            token = (token + 1) % self.vocab_size
        return token

    def _process(self, seq: Sequence, token: int, logprobs: dict | None) -> RequestDelta:
        delta = self.output.process(seq, [token], [logprobs])
        self.num_generated_tokens += len(delta.new_token_ids)
        if delta.finished:
            self.scheduler.finish(seq)
            if request_finished(seq):
                self.requests.pop(seq.request_id, None)
        return delta

    # -- what the replica reads -----------------------------------------------------------------
    def take_kv_events(self) -> tuple[list[int], list[int]]:
        return self.block_manager.take_kv_events()

    def take_kv_snapshot(self) -> list[int]:
        return self.block_manager.take_kv_snapshot()

    def stats(self) -> dict:
        return admission.batch_stats(self.scheduler, self.block_manager, self.num_generated_tokens, 0)

    def tier_stats(self) -> None:
        return None

    def speculation_stats(self) -> None:
        return None

    def check_health(self) -> None:
        pass

    def close(self) -> None:
        pass


def _eos_ids(model_dir: str, raw: dict, tokenizer: Tokenizer | None) -> tuple[int, ...]:
    """config.json's and generation_config.json's EOS ids, else the tokenizer's."""
    ids: list[int] = []
    sources = [raw.get("eos_token_id")]
    generation = Path(model_file(model_dir, "generation_config.json"))
    if generation.is_file():
        sources.append(json.loads(generation.read_text()).get("eos_token_id"))
    for source in sources:
        for token in [source] if isinstance(source, int) else source or []:
            if token not in ids:
                ids.append(token)
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(ids)
