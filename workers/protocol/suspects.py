"""Requests suspected of killing replicas: what the gateway tells node agents, so that a death a
request caused costs a deployment's failure budget once, not once per replica it reaches.

A request that was in flight on a replica that died (the gateway saw the replica lost under it)
and is sent to another replica is a *suspect* there. Before sending it, the gateway adds it to
the hash `suspects_key(replica, incarnation)`: field the id the replica knows it by, value a
`Suspect` (the id the client knows and the replicas lost under it so far). The gateway removes
the field when the request ends there any other way than by that replica's loss; the key expires
SUSPECT_TTL_SECONDS after its last write, so what a gateway that died left behind goes.

When a replica process exits unexpectedly, its node agent reads the hash of the incarnation that
died: a suspect in flight there is the death's cause, and the death does not count toward the
replica's restart limit (the first death, before anyone could suspect the request, did). The
gateway does not send a request on after a second replica is lost under it (the suspect's own
death was the second): a poison request costs at most one restart. Keyed by incarnation, a
suspect of a process that died long ago cannot blame a later one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from workers.protocol.wire import ProtocolError, Wire

VERSION = 1
SUSPECT_TTL_SECONDS = 3600


def suspects_key(replica_id: int, incarnation: str) -> str:
    return f"switchyard:replica:{replica_id}:suspects:{incarnation}"


@dataclass
class Suspect(Wire):
    """One request in flight on a replica after a replica died under it. `lost`: each replica lost
    under it before, in order, as {"replica": id, "incarnation": str}."""

    request_id: str  # as the client knows it
    lost: list[dict] = field(default_factory=list)
    version: int = VERSION

    def encode(self) -> str:
        return json.dumps(self.to_wire(), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | bytes) -> Suspect:
        """ProtocolError for a value this side cannot read."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"Suspect: not JSON ({exc})") from None
        suspect = cls.from_wire(data)
        if not isinstance(suspect.request_id, str) or not isinstance(suspect.lost, list):
            raise ProtocolError("Suspect: request_id must be a string and lost a list")
        return suspect
