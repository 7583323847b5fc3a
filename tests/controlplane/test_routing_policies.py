"""The routing policies as pure functions (no database, no Redis): consistent hashing with
bounded loads, the KV-aware cost, round robin, and what each policy falls back to."""

import math
import random
from collections import Counter, deque

from controlplane.gateway.routing import policies
from controlplane.gateway.routing.policies import Candidate
from workers.bench.agent_trace import SEED, make_trace

IDS = [11, 12, 13, 14]


def idle(ids=IDS, **kw) -> list[Candidate]:
    return [Candidate(rid, 0, 100, **kw) for rid in ids]


def test_a_key_walks_the_ring_from_its_own_point_and_every_replica_appears_once():
    order = policies.ring_order("session-1", IDS)
    assert sorted(order) == IDS
    assert order == policies.ring_order("session-1", list(reversed(IDS)))  # placement ignores list order
    firsts = Counter(policies.ring_order(f"k{i}", IDS)[0] for i in range(4000))
    assert set(firsts) == set(IDS)
    assert max(firsts.values()) / min(firsts.values()) < 1.6  # 64 points each: roughly even


def test_removing_a_replica_moves_only_its_keys_and_adding_one_moves_keys_only_to_it():
    before = {f"k{i}": policies.ring_order(f"k{i}", IDS)[0] for i in range(1000)}
    after = {k: policies.ring_order(k, [11, 12, 14])[0] for k in before}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k, rid in before.items() if rid == 13}
    grown = {k: policies.ring_order(k, [*IDS, 15])[0] for k in before}
    assert {grown[k] for k in before if grown[k] != before[k]} == {15}


def test_bounded_loads_keep_every_replica_under_the_cap_for_1000_keys():
    loads = dict.fromkeys(IDS, 0)
    for i in range(1000):  # sessions that stay open: each adds to its replica's load
        cands = [Candidate(rid, loads[rid], 100) for rid in IDS]
        plan = policies.plan(policies.SESSION, cands, session=f"user-{i}", load_factor=1.25)
        chosen = plan.candidates[policies.pick(plan, [0] * 4)].replica_id
        assert loads[chosen] < policies.load_cap(list(loads.values()), 1.25)
        loads[chosen] += 1
    assert max(loads.values()) <= math.ceil(1.25 * 1000 / 4)
    assert sum(loads.values()) == 1000


def test_a_session_goes_to_the_first_replica_on_its_ring_that_is_under_the_bound():
    order = policies.ring_order("s", IDS)
    cands = [Candidate(rid, 0, 100) for rid in IDS]
    plan = policies.plan(policies.SESSION, cands, session="s")
    assert plan.candidates[policies.pick(plan, [0] * 4)].replica_id == order[0]
    # its first replica busy (9 against a cap of max(ceil(1.25 * 10 / 4), 4) = 4): the next on the ring
    busy = [Candidate(rid, 9 if rid == order[0] else 0, 100) for rid in IDS]
    plan = policies.plan(policies.SESSION, busy, session="s")
    assert plan.candidates[policies.pick(plan, [0] * 4)].replica_id == order[1]
    # bound elsewhere: the binding wins while that replica is under the cap
    plan = policies.plan(policies.SESSION, cands, session="s", bound_to=order[2])
    assert plan.reason == "session_bound"
    assert plan.candidates[policies.pick(plan, [0] * 4, bound_to=order[2])].replica_id == order[2]


def test_kv_aware_prefers_the_cached_prefix_until_load_outweighs_it_or_the_bound_stops_it():
    cands = [Candidate(11, 4, 100, 0), Candidate(12, 0, 100, 40), Candidate(13, 4, 100, 10)]
    plan = policies.plan(policies.KV_AWARE, cands, prompt_blocks=50)
    assert plan.base == [50.0, 10.0, 40.0] and plan.weight == policies.LOAD_BLOCKS == 16
    # 12 holds 40 of the 50 blocks: 10 + 16 x load; the others 50 and 40 + 16 x 4
    assert [plan.candidates[policies.pick(plan, [0, n, 0])].replica_id for n in (0, 2, 5)] == [12, 12, 12]
    assert plan.candidates[policies.pick(plan, [0, 6, 0])].replica_id == 13  # 10 + 96 > 40 + 64
    # the bound: a long cached prefix (190 of 200 blocks) outweighs any load, until the replica
    # is over max(ceil(1.25 * (2 + L + 2 + 1) / 3), 4): L = 3 is under it, L = 6 over
    long = [Candidate(11, 2, 100, 0), Candidate(12, 0, 100, 190), Candidate(13, 2, 100, 10)]
    bounded = policies.plan(policies.KV_AWARE, long, prompt_blocks=200, load_factor=1.25)
    assert bounded.candidates[policies.pick(bounded, [0, 3, 0])].replica_id == 12
    assert bounded.candidates[policies.pick(bounded, [0, 6, 0])].replica_id == 13
    # ...but below MIN_LOAD_CAP nothing is over the bound, however idle the others
    idle_others = policies.plan(
        policies.KV_AWARE, [Candidate(c.replica_id, 0, 100, c.cached_blocks) for c in cands], prompt_blocks=50
    )
    assert idle_others.candidates[policies.pick(idle_others, [0, 1, 0])].replica_id == 12  # cap 4, not 1


def test_kv_aware_without_token_ids_or_a_session_policy_without_a_key_is_least_loaded():
    cands = [Candidate(11, 3, 10), Candidate(12, 1, 10), Candidate(13, 1, 50)]
    for policy, kw, why in [
        (policies.KV_AWARE, {}, "least_loaded;no_token_ids"),
        (policies.SESSION, {}, "least_loaded;no_session_key"),
        (policies.SESSION_KV_AWARE, {}, "least_loaded;no_session_key"),
        (policies.LEAST_LOADED, {"session": "s", "prompt_blocks": 9}, "least_loaded"),
    ]:
        plan = policies.plan(policy, cands, **kw)
        assert plan.reason == why and plan.session is None
        assert plan.candidates[policies.pick(plan, [0, 0, 0])].replica_id == 13  # 1 in flight, most free


def test_session_kv_aware_places_a_new_key_by_its_prefix_and_a_bound_key_by_its_binding():
    cands = [Candidate(11, 0, 100, 0), Candidate(12, 0, 100, 30)]
    plan = policies.plan(policies.SESSION_KV_AWARE, cands, session="s", prompt_blocks=30)
    assert (plan.reason, plan.session) == ("session_kv_aware", "s")
    assert plan.candidates[policies.pick(plan, [0, 0])].replica_id == 12
    plan = policies.plan(policies.SESSION_KV_AWARE, cands, session="s", bound_to=11, prompt_blocks=30)
    assert plan.reason == "session_bound"
    assert plan.candidates[policies.pick(plan, [0, 0], bound_to=11)].replica_id == 11
    gone = policies.plan(policies.SESSION_KV_AWARE, cands, session="s", bound_to=99, prompt_blocks=30)
    assert gone.reason == "session_kv_aware"  # its replica left: placed by prefix again


def test_round_robin_turns_through_the_replicas_whatever_their_load():
    cands = [Candidate(rid, 50 if rid == 12 else 0, 100) for rid in IDS]
    picks = []
    for turn in range(8):
        plan = policies.plan(policies.ROUND_ROBIN, cands, turn=turn)
        picks.append(plan.candidates[policies.pick(plan, [0] * 4)].replica_id)
    assert picks == IDS * 2


def test_the_least_loaded_replica_always_qualifies_under_the_bound():
    rng = random.Random(7)
    for _ in range(500):
        loads = [rng.randrange(0, 40) for _ in range(rng.randrange(1, 6))]
        factor = rng.choice([1.0, 1.1, 1.25, 2.0])
        assert min(loads) < policies.load_cap(loads, factor)
        assert policies.load_cap(loads, factor) >= policies.MIN_LOAD_CAP


def test_an_unknown_policy_is_refused():
    try:
        policies.plan("fastest", idle())
    except ValueError as exc:
        assert "fastest" in str(exc)
    else:
        raise AssertionError("an unknown policy was accepted")


def test_a_new_session_skips_replicas_holding_their_share_of_sessions_but_a_bound_one_stays():
    order = policies.ring_order("s", IDS)
    cands = [Candidate(rid, 0, 100) for rid in IDS]
    plan = policies.plan(policies.SESSION, cands, session="s")
    held = [3 if c.replica_id == order[0] else 0 for c in plan.candidates]  # cap ceil(1.25 * 4 / 4) = 2
    assert policies.session_cap(held, 1.25) == 2
    assert plan.candidates[policies.pick(plan, [0] * 4, sessions=held)].replica_id == order[1]
    bound = policies.plan(policies.SESSION, cands, session="s", bound_to=order[0])
    assert bound.candidates[policies.pick(bound, [0] * 4, bound_to=order[0], sessions=held)].replica_id == order[0]
    # every replica at the session cap: the load bound alone decides (the ring's first)
    full = [5] * 4
    assert policies.session_cap(full, 1.0) == 6 and policies.session_cap(full, 0.5) == 3
    half = policies.plan(policies.SESSION, cands, session="s", load_factor=0.5)
    assert half.candidates[policies.pick(half, [0] * 4, sessions=full)].replica_id == order[0]


def test_a_block_is_a_shared_prefix_once_two_earlier_prompts_cached_prefixes_ended_there():
    assert policies.SHARED_PREFIX_PROMPTS == 2
    assert [policies.shared_prefix(40, earlier) for earlier in (0, 1, 2, 9)] == [0, 0, 40, 40]
    assert policies.shared_prefix(0, 5) == 0


def test_a_keyless_prompt_is_a_new_conversation_when_nothing_past_a_shared_prefix_is_cached():
    def kv(held: list[int], shared: int, blocks: int = 60, **kw) -> policies.Plan:
        cands = [Candidate(rid, 0, 100, h) for rid, h in zip(IDS, held, strict=False)]
        return policies.plan(
            kw.pop("policy", policies.KV_AWARE), cands, prompt_blocks=blocks, shared_blocks=shared, **kw
        )

    new = kv([40, 0, 0, 0], shared=40)  # only the system prompt is cached, on one replica
    assert (new.fresh, new.recent, new.reason) == (True, True, "kv_aware;new_conversation")
    assert kv([0, 0, 0, 0], shared=0).fresh  # nothing cached anywhere
    assert kv([40, 40, 40, 0], shared=40).fresh  # on several: the same
    continued = kv([40, 55, 0, 0], shared=40)  # its own context past the shared prefix
    assert (continued.fresh, continued.reason) == (False, "kv_aware")
    assert not kv([40, 0, 0, 0], shared=0).fresh  # not (yet) known shared: it follows its prefix
    assert not kv([60, 0, 0, 0], shared=60).fresh  # an identical prompt repeated: nothing past it
    keyed = kv([40, 0, 0, 0], shared=40, policy=policies.SESSION_KV_AWARE, session="s")
    assert not keyed.fresh and keyed.reason == "session_kv_aware"  # a key is counted as a session
    assert kv([40, 0, 0, 0], shared=40, policy=policies.SESSION_KV_AWARE).fresh  # ... no key: kv_aware
    bound = policies.plan(policies.SESSION_KV_AWARE, idle(), session="s", bound_to=IDS[0], prompt_blocks=9)
    assert bound.recent and bound.fresh  # counted among the recent requests; if it moves, placed as a new key
    ring = policies.plan(policies.SESSION, idle(), session="s", prompt_blocks=9)
    assert ring.recent and ring.fresh  # a key placed by the ring: where the fewest requests went


def test_a_new_conversation_goes_where_the_fewest_requests_went_but_a_continued_turn_follows_its_prefix():
    recent = [6, 1, 2, 0]  # requests sent to each lately; IDS[0] holds the system prompt
    cands = [Candidate(rid, 0, 100, 40 if rid == IDS[0] else 0) for rid in IDS]
    new = policies.plan(policies.KV_AWARE, cands, prompt_blocks=60, shared_blocks=40)
    # 40 blocks cheaper on IDS[0], and under any ceil(c * mean) cap on 1, 2 or 6: the fewest still win
    assert new.candidates[policies.pick(new, [0] * 4, recent=recent)].replica_id == IDS[3]
    assert new.candidates[policies.pick(new, [0] * 4, recent=[1, 1, 1, 1])].replica_id == IDS[0]  # then the cost
    # ... among the replicas under the load bound: IDS[3] with 5 in flight (cap max(ceil(1.25 * 6 / 4), 4) = 4)
    assert new.candidates[policies.pick(new, [0, 0, 0, 5], recent=recent)].replica_id == IDS[1]
    mine = [Candidate(rid, 0, 100, 55 if rid == IDS[0] else 0) for rid in IDS]
    turn = policies.plan(policies.KV_AWARE, mine, prompt_blocks=60, shared_blocks=0)
    assert turn.candidates[policies.pick(turn, [0] * 4, recent=recent)].replica_id == IDS[0]


def _replay_keyless(rule: bool, rebalance: bool = True, seed: int = SEED) -> tuple[list[int], float]:
    """The cache benchmark's trace routed `kv_aware` without a header, in its nominal order, by the
    pure rule alone: an unbounded prefix cache per replica, nothing in flight (answers take no
    time), the router's prefix-end counts, its conversation beginnings and the recent-request
    window kept here as Redis keeps them. `rule` False: no recent requests at all; `rebalance`
    False: continued turns never move. Requests per replica and the hit rate over the prompts'
    reusable blocks."""
    trace = make_trace(seed)
    held: dict[int, set[int]] = {rid: set() for rid in IDS}
    ends: Counter = Counter()
    starts: set[int] = set()
    recent: deque = deque()
    sent: Counter = Counter()
    hit = total = 0
    for t, s, turn in trace.nominal_order():
        hashes = trace.block_hashes(s, turn, 16)
        cached = {rid: next((i for i, h in enumerate(hashes) if h not in held[rid]), len(hashes)) for rid in IDS}
        best, shared = max(cached.values()), 0
        if rule and best:
            shared = policies.shared_prefix(best, ends[hashes[best - 1]])
            ends[hashes[best - 1]] += 1
        while recent and recent[0][0] <= t - policies.RECENT_SECONDS:
            recent.popleft()
        window = Counter(rid for _, rid, _ in recent)
        cands = [Candidate(rid, 0, 100, cached[rid]) for rid in IDS]
        plan = policies.plan(policies.KV_AWARE, cands, prompt_blocks=len(hashes), shared_blocks=shared)
        plan.rebalance = plan.rebalance and rebalance
        if plan.fresh:  # as router._conversation: where it began, or the deepest beginning it holds
            start = hashes[min(best, len(hashes) - 1)]
            starts.add(start)
        else:
            start = next((h for h in reversed(hashes) if h in starts), None)
        own = sum(start is not None and k == start for _, _, k in recent)
        i = policies.pick(plan, [0] * 4, recent=[window[r] for r in IDS] if rule else None, own=own)
        rid = plan.candidates[i].replica_id
        recent.append((t, rid, start))
        sent[rid] += 1
        hit, total = hit + cached[rid], total + len(hashes)
        held[rid].update(hashes)
    return [sent[rid] for rid in IDS], hit / total


def test_on_the_benchmarks_trace_keyless_new_conversations_spread_and_later_turns_keep_their_prefix():
    """Without the rule every conversation's first turn goes to the replica that holds the system
    prompt (nothing in flight here to push it away) and so does the whole trace; with it the
    requests per replica stay within 1.3x their mean, at the same hit rate."""
    before, before_hit = _replay_keyless(rule=False)
    after, after_hit = _replay_keyless(rule=True)
    assert max(before) == sum(before)
    assert max(after) / (sum(after) / 4) <= 1.3, after
    assert after_hit >= 0.98 * before_hit, (after_hit, before_hit)


def test_a_session_placed_anew_goes_where_the_fewest_requests_went_then_in_ring_order():
    order = policies.ring_order("s", IDS)
    plan = policies.plan(policies.SESSION, idle(), session="s")
    assert plan.candidates[policies.pick(plan, [0] * 4, recent=[0] * 4)].replica_id == order[0]
    sent = [5 if rid == order[0] else 3 if rid == order[1] else 4 for rid in (c.replica_id for c in plan.candidates)]
    assert plan.candidates[policies.pick(plan, [0] * 4, recent=sent)].replica_id == order[1]


def test_a_bound_session_moves_off_a_replica_sent_too_many_lately_only_when_the_move_helps():
    order = policies.ring_order("s", IDS)
    home = order[0]
    plan = policies.plan(policies.SESSION, idle(), session="s", bound_to=home)

    def where(home_sent: int, others: int, own: int) -> int:
        sent = [home_sent if c.replica_id == home else others for c in plan.candidates]
        return plan.candidates[policies.pick(plan, [0] * 4, bound_to=home, recent=sent, own=own)].replica_id

    # two busy sessions (12 requests each lately) on one replica, the others idle: cap max(ceil(1.25
    # * 25 / 4), 8) = 8, and moving this one's 12 leaves the idle one at 12 < 24: it moves
    assert policies.recent_cap([24, 0, 0, 0], 1.25) == 8
    assert where(24, 0, own=12) == order[1]
    # a lone busy session: moving would only carry its 24 along (0 + 24 is not under 24)
    assert where(24, 0, own=24) == home
    # under the cap (a fleet sent 8, 7, 7, 7: cap max(ceil(1.25 * 30 / 4), 8) = 10) or below the
    # floor of MIN_RECENT_CAP: it stays
    assert where(8, 7, own=1) == home and where(policies.MIN_RECENT_CAP - 1, 0, own=0) == home
    # without a bound (load factor 0) nothing moves for recent requests
    free = policies.plan(policies.SESSION, idle(), session="s", bound_to=home, load_factor=0)
    sent = [24 if c.replica_id == home else 0 for c in free.candidates]
    assert free.candidates[policies.pick(free, [0] * 4, bound_to=home, recent=sent, own=1)].replica_id == home


def _replay_sessions(rule: bool, seed: int = SEED) -> tuple[list[int], float]:
    """The cache benchmark's trace routed `session` with its keys, in its nominal order, by the
    pure rule alone (nothing in flight, an unbounded prefix cache per replica, bindings, session
    counts and the recent-request window kept here as Redis keeps them); `rule` False: the rule
    without recent requests (ring order and the session bound alone). Requests per replica and the
    hit rate over the prompts' reusable blocks."""
    trace = make_trace(seed)
    held: dict[int, set[int]] = {rid: set() for rid in IDS}
    bound: dict[str, int] = {}
    bindings: Counter = Counter()
    recent: deque = deque()
    sent: Counter = Counter()
    hit = total = 0
    for t, s, turn in trace.nominal_order():
        key = trace.sessions[s].key
        while recent and recent[0][0] <= t - policies.RECENT_SECONDS:
            recent.popleft()
        window = Counter(rid for _, rid, _ in recent)
        plan = policies.plan(policies.SESSION, idle(), session=key, bound_to=bound.get(key))
        order = [c.replica_id for c in plan.candidates]
        i = policies.pick(
            plan,
            [0] * 4,
            bound_to=bound.get(key),
            sessions=[bindings[r] for r in order],
            recent=[window[r] for r in order] if rule else None,
            own=sum(k == key for _, _, k in recent),
        )
        rid = order[i]
        if bound.get(key) != rid:
            if key in bound:
                bindings[bound[key]] -= 1
            bound[key], bindings[rid] = rid, bindings[rid] + 1
        recent.append((t, rid, key))
        sent[rid] += 1
        hashes = trace.block_hashes(s, turn, 16)
        hit += next((j for j, h in enumerate(hashes) if h not in held[rid]), len(hashes))
        total += len(hashes)
        held[rid].update(hashes)
    return [sent[rid] for rid in IDS], hit / total


def test_on_the_benchmarks_trace_sessions_spread_by_their_requests_at_the_same_hit_rate():
    """Sessions of 9 to 41 requests (sub-agents carry their parent's key): balanced by count on
    the ring, one replica got 1.56x the mean; placed and moved by recent requests, within 1.3x,
    losing under 1% of the hits to the few moves."""
    before, before_hit = _replay_sessions(rule=False)
    after, after_hit = _replay_sessions(rule=True)
    assert max(before) / (sum(before) / 4) > 1.3, before
    assert max(after) / (sum(after) / 4) <= 1.3, after
    assert after_hit >= 0.99 * before_hit, (after_hit, before_hit)


def test_continued_keyless_conversations_move_off_a_replica_sent_too_many_on_every_seed():
    """Conversations differ in size (a forking agent's sub-agents follow its context), so where
    new ones start decides little: on seeds 4 and 6 of the benchmark's trace one replica got 1.61x
    and 1.52x the mean requests. A continued turn whose replica was sent over its share, where
    moving its conversation helps, goes where the fewest went: within 1.3x on every seed tried,
    losing at most 2% of the hits to the moves."""
    for seed in (SEED, 1, 2, 3, 4, 5, 6, 7):
        before, before_hit = _replay_keyless(rule=True, rebalance=False, seed=seed)
        after, after_hit = _replay_keyless(rule=True, seed=seed)
        assert max(after) / (sum(after) / 4) <= 1.3, (seed, after)
        assert after_hit >= 0.98 * before_hit, (seed, after_hit, before_hit)
        if seed in (4, 6):
            assert max(before) / (sum(before) / 4) > 1.5, (seed, before)


def test_a_continued_keyless_turn_leaves_its_prefix_only_when_its_replica_was_sent_too_many():
    cands = [Candidate(rid, 0, 100, 50 if rid == IDS[0] else 0) for rid in IDS]
    turn = policies.plan(policies.KV_AWARE, cands, prompt_blocks=60, shared_blocks=0)
    assert turn.rebalance and not turn.fresh

    def where(sent: list[int], own: int) -> int:
        return turn.candidates[policies.pick(turn, [0] * 4, recent=sent, own=own)].replica_id

    assert where([24, 0, 3, 1], own=12) == IDS[1]  # two busy conversations there: this one moves
    assert where([24, 0, 3, 1], own=24) == IDS[0]  # alone there: moving carries its load along
    assert where([9, 7, 8, 7], own=1) == IDS[0]  # under max(ceil(1.25 * 32 / 4), 8) = 10
