"""The engine loop: requests in, one batched model step at a time, token deltas out.

`LLMEngine` is what the replica process drives (`add_request` / `step` / `abort_request`);
`LLM` (llm.py) wraps it for offline use.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from workers.engine import admission
from workers.engine.block_manager import BlockManager
from workers.engine.config import EngineConfig, ModelConfig, parse_dtype
from workers.engine.errors import RequestError, describe
from workers.engine.executor import DeviceExecutor, make_executor
from workers.engine.loader import eos_token_ids, weights_identity
from workers.engine.no_tiers import NoTiers
from workers.engine.output_processor import OutputProcessor
from workers.engine.outputs import RequestDelta
from workers.engine.parallel.config import ParallelConfig
from workers.engine.parallel_sampling import check_n, due_forks, fork, request_finished
from workers.engine.sampler import Sampler
from workers.engine.sampling_params import SamplingParams
from workers.engine.scheduler import ScheduledSeq, Scheduler
from workers.engine.sequence import Sequence
from workers.engine.speculative import SpeculativeConfig, make_speculator
from workers.engine.structured import Grammars, grammar_state
from workers.engine.tiered_cache import KVTierConfig, TieredCache
from workers.protocol.model_files import read_config, served_context
from workers.protocol.replica import DEFAULT_SHARE, Share
from workers.protocol.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def resolve_dtype(requested: str, device: torch.device, config_dtype: str) -> torch.dtype:
    if requested != "auto":
        return parse_dtype(requested)
    if device.type == "cpu":
        return torch.float32  # bf16/fp16 matmuls are slow on most CPUs
    try:
        return parse_dtype(config_dtype)
    except ValueError:
        return torch.bfloat16


class LLMEngine:
    def __init__(self, config: EngineConfig, progress: Callable[[str, float], None] | None = None):
        """`progress(stage, fraction)` is told where loading is (the replica reports it)."""
        progress = progress or (lambda stage, fraction: None)
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RequestError("device 'cuda' requested but no CUDA device is available; use device='cpu'")
        self.speculative = SpeculativeConfig.from_dict(config.speculative_config)  # refused before loading
        tier_config = KVTierConfig.from_dict(config.kv_tiers)
        if tier_config is not None and not config.enable_prefix_caching:
            raise RequestError("kv_tiers need prefix caching: they extend the prefix cache")
        progress("reading config", 0.05)
        self.model_config = ModelConfig.from_dir(config.model)
        self.dtype = resolve_dtype(config.dtype, self.device, self.model_config.torch_dtype)
        self.tokenizer = Tokenizer(config.model) if (Path(config.model) / "tokenizer.json").is_file() else None
        progress("loading weights", 0.15)
        self.parallel = ParallelConfig(
            config.tensor_parallel_size,
            config.pipeline_parallel_size,
            config.pipeline_stages,
            timeout_s=config.parallel_timeout_s,
            threads_per_rank=config.parallel_threads_per_rank,
        )
        self.parallel.validate(self.model_config, config)
        self.tiers: TieredCache | NoTiers = NoTiers()
        # One device, or a tensor/pipeline-parallel group whose rank 0 is this process (executor.py).
        self.executor = make_executor(
            config, self.model_config, self.parallel, self.device, self.dtype, self.speculative
        )
        try:
            self._finish_init(config, tier_config, progress)
        except BaseException:
            self.close()  # no rank outlives an engine that failed to start
            raise

    def _finish_init(self, config: EngineConfig, tier_config: KVTierConfig | None, progress) -> None:
        """Everything after the weights: the KV cache's limits, the tiers, the scheduler, the
        grammars, the speculator."""
        self.eos_token_ids = eos_token_ids(config.model, self.model_config)
        if not self.eos_token_ids and self.tokenizer and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids = (self.tokenizer.eos_token_id,)
        progress("allocating KV cache", 0.85)
        blocks = self.executor.num_blocks
        self.max_model_len = served_context(self.model_config.max_context, config.max_model_len)
        if blocks * config.block_size < self.max_model_len:
            # Serve what fits rather than admit a request that could never complete.
            log.warning(
                "KV cache holds %d tokens, less than the model context %d",
                blocks * config.block_size,
                self.max_model_len,
            )
            self.max_model_len = blocks * config.block_size
        if self.max_model_len < 2:
            raise RequestError("the KV cache budget is too small to hold a single request; raise it")
        self.block_manager = BlockManager(blocks, config.block_size, config.enable_prefix_caching)
        if tier_config is not None:
            progress("connecting KV tiers", 0.87)
            layout = {**self.kv_layout(), "model": weights_identity(config.model)}
            self.tiers = TieredCache(tier_config, self.executor.kv_cache, layout, config.block_size)
            self.block_manager.on_evict = self.tiers.on_evict
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, self.tiers, config.fair_share
        )
        self.sampler = Sampler(config.seed)
        # Structured output: grammars compiled for this vocabulary (needs the tokenizer).
        self.grammars = (
            Grammars(config.model, self.model_config.vocab_size, self.eos_token_ids)
            if self.tokenizer is not None
            else None
        )
        self.output = OutputProcessor(self.tokenizer, self.max_model_len)
        progress("loading the draft", 0.9)
        self.speculator = make_speculator(
            self.speculative, self.model, read_config(config.model), self.device, self.dtype
        )
        self.requests: dict[str, Sequence] = {}
        # Finished sequences whose blocks are kept for export (prefill role), by request id.
        self.held: dict[str, Sequence] = {}
        self.num_generated_tokens = 0
        self.num_request_errors = 0  # requests ended by a failure while stepping them (_fail)
        progress("loaded", 1.0)

    # What tests, benches and the replica read by their old names.
    @property
    def runner(self):
        """The executor (it runs each step; tests and benches wrap its `execute`)."""
        return self.executor

    @property
    def model(self):
        return self.executor.model

    @property
    def parallel_group(self):
        """The parallel group, or None on one device."""
        return None if isinstance(self.executor, DeviceExecutor) else self.executor

    @property
    def drafter(self):
        return self.speculator.drafter

    # -- requests -----------------------------------------------------------------------------
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
        """Queue a request. `hold_blocks`: when it finishes, keep its KV blocks until
        `release_held(request_id)` (a prefill replica sends them to a decode replica first).
        `session_turn`: the request is a turn of a session (the caller sent a session key), so
        its context is worth sharing through the KV store (tiered_cache.py). `share`: its
        priority and tenant (scheduler.py).

        Resuming a request another engine started: `output_token_ids` are the tokens it already
        generated and `emitted_text_len` how many characters of their text were already
        reported. They count as output (max_tokens, penalties, the seed's positions, usage), and
        their text is rebuilt exactly as that engine had it, so the text it held back (a possible
        start of a stop string) comes next and a stop string spanning the seam is still found."""
        check_n(sampling_params, hold_blocks, output_token_ids)
        seq = self._new_sequence(request_id, prompt_token_ids, sampling_params, output_token_ids)
        seq.hold_blocks = hold_blocks
        seq.session_turn = session_turn
        seq.share = share
        self.output.replay(seq, emitted_text_len)  # a resumed request's text so far (none: nothing)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raise RequestError if this engine cannot serve the prompt (empty, unknown token ids,
        no room left to generate). Replicas call it before reserving anything for a request."""
        admission.check_prompt(prompt_token_ids, self.model_config.vocab_size, self.max_model_len)

    def _new_sequence(
        self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams, output_token_ids=()
    ) -> Sequence:
        if request_id in self.requests or request_id in self.held:
            raise RequestError(f"request id {request_id!r} is already in use")
        self.check_prompt([*prompt_token_ids, *output_token_ids])
        self.check_params(sampling_params)
        seq = Sequence(request_id, prompt_token_ids, sampling_params, self.eos_token_ids, output_token_ids)
        seq.grammar = grammar_state(self.grammars, sampling_params.grammar, output_token_ids)
        self.output.attach(seq)
        return seq

    def check_params(self, params: SamplingParams) -> None:
        admission.check_params(params, self.model_config.vocab_size)

    def check_grammar(self, params: SamplingParams) -> None:
        """Compile the request's grammar now (it is cached for when the request is added), so a
        replica that hands the prompt to a prefill replica refuses a bad one first."""
        grammar_state(self.grammars, params.grammar)

    # -- disaggregated prefill/decode -----------------------------------------------------------
    def reserve_blocks(self, num_tokens: int) -> list[int] | None:
        """Blocks for a prompt of `num_tokens` another replica will compute (None: cache full)."""
        return self.block_manager.reserve(num_tokens)

    def release_blocks(self, block_ids: list[int]) -> None:
        self.block_manager.release(block_ids)

    def release_held(self, request_id: str) -> None:
        seq = self.held.pop(request_id, None)
        if seq is not None:
            self.block_manager.free(seq)

    def add_prefilled_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        block_ids: list[int],
        first_token: int,
        first_logprobs: dict[int, float] | None = None,
        num_cached_tokens: int = 0,
        session_turn: bool = False,
        share: Share = DEFAULT_SHARE,
    ) -> RequestDelta:
        """Admit a request whose prompt K/V another replica wrote into `block_ids` (from
        `reserve_blocks`) and which sampled `first_token`; returns that token's delta. The
        sequence then decodes here like any other. With `n` > 1 the prefill replica computed
        sample 0 (n=1, the same seed); samples 1..n-1 fork from the received blocks here and
        sample their own first tokens."""
        seq = self._new_sequence(request_id, prompt_token_ids, sampling_params)
        seq.session_turn = session_turn  # the whole turn, output included, goes to the KV store
        seq.share = share
        if len(block_ids) != self.block_manager.blocks_needed(len(prompt_token_ids)):
            raise RequestError(f"{len(block_ids)} blocks do not hold a prompt of {len(prompt_token_ids)} tokens")
        seq.block_table = list(block_ids)
        seq.num_computed_tokens = 0
        self.block_manager.mark_computed(seq, len(prompt_token_ids))  # hashes the full blocks
        seq.num_cached_tokens = num_cached_tokens
        self.requests[request_id] = seq
        self.scheduler.add_running(seq)
        self._fork_due([seq])  # n > 1: the prompt was computed once, over there; the other samples fork here
        return self._process(seq, [first_token], [first_logprobs or {first_token: 0.0}])

    def kv_layout(self) -> dict:
        """What a peer must match to exchange KV blocks with this engine. A parallel group's is
        rank 0's; each rank's own comes with the group's transfer endpoint (kvtransfer/ranks.py)."""
        return {**self.executor.kv_description(), **self.parallel.rank_fields(0)}

    def abort_request(self, request_id: str) -> bool:
        self.release_held(request_id)
        seq = self.requests.pop(request_id, None)
        if seq is None or all(sample.is_finished for sample in seq.samples):
            return False
        for sample in seq.samples:  # every sample of the request (parallel_sampling.py)
            if sample.is_finished:
                continue
            sample.hold_blocks = False
            sample.finish_reason = "abort"
            self.scheduler.finish(sample)
            self.speculator.release(sample)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """One batched model step: schedule → execute → sample or verify → process.

        A failure met while drafting, sampling or processing one request ends that request
        alone (`_fail`: finish_reason "error", its blocks and grammar released) and the rest of
        the batch goes on. A failure of the batched forward pass is not one request's: it
        propagates, and the replica process restarts."""
        failed: list[RequestDelta] = []
        running = self.scheduler.running
        drafts = self.speculator.propose(
            running, self.max_model_len, lambda seq, exc: failed.extend(self._fail(seq, exc))
        )
        batch = self.scheduler.schedule(drafts)
        if batch.is_empty:
            self.tiers.wait(timeout=0.05)  # only loads from a KV tier are pending: wait for one
            return failed
        starts = [item.seq.num_computed_tokens for item in batch.all]
        started = time.perf_counter()
        logits, sampling = self.executor.execute(batch, keep_aux=self.speculator.keeps_states(len(running)))
        for item in batch.all:
            if not item.draft_token_ids:  # a verifying sequence's K/V is final once verified
                self.block_manager.mark_computed(item.seq, item.num_tokens)
        failed += self._fork_due(item.seq for item in sampling)
        deltas = []
        for item, outcome in zip(sampling, self._sample(logits, sampling), strict=True):
            seq = item.seq
            if seq.is_finished:  # failed with another sample of its request this step
                continue
            try:
                if isinstance(outcome, Exception):
                    raise outcome
                tokens, logprobs = outcome
                self.speculator.record(seq, len(item.draft_token_ids), len(tokens) - 1)
                deltas.append(self._process(seq, tokens, logprobs, verified=bool(item.draft_token_ids)))
            except Exception as exc:
                failed += self._fail(seq, exc)
        self.speculator.observe(batch, starts, self.executor.aux_hidden_states, started, len(running))
        return deltas + failed

    def _fail(self, seq: Sequence, exc: Exception) -> list[RequestDelta]:
        """End `seq`'s request, every sample of it, because stepping it raised `exc`: its blocks
        and drafter state are released and each unfinished sample gets a final delta with
        finish_reason "error". The traceback goes to the log; the delta says what in one line."""
        message = describe(exc)
        log.error("request %s failed in the engine: %s", seq.request_id, message, exc_info=exc)
        self.num_request_errors += 1
        deltas = []
        for sample in seq.samples:
            if sample.is_finished:
                continue
            sample.finish_reason, sample.hold_blocks = "error", False
            self.scheduler.finish(sample)
            self.speculator.release(sample)
            deltas.append(
                RequestDelta(
                    request_id=sample.request_id,
                    new_token_ids=[],
                    new_text="",
                    new_logprobs=[] if sample.logprobs is not None else None,
                    finished=True,
                    finish_reason="error",
                    num_prompt_tokens=sample.num_prompt_tokens,
                    num_output_tokens=sample.num_output_tokens,
                    num_cached_tokens=sample.num_cached_tokens,
                    index=sample.index,
                    error=message,
                )
            )
        self.requests.pop(seq.request_id, None)
        return deltas

    def _fork_due(self, seqs) -> list[RequestDelta]:
        """Fork samples 1..n-1 of each of `seqs` whose time has come (parallel_sampling.py: its
        prompt is computed); returns the deltas of requests that failed doing so."""
        failed = []
        for parent in due_forks(seqs):
            try:
                children = fork(parent, self.block_manager)
                for child in children:
                    child.grammar = grammar_state(self.grammars, child.params.grammar)
                    self.output.attach(child)
                self.scheduler.add_forked(children)
            except Exception as exc:
                failed += self._fail(parent, exc)
        return failed

    def _sample(self, logits: torch.Tensor, sampling: list[ScheduledSeq]) -> list[tuple[list[int], list] | Exception]:
        """Each sampling sequence's (tokens, logprobs): sampled, or verified when it drafts
        (Sampler.sample_or_verify). If the batch raises, its sequences are sampled one at a time,
        and the exception of the one at fault is its outcome (the others' are as in the batch:
        sampling is per row)."""
        try:
            return self.sampler.sample_or_verify(
                logits, [i.seq for i in sampling], [i.draft_token_ids for i in sampling]
            )
        except Exception as exc:
            if len(sampling) == 1:
                return [exc]
            log.warning("sampling a batch of %d failed (%s); sampling one at a time", len(sampling), describe(exc))
        outcomes: list[tuple[list[int], list] | Exception] = []
        row = 0
        for item in sampling:
            n = 1 + len(item.draft_token_ids)
            try:
                outcomes += self.sampler.sample_or_verify(logits[row : row + n], [item.seq], [item.draft_token_ids])
            except Exception as exc:
                outcomes.append(exc)
            row += n
        return outcomes

    def _process(self, seq: Sequence, token_ids: list[int], logprobs: list, verified: bool = False) -> RequestDelta:
        """Hand `seq` its new tokens (OutputProcessor) and retire it if they finished it.

        `verified`: the tokens come from verifying drafts. The K/V of the sequence's last token
        and of each accepted draft it took is final now, so they count as computed (and full
        blocks are hashed); the K/V of the rejected drafts (and of accepted ones dropped after a
        stop) is rolled back, its blocks released (BlockManager.trim)."""
        delta = self.output.process(seq, token_ids, logprobs)
        self.num_generated_tokens += len(delta.new_token_ids)
        if verified:
            self.block_manager.mark_computed(seq, len(delta.new_token_ids))
            self.block_manager.trim(seq)
        if delta.finished:
            self.speculator.release(seq, completed=True)
            self.tiers.on_finish(seq)
            self.scheduler.finish(seq, free_blocks=not seq.hold_blocks)
            if request_finished(seq):
                self.requests.pop(seq.request_id, None)
            if seq.hold_blocks:
                self.held[seq.request_id] = seq
        return delta

    # -- what the prefix cache holds (the replica publishes it for routing) ---------------------
    def take_kv_events(self) -> tuple[list[int], list[int]]:
        """(stored, removed) block hashes since the last call: BlockManager.take_kv_events."""
        return self.block_manager.take_kv_events()

    def take_kv_snapshot(self) -> list[int]:
        """Every block hash the prefix cache holds now: BlockManager.take_kv_snapshot."""
        return self.block_manager.take_kv_snapshot()

    # -- introspection for metrics ------------------------------------------------------------
    def stats(self) -> dict:
        return admission.batch_stats(
            self.scheduler, self.block_manager, self.num_generated_tokens, self.num_request_errors
        )

    def tier_stats(self) -> dict | None:
        """The KV tiers' counters (tiered_cache.py), or None when there are none."""
        return self.tiers.stats()

    def close(self) -> None:
        """Let go of what outlives a step: the KV tiers' threads and store connection."""
        self.tiers.close()
        self.executor.close()

    def check_health(self) -> None:
        """Raise ParallelError if a rank of this engine's group has died (a no-op on one
        device): the replica calls it while idle too, so a dead rank restarts the group at once."""
        self.executor.check()

    def rank_memory(self) -> list[dict]:
        """Per rank: bytes of weights, KV cache and the rest ({"rank", "weights", "kv_cache",
        "other"}); one entry for a single-device engine."""
        return self.executor.memory()

    def speculation_stats(self) -> dict | None:
        """Speculation's counters since start (speculative/stats.py), or None when it is off."""
        return self.speculator.as_dict()
