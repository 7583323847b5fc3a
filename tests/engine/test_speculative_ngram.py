"""The n-gram (prompt lookup) drafter and the speculative_config it is built from."""

import random

import pytest

from workers.engine import RequestError, SamplingParams
from workers.engine.sequence import Sequence
from workers.engine.speculative import NgramDrafter, SpeculativeConfig, make_drafter
from workers.engine.speculative.ngram import ngram_propose


def propose(tokens, k=3, min_n=1, max_n=4):
    return ngram_propose(tokens, min_n, max_n, k)


def test_no_match_proposes_nothing():
    assert propose([1, 2, 3, 4, 5]) == []
    assert propose([]) == []
    assert propose([7]) == []  # a single token has nothing earlier to match


def test_the_suffix_itself_is_not_a_match():
    # The last n tokens always "occur" at the end; only an earlier occurrence counts.
    assert propose([9, 1, 2, 3], min_n=2) == []


def test_proposes_what_followed_the_most_recent_match():
    # [1, 2] occurs at 0 (followed by 10, 11, 12) and at 5 (followed by 20, 21, 22): the later one wins.
    assert propose([1, 2, 10, 11, 12, 1, 2, 20, 21, 22, 5, 1, 2], min_n=2, max_n=2) == [20, 21, 22]


def test_longer_ngram_wins_over_a_more_recent_shorter_one():
    # The 3-gram [7, 8, 9] matches at 0 (→ 40); the 1-gram [9] more recently at 6 (→ 50).
    tokens = [7, 8, 9, 40, 41, 42, 9, 50, 51, 7, 8, 9]
    assert propose(tokens, k=2, min_n=1, max_n=3) == [40, 41]
    assert propose(tokens, k=2, min_n=1, max_n=1) == [50, 51]


def test_min_n_is_respected():
    tokens = [5, 6, 1, 7, 8, 1]  # only a 1-gram recurs
    assert propose(tokens, min_n=2) == []
    assert propose(tokens, min_n=1, k=2) == [7, 8]


def test_k_longer_than_the_continuation_continues_it_periodically():
    # [1, 2] at 0 is followed by 3, then the end of the text: the text repeats with period 3.
    assert propose([1, 2, 3, 1, 2], k=5, min_n=2, max_n=2) == [3, 1, 2, 3, 1]


def test_overlapping_match_of_a_run():
    # The last 3 tokens [4, 4, 4] also occur one token earlier (overlapping): period 1.
    assert propose([1, 4, 4, 4, 4], k=4, min_n=3, max_n=3) == [4, 4, 4, 4]
    assert propose([4, 4], k=3) == [4, 4, 4]


def test_match_right_before_the_end():
    # The most recent earlier occurrence of [5] ends just before the last token: it continues with 5.
    assert propose([2, 5, 5], k=2, min_n=1, max_n=1) == [5, 5]


def test_a_match_straddling_two_tokens_bytes_is_not_a_match():
    # The search runs over 4 bytes a token (little-endian): [0x05000000, 0] is 00 00 00 05 00 00
    # 00 00, which holds the bytes of token 5 (05 00 00 00) one byte short of a token boundary.
    assert propose([0x05000000, 0, 9, 5], k=2, min_n=1, max_n=1) == []
    assert propose([5, 7, 0x05000000, 0, 9, 5], k=2, min_n=1, max_n=1) == [7, 0x05000000]


def test_agrees_with_a_plain_search_on_random_histories():
    def plain(tokens, min_n, max_n, k):
        for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
            for i in range(len(tokens) - n - 1, -1, -1):
                if tokens[i : i + n] == tokens[len(tokens) - n :]:
                    ext = list(tokens)
                    for j in range(k):
                        ext.append(ext[i + n + j])
                    return ext[len(tokens) :]
        return []

    rng = random.Random(0)
    for _ in range(2000):
        tokens = [rng.randrange(rng.choice((2, 4, 300))) for _ in range(rng.randrange(1, 40))]
        min_n = rng.randrange(1, 4)
        max_n = rng.randrange(min_n, 6)
        assert propose(tokens, 4, min_n, max_n) == plain(tokens, min_n, max_n, 4)


def test_drafter_caps_each_sequence_at_its_limit():
    drafter = NgramDrafter(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    params = SamplingParams(max_tokens=10)
    a = Sequence("a", [1, 2, 3, 4, 5, 6, 1, 2], params)
    b = Sequence("b", [1, 2, 3], params, output_token_ids=[9, 9])  # output counts as history
    c = Sequence("c", [1, 2, 3], params)
    assert drafter.propose([a, b, c], [2, 4, 4]) == [[3, 4], [9, 9, 9, 9], []]


def test_config_builds_the_drafter():
    config = SpeculativeConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    )
    drafter = make_drafter(config)
    assert isinstance(drafter, NgramDrafter)
    assert (drafter.k, drafter.min_n, drafter.max_n) == (3, 2, 5)
    defaults = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (defaults.prompt_lookup_min, defaults.prompt_lookup_max, defaults.disable_by_batch_size) == (2, 4, 4)
    assert defaults.draft_backoff == 2
    never = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "draft_backoff": 0})
    assert never.draft_backoff == 0
    assert SpeculativeConfig.from_dict(None) is None
    assert SpeculativeConfig.from_dict({}) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"method": "medusa", "num_speculative_tokens": 3}, "unknown speculative method 'medusa'"),
        ({"num_speculative_tokens": 3}, "unknown speculative method None"),
        ({"method": "eagle3", "num_speculative_tokens": 3}, "'eagle3' needs 'model'"),
        ({"method": "eagle3", "model": 7, "num_speculative_tokens": 3}, "'eagle3' needs 'model'"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be a positive integer"),
        ({"method": "ngram", "num_speculative_tokens": True}, "must be a positive integer"),
        ({"method": "ngram", "num_speculative_tokens": 17}, "at most 16"),
        ({"method": "ngram", "num_speculative_tokens": 3, "draft_backoff": -1}, "must be a non-negative integer"),
        ({"method": "ngram", "num_speculative_tokens": 3, "model": "/x"}, "unknown keys ['model']"),
        (
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
            "must not exceed prompt_lookup_max",
        ),
        ("ngram", "must be a dict"),
    ],
)
def test_config_refuses_what_it_cannot_run(raw, message):
    with pytest.raises(RequestError, match=None) as info:
        SpeculativeConfig.from_dict(raw)
    assert message in str(info.value)
