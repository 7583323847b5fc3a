"""How much of a deployment batch lines may take, kept under the deployment's TTFT SLO.

The dispatcher lets batch lines have up to a fraction (`fill`) of the deployment's sequence
slots. Without an SLO, `fill` is BATCH_FILL. With one (the deployment's autoscaling settings,
`ttft_p90_ms`, enabled or not), it follows the interactive requests' measured time to first
token, additive increase and multiplicative decrease, the way TCP follows a congested link:
every ADJUST_SECONDS it looks at the interactive requests that ended since it last looked (by
the web processes' own times of their ends, so that clocks that differ do not matter);
when their p90 TTFT broke the SLO it halves, otherwise it grows by a tenth of BATCH_FILL, never
above BATCH_FILL, never below one line. The gateway records the TTFTs (inspector.py); batch
lines are not among them: their own TTFT is meant to give way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ADJUST_SECONDS = 2.0
DECREASE = 0.5
INCREASE_STEPS = 10  # from the floor to BATCH_FILL in this many quiet intervals


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile: the smallest value at or above 90% of them."""
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


@dataclass
class FillGate:
    """One deployment's `fill`, between `floor` and `ceiling` (BATCH_FILL)."""

    ceiling: float
    floor: float
    checked_at: float  # when it last adjusted (the dispatcher's clock)
    seen_until: float  # the end of the newest request it has looked at (the web process's clock)
    fill: float = field(init=False)  # starts at the ceiling
    breaches: int = 0  # intervals whose p90 broke the SLO (for the log and tests)

    def __post_init__(self) -> None:
        self.fill = self.ceiling

    def due(self, now: float) -> bool:
        return now - self.checked_at >= ADJUST_SECONDS

    def adjust(self, now: float, ended: list[tuple[float, float]], slo_ms: float) -> float:
        """`ended`: (when it ended, TTFT ms) of the interactive requests that ended after
        `seen_until`."""
        self.checked_at = now
        self.seen_until = max([self.seen_until, *(at for at, _ in ended)])
        ttfts_ms = [ms for _, ms in ended]
        if ttfts_ms and p90(ttfts_ms) > slo_ms:
            self.breaches += 1
            self.fill = max(self.floor, self.fill * DECREASE)
        else:
            self.fill = min(self.ceiling, self.fill + self.ceiling / INCREASE_STEPS)
        return self.fill
