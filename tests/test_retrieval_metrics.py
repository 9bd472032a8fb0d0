"""Retrieval metrics on small matrices with known answers, ties, and chunked == unchunked."""

from __future__ import annotations

import numpy as np
import pytest

from mmcomp_eval.errors import UserError
from mmcomp_eval.retrieval.metrics import (
    mean_r1,
    score_embeddings,
    score_similarity,
    summarize,
)


def reference_ranks(sim: np.ndarray, caption_video: list[int]) -> tuple[list[int], list[int]]:
    """The documented definition, written as plainly as possible (loops, no blocks)."""
    n_c, n_v = sim.shape
    t2v = []
    for c in range(n_c):
        target = sim[c, caption_video[c]]
        t2v.append(1 + sum(1 for v in range(n_v) if v != caption_video[c] and sim[c, v] >= target))
    v2t = []
    for v in range(n_v):
        own = [c for c in range(n_c) if caption_video[c] == v]
        if not own:
            continue
        best = max(sim[c, v] for c in own)
        v2t.append(1 + sum(1 for c in range(n_c) if c not in own and sim[c, v] >= best))
    return t2v, v2t


def test_known_answers_with_ties_both_directions():
    sim = np.array([[0.9, 0.1, 0.3],
                    [0.5, 0.2, 0.7],
                    [0.4, 0.4, 0.4]], dtype=np.float32)  # caption 2: every video tied
    s = score_similarity(sim, [0, 1, 2])
    assert s.t2v_ranks.tolist() == [1, 3, 3]  # a full tie is the worst rank, not the best
    assert s.v2t_ranks.tolist() == [1, 2, 2]
    m = s.metrics()
    assert m["t2v"]["R1"] == pytest.approx(100 / 3) and m["t2v"]["R5"] == 100.0
    assert m["t2v"]["MdR"] == 3.0 and m["t2v"]["MnR"] == pytest.approx(7 / 3)
    assert m["v2t"]["R1"] == pytest.approx(100 / 3) and m["v2t"]["MdR"] == 2.0


def test_constant_scores_are_ranked_last():
    s = score_similarity(np.zeros((4, 4)), [0, 1, 2, 3])
    assert s.t2v_ranks.tolist() == [4, 4, 4, 4] and s.v2t_ranks.tolist() == [4, 4, 4, 4]
    assert s.metrics()["t2v"]["SumR"] == 200.0  # R1 0 + R5 100 + R10 100: the gallery is only 4 long


def test_several_captions_per_video():
    # 4 captions (0,1 -> video 0; 2,3 -> video 1) and a video 2 with no caption.
    sim = np.array([[0.2, 0.1, 0.0],
                    [0.8, 0.3, 0.9],
                    [0.8, 0.6, 0.1],
                    [0.1, 0.6, 0.5]])
    s = score_similarity(sim, [0, 0, 1, 1])
    # t2v: caption 1's video 0 (0.8) is beaten by video 2 (0.9)
    assert s.t2v_ranks.tolist() == [1, 2, 2, 1]
    # v2t video 0: best own caption is caption 1 (0.8), tied with foreign caption 2 -> rank 2.
    # v2t video 1: its captions 2 and 3 tie at 0.6 -> no penalty between them -> rank 1.
    assert s.v2t_ranks.tolist() == [2, 1]
    assert s.v2t_videos.tolist() == [0, 1]  # video 2 has no caption: not a v2t query
    assert s.metrics()["v2t"]["n_queries"] == 2


def test_hit_when_any_caption_is_within_k():
    # video 0 has captions 0..2; only caption 2 scores high for it.
    sim = np.array([[0.0, 0.5], [0.1, 0.5], [0.9, 0.5], [0.5, 0.9]])
    s = score_similarity(sim, [0, 0, 0, 1])
    assert s.v2t_ranks.tolist() == [1, 1]
    assert s.t2v_ranks.tolist() == [2, 2, 1, 1]


def test_summary_arithmetic():
    m = summarize(np.array([1, 2, 6, 11, 20]))
    assert (m["R1"], m["R5"], m["R10"]) == (20.0, 40.0, 60.0)
    assert m["SumR"] == 120.0  # a sum of percents, not a mean
    assert m["MdR"] == 6.0 and m["MnR"] == 8.0 and m["n_queries"] == 5
    assert summarize(np.array([1, 4]))["MdR"] == 2.5
    assert mean_r1({"msrvtt": 40.0, "vatex": 50.0, "charades": 15.0}) == 35.0


def test_matches_full_argsort_baseline_without_ties():
    rng = np.random.default_rng(1)
    sim = rng.standard_normal((60, 60))
    cv = rng.permutation(60)
    order = np.argsort(-sim, axis=1)
    expected = [int(np.flatnonzero(order[i] == cv[i])[0]) + 1 for i in range(60)]
    assert score_similarity(sim, cv).t2v_ranks.tolist() == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunked_equals_unchunked_and_reference(seed):
    rng = np.random.default_rng(seed)
    n_v, n_c, d = 23, 57, 3
    # small integer embeddings: dot products are exact in float32 and full of ties
    text = rng.integers(-2, 3, (n_c, d)).astype(np.float32)
    video = rng.integers(-2, 3, (n_v, d)).astype(np.float32)
    cv = rng.integers(0, n_v - 2, n_c)  # the last two videos get no caption
    sim = text @ video.T
    ref_t2v, ref_v2t = reference_ranks(sim, cv.tolist())
    whole = score_similarity(sim, cv)
    assert whole.t2v_ranks.tolist() == ref_t2v and whole.v2t_ranks.tolist() == ref_v2t
    for block in (1, 7, 60, 10_000):
        a = score_similarity(sim, cv, block_elements=block)
        b = score_embeddings(text, video, cv, block_elements=block)
        for s in (a, b):
            assert s.t2v_ranks.tolist() == ref_t2v
            assert s.v2t_ranks.tolist() == ref_v2t


def test_bad_inputs_are_user_errors():
    with pytest.raises(UserError, match="NaN"):
        score_similarity(np.array([[np.nan, 0.0], [0.0, 1.0]]), [0, 1])
    with pytest.raises(UserError, match="video index 5"):
        score_similarity(np.zeros((2, 2)), [0, 5])
    with pytest.raises(UserError, match="does not match 3 captions"):
        score_similarity(np.zeros((2, 2)), [0, 1, 1])
    with pytest.raises(UserError, match="same model"):
        score_embeddings(np.zeros((2, 3)), np.zeros((2, 4)), [0, 1])
    with pytest.raises(UserError, match="no captions"):
        summarize(np.array([], dtype=int))
