"""Fair sharing between tenants: the virtual token counter (VTC) of "Fairness in Serving Large
Language Models" (Sheng et al., OSDI '24).

Each tenant (an API key's owner) has a counter of the service it got: every prompt token it
was served adds 1, every generated token 2, divided by the tenant's weight. Among waiting
requests of one priority, the scheduler admits the tenant with the smallest counter first, so a
tenant that sends ten times the requests does not get ten times the engine: between tenants
that both keep a backlog, the service each got stays within a bound of the other's. A tenant
arriving after an idle spell starts at the smallest counter of the tenants being served (its
counter is lifted to it), so idling banks no credit to spend later in a burst.

The served tokens per tenant (unweighted) are kept as well: the replica reports them, and
`/metrics` exports them per tenant.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.engine.sequence import Sequence

INPUT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0


class FairShare:
    """The counters. `enabled=False` (first come, first served) keeps counting, for the metrics,
    but the scheduler then orders by priority and arrival only."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.counters: dict[str, float] = {}
        self.active: Counter[str] = Counter()  # sequences waiting or running, per tenant
        self.served: dict[str, list[int]] = {}  # tenant -> [prompt tokens, generated tokens]

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def arrive(self, seq: Sequence) -> None:
        """`seq` joins the engine. A tenant with nothing else in it is lifted to the smallest
        counter of the active tenants (VTC's rule for a returning client)."""
        tenant = seq.share.tenant
        if self.active[tenant] == 0:
            floor = min((self.counters.get(t, 0.0) for t, n in self.active.items() if n > 0), default=None)
            if floor is not None and self.counters.get(tenant, 0.0) < floor:
                self.counters[tenant] = floor
            self.counters.setdefault(tenant, 0.0)
        self.active[tenant] += 1
        seq.charged_output = seq.num_output_tokens  # a resumed request's earlier output was charged elsewhere

    def leave(self, seq: Sequence) -> None:
        self.charge_output(seq)
        tenant = seq.share.tenant
        self.active[tenant] -= 1
        if self.active[tenant] <= 0:
            del self.active[tenant]

    def charge_prompt(self, seq: Sequence) -> None:
        """The prompt, once, when the request is first admitted (not its forked samples, which
        share it, nor a recomputation after a preemption)."""
        self._charge(seq, seq.num_prompt_tokens, 0)

    def charge_output(self, seq: Sequence) -> None:
        """The tokens `seq` generated since it was last charged."""
        new = seq.num_output_tokens - seq.charged_output
        if new > 0:
            seq.charged_output += new
            self._charge(seq, 0, new)

    def _charge(self, seq: Sequence, prompt: int, output: int) -> None:
        share = seq.share
        self.counters[share.tenant] = (
            self.counter(share.tenant) + (INPUT_WEIGHT * prompt + OUTPUT_WEIGHT * output) / share.weight
        )
        served = self.served.setdefault(share.tenant, [0, 0])
        served[0] += prompt
        served[1] += output
