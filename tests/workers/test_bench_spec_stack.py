"""The stack run of `bench spec` (workers/bench/spec_stack.py) reports what its clients saw:
requests completed a second, TTFT p50, and ITL p50 per request (a step that emits several
tokens at once counts as the client sees it: its tokens spread over the request's stream)."""

from __future__ import annotations

import pytest

from workers.bench.autoscale import Sent as Chat
from workers.bench.processes import percentile
from workers.bench.spec_stack import summary


def test_a_summary_counts_what_completed_and_spreads_each_request_s_tokens_over_its_stream():
    chats = [
        Chat(start=0.0, first=0.1, last=0.5, tokens=5),  # ITL (0.5 - 0.1) / 4 = 100 ms
        Chat(start=1.0, first=1.3, last=1.5, tokens=3),  # 100 ms: two tokens came in one step
        Chat(start=2.0, first=2.2, last=2.2, tokens=1),  # one token: no ITL
        Chat(start=3.0, first=3.1, last=4.1, tokens=11),  # 100 ms
        Chat(start=4.0, error="500: boom"),
    ]  # TTFTs 100, 300, 200, 100 ms: the nearest-rank median is the second, 100
    out = summary(chats, seconds=2.0)
    assert out == {"rps": 2.0, "ttft_p50_ms": pytest.approx(100.0), "itl_p50_ms": 100.0, "failed": 1}
    assert summary([Chat(start=0.0, error="timeout")], 1.0) == {
        "rps": 0.0,
        "ttft_p50_ms": None,
        "itl_p50_ms": None,
        "failed": 1,
    }


def test_percentile_is_nearest_rank_and_refuses_a_percent():
    values = list(range(1, 11))  # 1 .. 10
    assert (percentile(values, 0.5), percentile(values, 0.9), percentile(values, 1.0)) == (5, 9, 10)
    assert percentile(list(range(100)), 0.9) == 89 and percentile([7.0], 0.01) == 7.0
    with pytest.raises(ValueError, match=r"q in \(0, 1\], got 90"):
        percentile(values, 90)  # the benches once read their "p90" this way: the maximum
