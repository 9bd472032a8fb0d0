"""Few-shot samplers on hand-made pools."""

from __future__ import annotations

import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.fewshot import build_sampler


def doc(i, verbs, nouns):
    # the last clip is the target: the similar sampler ignores it by default
    return Document(f"d{i}", {"verbs": [*verbs, "TARGET_VERB"], "nouns": [*nouns, "TARGET_NOUN"]})


POOL = [
    doc(0, ["take", "wash", "cut"], ["knife", "onion", "board"]),   # shares 2 verbs + 2 nouns with the query
    doc(1, ["open", "close", "put"], ["fridge", "door", "plate"]),  # shares nothing
    doc(2, ["take", "open", "stir"], ["knife", "pan", "spoon"]),    # shares 1 verb + 1 noun
    doc(3, ["take", "cut", "peel"], ["onion", "knife", "carrot"]),  # shares 2 + 2
    doc(4, ["wash", "dry", "put"], ["pan", "towel", "plate"]),      # shares 1 verb
]
QUERY = doc(9, ["take", "cut", "mix"], ["knife", "onion", "bowl"])


def test_similar_ranks_by_shared_nouns_plus_verbs():
    picks = build_sampler("similar", {}).select([QUERY], POOL, 3, seed=0)[0]
    assert set(picks[:2]) == {0, 3}
    assert picks[2] == 2


def test_similar_ignores_target_clip():
    q = Document("q", {"verbs": ["zzz", "zzz", "zzz", "open"], "nouns": ["yyy", "yyy", "yyy", "fridge"]})
    scores_free = build_sampler("similar", {}).select([q], POOL, 5, seed=0)[0]
    assert sorted(scores_free) == [0, 1, 2, 3, 4]  # all tie at 0: no preference for doc 1 from the target


def test_ties_broken_by_seed_deterministically():
    s = build_sampler("similar", {})
    a = s.select([QUERY], POOL, 2, seed=1)
    assert a == s.select([QUERY], POOL, 2, seed=1)
    orders = {tuple(s.select([QUERY], POOL, 2, seed=k)[0]) for k in range(20)}
    assert orders == {(0, 3), (3, 0)}


def test_query_never_among_its_shots():
    for name in ("similar", "random", "first"):
        picks = build_sampler(name, {}).select(POOL, POOL, 4, seed=0)
        for i, row in enumerate(picks):
            assert i not in row and len(set(row)) == 4


def test_random_and_first_and_none():
    r = build_sampler("random", {})
    assert r.select([QUERY], POOL, 3, seed=5) == r.select([QUERY], POOL, 3, seed=5)
    assert {tuple(r.select([QUERY], POOL, 3, seed=k)[0]) for k in range(10)} != {(0, 1, 2)}
    assert build_sampler("first", {}).select([QUERY], POOL, 2, seed=0) == [[0, 1]]
    assert build_sampler("none", {}).select([QUERY], POOL, 3, seed=0) == [[]]


def test_errors():
    with pytest.raises(UserError, match="larger than the few-shot pool"):
        build_sampler("similar", {}).select([QUERY], POOL, 6, seed=0)
    with pytest.raises(UserError, match="the query excluded"):
        build_sampler("random", {}).select(POOL, POOL, 5, seed=0)
    with pytest.raises(UserError, match="did you mean 'similar'"):
        build_sampler("simlar", {})
    with pytest.raises(UserError, match="no field 'nouns'"):
        build_sampler("similar", {}).select([Document("x", {"verbs": []})], POOL, 1, seed=0)
