"""The autoscaler's rule, as a pure function of what one interval measured (no database, no
Redis: tests feed it recorded telemetry).

Capacity of one replica comes from a step-time profile (workers/sim/profile.py) at the SLOs:
- decode: the largest batch B whose step `c + d·B + e·B·L` (L: the mean context, prompt plus half
  the answer) stays within the ITL SLO, bounded by max_num_seqs and the KV cache; it emits B tokens
  per step, so B / step tokens per second;
- prefill: a prompt of P tokens takes `a + b·P`; a replica spends at most UTILISATION of its time
  prefilling so that prompts do not queue past the TTFT SLO: UTILISATION · P / (a + b·P) prompt
  tokens per second.
A colocated replica does both, so the replicas needed are the sum of the two time shares,
prompt_tps / prefill capacity + output_tps / decode capacity, from demand predicted one interval
ahead (the measured rate plus its rise since the interval before; a fall is not extrapolated).

Then, in order (each decision says which rule made it):
1. a change in progress (replicas starting or draining), or one that settled within the interval
   (which then measured the old replica count): hold, decide nothing;
2. burst: requests waited in the queue, or the measured TTFT or ITL p90 broke its SLO: scale up at
   once, to the capacity estimate and at least one more replica;
3. up: the estimate exceeds the current count by more than the tolerance: scale up to it;
4. down: the estimate is below the current count by more than the tolerance, and no change was
   made within the cooldown: one replica fewer (the reconciler drains it: no request is lost);
5. else hold.
Always within [min, max] and, going up, within the room the nodes have for more replicas."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from workers.sim.profile import SimProfile

UTILISATION = 0.8  # the share of a replica's time prefill may take before prompts queue


@dataclass(frozen=True)
class Settings:
    min_replicas: int
    max_replicas: int
    ttft_p90_ms: float
    itl_p90_ms: float
    cooldown_seconds: float
    tolerance: float


@dataclass(frozen=True)
class Demand:
    """What one interval measured over the deployment's replicas."""

    prompt_tokens_per_s: float
    output_tokens_per_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    waiting: float  # mean queue length over the interval
    ttft_p90_ms: float | None
    itl_p90_ms: float | None


@dataclass(frozen=True)
class Capacity:
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    decode_batch: int


@dataclass(frozen=True)
class Decision:
    replicas: int  # what the deployment should run
    action: str  # "up", "down" or "hold"
    rule: str  # change_in_progress, settling, burst, up, down, cooldown, within_tolerance, bounds, idle
    reason: str  # in words, with the numbers
    estimate: float  # replicas the demand needs (fractional)

    def as_dict(self) -> dict:
        return asdict(self)


def capacity(profile: SimProfile, settings: Settings, demand: Demand, max_num_seqs: int, kv_tokens: int) -> Capacity:
    """One replica's prefill and decode throughput at the SLOs for this demand's lengths."""
    prompt = max(demand.mean_prompt_tokens, 1.0)
    context = prompt + max(demand.mean_output_tokens, 1.0) / 2
    per_seq = profile.decode_per_seq + profile.decode_per_context_token * context
    budget = settings.itl_p90_ms / 1000 - profile.decode_base
    if per_seq <= 0:
        batch = max_num_seqs
    elif budget <= 0:  # the SLO is below one step: no batch meets it, so count one sequence per step
        batch = 1
    else:
        batch = int(budget / per_seq)
    batch = max(1, min(batch, max_num_seqs, int(kv_tokens // max(context, 1.0)) or 1))
    step = profile.decode_base + per_seq * batch
    decode = batch / step if step > 0 else float("inf")
    prefill_one = profile.prefill_base + profile.prefill_per_token * prompt
    prefill = UTILISATION * prompt / prefill_one if prefill_one > 0 else float("inf")
    return Capacity(prefill_tokens_per_s=prefill, decode_tokens_per_s=decode, decode_batch=batch)


def predicted(now: float, before: float | None) -> float:
    """One interval ahead: a rise goes on at the same pace, a fall is not extrapolated."""
    return now + max(0.0, now - before) if before is not None else now


def estimate(demand: Demand, previous: Demand | None, cap: Capacity) -> float:
    prompt = predicted(demand.prompt_tokens_per_s, previous.prompt_tokens_per_s if previous else None)
    output = predicted(demand.output_tokens_per_s, previous.output_tokens_per_s if previous else None)
    return prompt / cap.prefill_tokens_per_s + output / cap.decode_tokens_per_s


def decide(
    settings: Settings,
    current: int,
    demand: Demand,
    previous: Demand | None,
    cap: Capacity,
    *,
    changing: str = "",
    settling: bool = False,
    since_change: float | None = None,
    room: int = 1 << 30,
) -> Decision:
    """`current`: replicas the deployment is set to; `changing`: why a change is in progress ("" if
    none); `settling`: the change ended within this interval, which therefore measured the old
    replica count; `since_change`: seconds since the last change (None: never); `room`: how many
    more replicas the nodes can place."""
    need = estimate(demand, previous, cap)
    lo, hi = settings.min_replicas, settings.max_replicas
    wanted = math.ceil(need - 1e-9)
    target = min(max(wanted, lo), hi)
    numbers = (
        f"prompt {demand.prompt_tokens_per_s:.0f} tok/s over {cap.prefill_tokens_per_s:.0f} per replica, "
        f"output {demand.output_tokens_per_s:.0f} tok/s over {cap.decode_tokens_per_s:.0f} per replica "
        f"(batch {cap.decode_batch} at ITL {settings.itl_p90_ms:g} ms): {need:.2f} replicas"
    )

    def up_to(replicas: int, rule: str, why: str) -> Decision:
        replicas = min(replicas, hi, current + max(room, 0))
        if replicas <= current:
            limit = "max_replicas" if current >= hi else "room on the nodes"
            return Decision(current, "hold", "bounds", f"{why}, but {limit} allows no more ({current})", need)
        return Decision(replicas, "up", rule, f"{why}: {current} -> {replicas}", need)

    if changing:
        return Decision(current, "hold", "change_in_progress", f"a change is in progress ({changing})", need)
    if settling:
        why = "the last change settled within this interval: its demand was served by the old replica count"
        return Decision(current, "hold", "settling", why, need)
    if current < lo:
        return up_to(lo, "bounds", f"below min_replicas {lo}")
    if current > hi:
        return Decision(hi, "down", "bounds", f"above max_replicas {hi}: {current} -> {hi}", need)
    breach = []
    if demand.waiting >= 0.5:
        breach.append(f"{demand.waiting:.1f} requests waiting on average")
    if demand.ttft_p90_ms is not None and demand.ttft_p90_ms > settings.ttft_p90_ms:
        breach.append(f"TTFT p90 {demand.ttft_p90_ms:.0f} ms > SLO {settings.ttft_p90_ms:g} ms")
    if demand.itl_p90_ms is not None and demand.itl_p90_ms > settings.itl_p90_ms:
        breach.append(f"ITL p90 {demand.itl_p90_ms:.0f} ms > SLO {settings.itl_p90_ms:g} ms")
    if breach:
        return up_to(max(target, current + 1), "burst", "; ".join(breach) + f"; {numbers}")
    band = settings.tolerance * current
    if wanted > current and need - current > band:
        return up_to(wanted, "up", numbers)  # bounded there, saying so
    if target < current and current - need > band:
        if since_change is not None and since_change < settings.cooldown_seconds:
            wait = settings.cooldown_seconds - since_change
            return Decision(current, "hold", "cooldown", f"{numbers}; scale-down waits {wait:.0f} s more", need)
        return Decision(current - 1, "down", "down", f"{numbers}: {current} -> {current - 1} (one at a time)", need)
    rule = "idle" if need == 0 else "within_tolerance"
    return Decision(current, "hold", rule, f"{numbers}; {current} replicas within tolerance", need)
