"""`/ws/generate/`: chat generation over a websocket, several requests at once per socket.

Auth (see ws_auth): an API key in `?api_key=` or an `Authorization: Bearer` header (no Origin
needed), or the signed-in session (the console, from an allowed origin). A missing, unknown or
revoked key is accepted and closed at once with code 4401 and the reason. The client sends a
chat request with its own `id`:

    {"id": "r1", "model": "demo", "messages": [...], "max_tokens": 32, ...}   (OpenAI's fields)
    {"type": "cancel", "id": "r1"}

and receives, per request id: `start` (request id, replica, route reason), `token` (text and
token ids), `tool_call`, then `done` (finish_reason, usage, timings; `resumed` when the request
moved to another replica mid-way) or `error` (OpenAI's error body). Closing the socket aborts
what is still running.
"""

from __future__ import annotations

import asyncio

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from redis.exceptions import RedisError

from controlplane.gateway import generation
from controlplane.gateway.core import GatewayError, parse_json
from controlplane.gateway.core.checks import session_key
from controlplane.gateway.dialects.openai.request import parse_chat
from controlplane.gateway.dialects.openai.views import finish_reason
from controlplane.gateway.tool_calls import ChatShaper, ToolCall

MAX_CONCURRENT_PER_SOCKET = 64
CLOSE_UNAUTHORIZED = 4401  # 4000-4999: application codes; 4401 echoes HTTP's 401
MISSING_CREDENTIALS = "No API key: send 'Authorization: Bearer sy-...' or ?api_key=sy-... (or sign in to the console)."


class GenerateConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.tasks: dict[str, asyncio.Task] = {}
        key, user = self.scope.get("api_key"), self.scope.get("user")
        try:
            if key is None and user is not None and user.is_authenticated:
                self.caller = generation.caller_from_user(user)
            elif key is None:
                raise GatewayError(401, MISSING_CREDENTIALS, code="missing_api_key")
            else:
                self.caller = await generation.caller_from_secret(key)
        except GatewayError as exc:
            # Accepted first: a close before the accept reaches the client as a bare HTTP 403,
            # without the code or the reason.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHORIZED, reason=exc.message)
            return
        await self.accept()

    async def disconnect(self, code):
        for task in getattr(self, "tasks", {}).values():
            task.cancel()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """Each frame must be a JSON object within the request limits (as an HTTP body is); one
        that is not gets an error with `id: null` and the socket, with its other requests, goes on."""
        try:
            content = parse_json(text_data if text_data is not None else bytes_data or b"")
        except GatewayError as exc:
            await self._error(None, exc)
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict) or not isinstance(content.get("id"), str) or not content["id"]:
            await self._error(None, GatewayError(400, "Each message needs a string 'id' of your choosing.", "id"))
            return
        rid = content["id"]
        if content.get("type") == "cancel":
            task = self.tasks.get(rid)
            if task:
                task.cancel()
            return
        if rid in self.tasks:
            await self._error(rid, GatewayError(400, f"Request id '{rid}' is already running.", "id"))
            return
        if len(self.tasks) >= MAX_CONCURRENT_PER_SOCKET:
            await self._error(rid, GatewayError(429, "Too many requests running on this socket.", code="too_many"))
            return
        self.tasks[rid] = asyncio.get_running_loop().create_task(self._run(rid, content))

    async def _error(self, rid: str | None, exc: GatewayError) -> None:
        await self.send_json({"type": "error", "id": rid, "error": exc.body()["error"]})

    async def _run(self, rid: str, content: dict) -> None:
        gen = None
        try:
            body = {k: v for k, v in content.items() if k not in ("id", "type", "stream", "session")}
            req = parse_chat(body)
            if req.params.n > 1:  # one answer per socket request: its events carry no choice index
                raise GatewayError(
                    400,
                    "'n' > 1 is not built yet on the console websocket; use /v1/chat/completions.",
                    "n",
                    "unsupported",
                )
            session = session_key(content.get("session"), "session")  # as prompt_cache_key
            gen = await generation.start(req, self.caller, session=session)
            await self.send_json({"type": "start", "id": rid, "request_id": gen.request_id,
                                  "replica": gen.route.replica_id, "route_reason": gen.route.reason,
                                  "cached_tokens_predicted": gen.route.predicted_cached_tokens})  # fmt: skip
            shaper = ChatShaper(req)
            async for event in gen.events():
                for piece in shaper.pieces(event):
                    if isinstance(piece, ToolCall):
                        await self.send_json({"type": "tool_call", "id": rid, "tool_call": piece.as_openai()})
                    elif piece:
                        await self.send_json({"type": "token", "id": rid, "text": piece})
                if event.final:
                    reason = finish_reason(event.finish_reason, bool(shaper.calls))
                    done = {
                        "type": "done",
                        "id": rid,
                        "finish_reason": reason,
                        "usage": event.usage,
                        "timings": {**gen.timings(), "replica": event.timings},
                    }
                    if gen.resumed:  # it moved to another replica mid-request (see failover.py)
                        done["resumed"] = gen.resumed
                    await self.send_json(done)
        except GatewayError as exc:
            await self._error(rid, exc)
        except RedisError as exc:  # the broker went away: this request ends cleanly, the socket stays
            await self._error(rid, generation.broker_unavailable(exc))
        finally:
            if gen is not None:
                await gen.close()
            self.tasks.pop(rid, None)
