"""Offline API in vLLM's shape: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq

from workers.engine.config import EngineConfig
from workers.engine.errors import RequestError
from workers.engine.llm_engine import LLMEngine
from workers.engine.outputs import CompletionOutput, RequestOutput
from workers.engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, device: str = "cpu", dtype: str = "auto", **engine_kwargs):
        self.engine = LLMEngine(EngineConfig(model=str(model), device=device, dtype=dtype, **engine_kwargs))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop what the engine started (a parallel group's ranks, KV tier threads)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model directory has no tokenizer; pass prompt_token_ids")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, Seq) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise RequestError(f"unsupported prompt {prompt!r}: give a string, token ids or {{'prompt_token_ids': [...]}}")

    def generate(
        self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = False
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise RequestError("give one SamplingParams, or one per prompt")
        results: dict[str, RequestOutput] = {}
        order = []
        for prompt, p in zip(prompts, params_list, strict=True):
            text, ids = self._prompt_ids(prompt)
            rid = str(next(self._ids))
            seq = self.engine.add_request(rid, ids, p)
            order.append(rid)
            results[rid] = RequestOutput(
                rid,
                text,
                ids,
                [CompletionOutput(i, "", [], [] if p.logprobs is not None else None, None) for i in range(p.n)],
                finished=False,
            )
            results[rid].metrics["arrival_time"] = seq.arrival_time
        while self.engine.has_unfinished_requests():
            for delta in self.engine.step():
                out = results[delta.request_id]
                comp = out.outputs[delta.index]
                comp.token_ids.extend(delta.new_token_ids)
                comp.text += delta.new_text
                if delta.new_logprobs is not None:
                    comp.logprobs.extend(delta.new_logprobs)
                out.num_cached_tokens = delta.num_cached_tokens
                if delta.finished:
                    comp.finish_reason = delta.finish_reason
                    comp.stop_reason = delta.stop_reason
                    comp.error = delta.error  # finish_reason "error": the engine failed on this request alone
                    out.finished = all(c.finish_reason is not None for c in out.outputs)
        return [results[rid] for rid in order]

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | None = None,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """One conversation (a list of messages) or several (a list of lists)."""
        if self.tokenizer is None:
            raise RequestError("this model directory has no tokenizer, so no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            {
                "prompt_token_ids": self.tokenizer.apply_chat_template(
                    conv, tools=tools, add_generation_prompt=add_generation_prompt
                )
            }
            for conv in conversations
        ]
        return self.generate(prompts, sampling_params)
