"""Retrieval metrics on small matrices with known answers, ties, and chunked == unchunked.

Video-to-text is checked under both conventions: ``best_caption`` (CLIP4Clip's
multi-sentence evaluation, the default) and ``all_captions``.
"""

from __future__ import annotations

import numpy as np
import pytest

from mmcomp_eval.errors import UserError
from mmcomp_eval.retrieval.ranking import (
    V2T_CONVENTIONS,
    mean_r1,
    score_embeddings,
    score_similarity,
    summarize,
)


def reference_ranks(sim: np.ndarray, caption_video: list[int], v2t: str = "best_caption"
                    ) -> tuple[list[int], list[int]]:
    """The documented definition, written as plainly as possible (loops, no blocks)."""
    n_c, n_v = sim.shape
    t2v = []
    for c in range(n_c):
        target = sim[c, caption_video[c]]
        t2v.append(1 + sum(1 for v in range(n_v) if v != caption_video[c] and sim[c, v] >= target))
    ranks = []
    captions_of = {v: [c for c in range(n_c) if caption_video[c] == v] for v in range(n_v)}
    for v in range(n_v):
        own = captions_of[v]
        if not own:
            continue
        best = max(sim[c, v] for c in own)
        if v2t == "all_captions":  # every foreign caption at least as good counts
            ranks.append(1 + sum(1 for c in range(n_c) if c not in own and sim[c, v] >= best))
        else:  # every foreign video whose best caption is at least as good counts once
            ranks.append(1 + sum(1 for u in range(n_v) if u != v and captions_of[u]
                                 and max(sim[c, v] for c in captions_of[u]) >= best))
    return t2v, ranks


def clip4clip_v2t_ranks(sim: np.ndarray, caption_video: list[int]) -> list[int]:
    """CLIP4Clip's multi-sentence v2t procedure, re-derived from its description (no ties in the input).

    Captions are grouped per video and padded with -inf into a (videos x
    max captions x videos) tensor; the max over the caption axis, transposed,
    is a square (query video x caption-set) matrix whose diagonal is the
    target; a row's rank is the target's position in the row sorted in
    decreasing order, plus 1.
    """
    n_v = sim.shape[1]
    groups = [[c for c in range(len(caption_video)) if caption_video[c] == v] for v in range(n_v)]
    width = max(len(g) for g in groups)
    tensor = np.full((n_v, width, n_v), -np.inf)
    for v, g in enumerate(groups):
        tensor[v, :len(g)] = sim[g]
    square = tensor.max(axis=1).T  # [query video, caption set]
    return [int(np.flatnonzero(np.sort(-row) == -row[v])[0]) + 1 for v, row in enumerate(square)]


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
    for v2t in V2T_CONVENTIONS:
        s = score_similarity(sim, [0, 0, 1, 1], v2t=v2t)
        # t2v: caption 1's video 0 (0.8) is beaten by video 2 (0.9)
        assert s.t2v_ranks.tolist() == [1, 2, 2, 1]
        # v2t video 0: best own caption is caption 1 (0.8), tied with foreign caption 2 (video 1's best) -> rank 2.
        # v2t video 1: its captions 2 and 3 tie at 0.6 -> no penalty between them -> rank 1.
        assert s.v2t_ranks.tolist() == [2, 1]
        assert s.v2t_videos.tolist() == [0, 1]  # video 2 has no caption: not a v2t query
        assert s.metrics()["v2t"]["n_queries"] == 2
    # the v2t gallery: 2 caption sets (video 2 has none) or 4 captions
    assert score_similarity(sim, [0, 0, 1, 1]).metrics()["v2t"]["n_gallery"] == 2
    assert score_similarity(sim, [0, 0, 1, 1], v2t="all_captions").metrics()["v2t"]["n_gallery"] == 4
    assert score_similarity(sim, [0, 0, 1, 1]).metrics()["t2v"]["n_gallery"] == 3


def test_v2t_conventions_by_hand():
    # video 0: captions 0, 1; video 1: captions 2, 3, 4; video 2: caption 5
    sim = np.array([[0.5, 0.55, 0.4],
                    [0.7, 0.6, 0.1],
                    [0.9, 0.3, 0.0],
                    [0.8, 0.5, 0.2],
                    [0.1, 0.4, 0.3],
                    [0.75, 0.6, 0.4]])
    cv = [0, 0, 1, 1, 1, 2]
    best = score_similarity(sim, cv)  # best_caption is the default
    every = score_similarity(sim, cv, v2t="all_captions")
    assert best.v2t_convention == "best_caption"
    assert best.t2v_ranks.tolist() == every.t2v_ranks.tolist() == [2, 1, 2, 2, 1, 3]  # t2v has one convention
    # video 0 (own best 0.7): captions 2 (0.9), 3 (0.8) of video 1 and 5 (0.75) of video 2 beat it:
    #   all_captions counts three captions -> rank 4; best_caption counts two videos -> rank 3.
    # video 1 (own best 0.5): captions 0 (0.55), 1 (0.6) of video 0 and 5 (0.6): 4 vs 3.
    # video 2 (own 0.4): caption 0 ties at 0.4 (pessimistic: it goes first): 2 under both.
    assert every.v2t_ranks.tolist() == [4, 4, 2]
    assert best.v2t_ranks.tolist() == [3, 3, 2]
    mb, me = best.metrics()["v2t"], every.metrics()["v2t"]
    assert (mb["R1"], mb["R5"], mb["MdR"], mb["MnR"]) == (0.0, 100.0, 3.0, pytest.approx(8 / 3))
    assert (me["R1"], me["R5"], me["MdR"], me["MnR"]) == (0.0, 100.0, 4.0, pytest.approx(10 / 3))
    # CLIP4Clip on a copy whose one relevant tie (video 2, caption 0) is broken against the target
    assert clip4clip_v2t_ranks(sim - np.arange(18).reshape(6, 3) * 1e-9, cv) == [3, 3, 2]
    with pytest.raises(UserError, match="'best' is not one of best_caption, all_captions"):
        score_similarity(sim, cv, v2t="best")


def test_best_caption_is_clip4clip_and_never_worse_100_videos_40_captions():
    """The audit's shape: 100 videos x 40 captions, continuous scores (no ties).

    best_caption reproduces CLIP4Clip's procedure exactly; per query it is
    never worse than all_captions, since a foreign video counts once however
    many of its captions beat the target. Hence R@k can only rise and MnR
    only fall when switching to CLIP4Clip's convention (the audit measured
    R5 13.0 -> 14.0 and MnR 40.2 -> 28.35 on its scores).
    """
    rng = np.random.default_rng(0)
    n_v, per = 100, 40
    cv = np.repeat(np.arange(n_v), per)
    video = rng.standard_normal((n_v, 8))
    text = 0.35 * video[cv] + rng.standard_normal((n_v * per, 8))  # weakly tied to their video
    sim = text @ video.T
    best = score_similarity(sim, cv)
    every = score_similarity(sim, cv, v2t="all_captions")
    assert best.v2t_ranks.tolist() == clip4clip_v2t_ranks(sim, cv.tolist())
    assert np.all(best.v2t_ranks <= every.v2t_ranks) and np.any(best.v2t_ranks < every.v2t_ranks)
    mb, me = best.metrics()["v2t"], every.metrics()["v2t"]
    assert mb["R5"] >= me["R5"] and mb["MnR"] < me["MnR"]
    assert mb["n_gallery"] == 100 and me["n_gallery"] == 4000 and mb["n_queries"] == me["n_queries"] == 100
    # the same from embeddings, chunked (strips of 3 videos against 4,000 captions)
    chunked = score_embeddings(text, video, cv, block_elements=12_000)
    assert chunked.v2t_ranks.tolist() == best.v2t_ranks.tolist()


def test_hit_when_any_caption_is_within_k():
    # video 0 has captions 0..2; only caption 2 scores high for it.
    sim = np.array([[0.0, 0.5], [0.1, 0.5], [0.9, 0.5], [0.5, 0.9]])
    for v2t in V2T_CONVENTIONS:
        s = score_similarity(sim, [0, 0, 0, 1], v2t=v2t)
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


@pytest.mark.parametrize("v2t", list(V2T_CONVENTIONS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunked_equals_unchunked_and_reference(seed, v2t):
    rng = np.random.default_rng(seed)
    n_v, n_c, d = 23, 57, 3
    # small integer embeddings: dot products are exact in float32 and full of ties
    text = rng.integers(-2, 3, (n_c, d)).astype(np.float32)
    video = rng.integers(-2, 3, (n_v, d)).astype(np.float32)
    cv = rng.integers(0, n_v - 2, n_c)  # the last two videos get no caption; captions not grouped in order
    sim = text @ video.T
    ref_t2v, ref_v2t = reference_ranks(sim, cv.tolist(), v2t)
    whole = score_similarity(sim, cv, v2t=v2t)
    assert whole.t2v_ranks.tolist() == ref_t2v and whole.v2t_ranks.tolist() == ref_v2t
    for block in (1, 7, 60, 10_000):
        a = score_similarity(sim, cv, block_elements=block, v2t=v2t)
        b = score_embeddings(text, video, cv, block_elements=block, v2t=v2t)
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
