"""The validated request every dialect lowers to: what a replica is sent, and how to shape the
answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.protocol.replica import GenerateMessage, Share, WireSamplingParams


@dataclass
class GenerationRequest:
    kind: str  # "chat" | "completion"
    model: str
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict = "auto"
    prompt: str | None = None
    # The prompt's ids: the client's (a completion prompt of ids), else the gateway's own
    # tokenisation before routing (tokenization.py); None while untokenised, and when the gateway
    # cannot read the model (the replica tokenises then).
    prompt_token_ids: list[int] | None = None
    params: WireSamplingParams = field(default_factory=WireSamplingParams)
    logprobs: bool = False
    timing: bool = False  # `x-switchyard-timing: 1`: stream chunks carry when the replica produced them
    # OpenAI's `prompt_cache_key`: the same session key as the cache policy's affinity header
    prompt_cache_key: str | None = None
    priority: int = 0  # lower runs first (core/checks.py: `priority`, or the service tier's)

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools the chat template renders into the prompt (none when the client said 'none')."""
        return self.tools if self.tools and self.tool_choice != "none" else None

    def replica_message(self) -> GenerateMessage:
        """What the replica is sent; the hub fills in `id` and `reply_to` when it sends it. The
        ids once known (the replica needs no tools: the gateway parses tool calls itself).
        `share` gets the request's priority here, its tenant when the caller is known."""
        share = Share(priority=self.priority)
        if self.prompt_token_ids is not None:
            return GenerateMessage(params=self.params, prompt_token_ids=self.prompt_token_ids, share=share)
        if self.kind == "chat":
            return GenerateMessage(params=self.params, messages=self.messages, tools=self.template_tools, share=share)
        return GenerateMessage(params=self.params, prompt=self.prompt, share=share)
