"""A replica played by a thread, for gateway tests that need one to answer but no engine: it
reports itself ready and answers each `generate` on its request stream with `accepted` and one
final token, keeping the messages it read (what the gateway sent)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from workers.protocol import replica as protocol
from workers.protocol.replica import AcceptedEvent, DeltaEvent, ReplicaStatus


@contextmanager
def played_replica(
    client: redis.Redis,
    replica_id: int,
    incarnation: str = "played-1",
    answer: Callable[[str, int], list] | None = None,
) -> Iterator[list[dict]]:
    """Play replica `replica_id` (its row must be ready) until the block ends; yields the list of
    `generate` messages it has read, in order. `client` decodes responses. `answer(request id,
    prompt tokens)`: the events sent after `accepted` (by default one final token)."""
    stream = protocol.requests_key(replica_id)
    client.delete(stream)
    # A heartbeat an hour ahead: fresh for the whole test without a heartbeat thread.
    status = ReplicaStatus(state="ready", heartbeat=time.time() + 3600, incarnation=incarnation, kv_block_size=16)
    client.hset(protocol.status_key(replica_id), mapping=status.to_hash())
    seen: list[dict] = []
    stop = threading.Event()

    def play() -> None:
        last = "0-0"
        while not stop.is_set():
            for _, entries in client.xread({stream: last}, block=100) or []:
                for last, fields in entries:  # noqa: B007 - the last one read is where to go on
                    message = json.loads(fields["m"])
                    if message["type"] != "generate":
                        continue
                    seen.append(message)
                    n, rid, reply = len(message.get("prompt_token_ids") or []), message["id"], message["reply_to"]
                    client.publish(reply, protocol.encode(AcceptedEvent(rid, n).to_wire()))
                    usage = {"prompt_tokens": n, "completion_tokens": 1, "cached_tokens": 0}
                    events = (
                        answer(rid, n) if answer else [DeltaEvent(rid, "ok", [7], finish_reason="length", usage=usage)]
                    )
                    for event in events:
                        client.publish(reply, protocol.encode(event.to_wire()))

    player = threading.Thread(target=play, daemon=True)
    player.start()
    try:
        yield seen
    finally:
        stop.set()
        player.join(5)
        client.delete(stream, protocol.status_key(replica_id))
