"""Ranks of retrieval queries, both directions, and their summaries: R@1/5/10, median and mean rank, SumR, mR1.

The metrics of retrieval tasks (``mmcomp_eval.metrics.retrieval``) summarise
the ranks computed here; this module is numpy only.

A *query* scores every *gallery* item; its rank is the position of the first
relevant item in the gallery sorted by decreasing score.

* text-to-video (``t2v``): each caption is a query; its one relevant item is
  its video.
* video-to-text (``v2t``): each video that has at least one caption is a
  query. Videos without captions are not queries (they stay in the t2v
  gallery). With several captions per video (MSVD, VATEX) there are two
  conventions (:data:`V2T_CONVENTIONS`):

  - ``best_caption`` (default, CLIP4Clip's multi-sentence evaluation): the
    gallery is the *videos' caption sets*; a caption set scores as its best
    caption, and the query's one relevant item is its own set. CLIP4Clip pads
    each video's captions to a (videos x captions x videos) tensor, takes the
    max over the caption axis (``tensor_video_to_text_sim``) and ranks the
    resulting square video x video matrix (``compute_metrics``). The gallery
    therefore has one item per video.
  - ``all_captions``: the gallery is every caption; all the query's captions
    are relevant, so the query is a hit at k when ANY of them is within the
    top k and its rank is the best rank among them. Another video's captions
    each count, so ranks are never better than under ``best_caption`` (for
    the same scores, per query) and are usually worse.

  With one caption per video the two conventions give the same ranks.

Tie rule (pessimistic): an irrelevant item that scores the *same* as the
best relevant item is ranked before it, so::

    rank(q) = 1 + #{irrelevant g : score(q, g) >= max_{relevant r} score(q, r)}

Why pessimistic: a degenerate model that gives every item the same score
gets the worst rank (gallery size), not rank 1, and the result does not depend
on the order of the gallery or on a sort's stability. Relevant items never
push each other down (a tie between two captions of the same video is still
rank 1). For t2v this is ``1 + #{g != target : score >= target score}``.
(CLIP4Clip's ``compute_metrics`` has no tie rule: a query whose target ties
with k other items is counted k + 1 times, once at each tied position, and
its multi-sentence t2v sorts with ``torch.argsort``, whose order among equal
scores is unspecified. With real-valued model scores exact ties do not
occur, and then all of these agree.)

Ranks need only, per query, a count of items scoring at least as well as the
target, never a sort. Both entry points work on blocks of queries:
:func:`score_similarity` on a given matrix, and :func:`score_embeddings`
computes the similarities (dot products) one strip of queries at a time so a
100,000 x 100,000 problem never holds the full matrix. Each score a rank uses
is computed once, so ties are exact with respect to the computed scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mmcomp_eval.errors import UserError

TIE_RULE = "pessimistic"
TIE_RULE_DESCRIPTION = ("an irrelevant item scoring the same as the best relevant one ranks before it: "
                        "rank = 1 + #{irrelevant items with score >= best relevant score}")
#: v2t conventions for datasets with several captions per video: name -> what the gallery is
V2T_CONVENTIONS = {
    "best_caption": "CLIP4Clip multi-sentence: a video query ranks the videos' caption sets, each scored by its "
                    "best caption (gallery = videos)",
    "all_captions": "a video query ranks every caption; its rank is that of its best own caption among all "
                    "captions (gallery = captions)",
}
DEFAULT_V2T = "best_caption"
KS = (1, 5, 10)
DIRECTIONS = ("t2v", "v2t")
#: similarity values held at once (per strip) by the chunked paths: 64 MiB of float32.
DEFAULT_BLOCK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class GalleryGroups:
    """Gallery columns max-pooled into groups before ranking: CLIP4Clip's v2t over a video's captions.

    ``order`` lists the columns group by group (None: they already are, as in
    a :class:`~mmcomp_eval.data.captions.CaptionDataset`); group ``k`` is
    ``order[starts[k]:starts[k + 1]]`` and scores as the best of them.
    """

    order: np.ndarray | None
    starts: np.ndarray

    def pool(self, strip: np.ndarray) -> np.ndarray:
        """(queries x columns) scores -> (queries x groups) best scores."""
        grouped = strip if self.order is None else strip[:, self.order]
        return np.maximum.reduceat(grouped, self.starts, axis=1)


@dataclass(frozen=True)
class Relevance:
    """Which gallery items are hits for each query, in CSR form.

    ``queries[i]`` is the row of the query matrix that is query ``i``; its
    relevant gallery items are ``indices[indptr[i]:indptr[i + 1]]``.
    ``n_gallery`` counts the score columns a query gets; with ``groups`` they
    are pooled into groups first and ``indices`` name groups.
    """

    queries: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    n_gallery: int
    groups: GalleryGroups | None = None

    @property
    def one_per_query(self) -> bool:
        return len(self.indices) == len(self.queries)


def _check_mapping(caption_video: Sequence[int] | np.ndarray, n_videos: int) -> np.ndarray:
    cv = np.asarray(caption_video)
    if cv.ndim != 1 or (cv.size and not np.issubdtype(cv.dtype, np.integer)):
        raise UserError(f"caption->video mapping must be a 1-D list of video indices, got shape {cv.shape} "
                        f"dtype {cv.dtype}")
    if cv.size and (cv.min() < 0 or cv.max() >= n_videos):
        bad = int(cv[(cv < 0) | (cv >= n_videos)][0])
        raise UserError(f"caption->video mapping names video index {bad}, outside 0..{n_videos - 1}")
    return cv.astype(np.int64, copy=False)


def text_to_video(caption_video: Sequence[int] | np.ndarray, n_videos: int) -> Relevance:
    """Each caption is a query whose one relevant item is its video."""
    cv = _check_mapping(caption_video, n_videos)
    n = len(cv)
    return Relevance(np.arange(n), np.arange(n + 1), cv, n_videos)


def video_to_text(caption_video: Sequence[int] | np.ndarray, n_videos: int,
                  convention: str = DEFAULT_V2T) -> Relevance:
    """Each video with captions is a query, against caption sets or single captions (:data:`V2T_CONVENTIONS`)."""
    check_v2t_convention(convention)
    cv = _check_mapping(caption_video, n_videos)
    order = np.argsort(cv, kind="stable")
    counts = np.bincount(cv, minlength=n_videos)
    queries = np.flatnonzero(counts)
    indptr = np.concatenate([[0], np.cumsum(counts[queries])])
    if convention == "all_captions" or len(cv) == len(queries):
        # with one caption per video a caption set is that caption: both conventions are the same ranking
        return Relevance(queries, indptr, order, len(cv))
    # best_caption: group k is query k's captions; its one relevant item is group k
    n = len(queries)
    grouped = None if np.array_equal(order, np.arange(len(cv))) else order
    return Relevance(queries, np.arange(n + 1), np.arange(n), len(cv), GalleryGroups(grouped, indptr[:-1]))


def check_v2t_convention(convention: str) -> str:
    if convention not in V2T_CONVENTIONS:
        raise UserError(f"video-to-text convention {convention!r} is not one of {', '.join(V2T_CONVENTIONS)}")
    return convention


def _strip_ranks(strip: np.ndarray, rel: Relevance, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Ranks of queries ``lo:hi`` given their scores ``strip`` (rows = those queries), and each one's top item.

    The top item is the gallery column (group) scoring highest, the first on
    a tie: what the query retrieved first, shown in a run's samples.
    """
    b = hi - lo
    start, stop = rel.indptr[lo], rel.indptr[hi]
    cols = rel.indices[start:stop]
    if rel.one_per_query:
        rows = np.arange(b)
        best = strip[rows, cols]
        own = 1
    else:
        rows = np.repeat(np.arange(b), np.diff(rel.indptr[lo:hi + 1]))
        scores = strip[rows, cols]
        best = np.full(b, -np.inf, dtype=strip.dtype)
        np.maximum.at(best, rows, scores)
        # relevant items tied with the best one are not competitors
        own = np.bincount(rows, weights=scores >= best[rows], minlength=b).astype(np.int64)
    # summing a uint8 view with an int32 accumulator is ~2x faster than count_nonzero(axis=1)
    at_least = (strip >= best[:, None]).view(np.uint8).sum(axis=1, dtype=np.int32)
    return 1 + at_least.astype(np.int64) - own, strip.argmax(axis=1)


def _rows_per_block(n_gallery: int, block_elements: int) -> int:
    return max(1, block_elements // max(1, n_gallery))


def ranks_from_similarity(sim: np.ndarray, rel: Relevance, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, top items) from a (queries x gallery) score matrix, ``block_elements`` scores compared at a time."""
    if sim.shape[1] != rel.n_gallery:
        raise UserError(f"similarity matrix has {sim.shape[1]} gallery columns, the mapping needs {rel.n_gallery}")
    step = _rows_per_block(rel.n_gallery, block_elements)
    out = np.empty(len(rel.queries), dtype=np.int64)
    top = np.empty(len(rel.queries), dtype=np.int64)
    contiguous = len(rel.queries) == sim.shape[0]  # every row is a query, in order
    for lo in range(0, len(rel.queries), step):
        hi = min(lo + step, len(rel.queries))
        strip = sim[lo:hi] if contiguous else sim[rel.queries[lo:hi]]
        if np.isnan(strip).any():
            row = int(rel.queries[lo + np.flatnonzero(np.isnan(strip).any(axis=1))[0]])
            raise UserError(f"similarity row {row} contains NaN; fix the model's embeddings (a zero vector "
                            "normalised?)")
        out[lo:hi], top[lo:hi] = _strip_ranks(_pooled(strip, rel), rel, lo, hi)
    return out, top


def ranks_from_embeddings(query_emb: np.ndarray, gallery_emb: np.ndarray, rel: Relevance, *,
                          block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, top items) with scores ``query_emb @ gallery_emb.T``, computed one strip of queries at a time.

    Peak extra memory is about ``block_elements`` float32 scores plus as many
    bytes for the comparison, whatever the gallery size.
    """
    q = _finite_2d(query_emb, "query embeddings")
    g = _finite_2d(gallery_emb, "gallery embeddings")
    if q.shape[1] != g.shape[1]:
        raise UserError(f"query embeddings have {q.shape[1]} dimensions, gallery embeddings {g.shape[1]}: "
                        "both must come from the same model")
    if g.shape[0] != rel.n_gallery:
        raise UserError(f"{g.shape[0]} gallery embeddings, the mapping needs {rel.n_gallery}")
    step = _rows_per_block(rel.n_gallery, block_elements)
    out = np.empty(len(rel.queries), dtype=np.int64)
    top = np.empty(len(rel.queries), dtype=np.int64)
    gt = np.ascontiguousarray(g.T)
    for lo in range(0, len(rel.queries), step):
        hi = min(lo + step, len(rel.queries))
        strip = q[rel.queries[lo:hi]] @ gt
        out[lo:hi], top[lo:hi] = _strip_ranks(_pooled(strip, rel), rel, lo, hi)
    return out, top


def _pooled(strip: np.ndarray, rel: Relevance) -> np.ndarray:
    return strip if rel.groups is None else rel.groups.pool(strip)


def _finite_2d(x: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 2:
        raise UserError(f"{what} must be 2-D (items x dimensions), got shape {a.shape}")
    if a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float32)
    if not np.isfinite(a).all():
        raise UserError(f"{what} contain NaN or inf; fix the model or the feature files")
    return a


# -- summaries -----------------------------------------------------------------


def summarize(ranks: np.ndarray, n_gallery: int | None = None) -> dict[str, float | int]:
    """R@1/5/10 and SumR in percent, median and mean rank (1 = best), query count (and gallery size)."""
    r = np.asarray(ranks)
    if r.size == 0:
        raise UserError("no queries to score: the dataset has no captions")
    out: dict[str, float | int] = {f"R{k}": float(100.0 * np.count_nonzero(r <= k) / r.size) for k in KS}
    out["SumR"] = sum(out[f"R{k}"] for k in KS)
    out["MdR"] = float(np.median(r))
    out["MnR"] = float(r.mean())
    out["n_queries"] = int(r.size)
    if n_gallery is not None:
        out["n_gallery"] = int(n_gallery)
    return out


@dataclass
class RetrievalScores:
    """Ranks of both directions; ``v2t_videos`` are the video indices queried in v2t.

    ``t2v_top`` is the video each caption retrieved first; ``v2t_top`` the
    video whose caption set (``best_caption``) or caption (``all_captions``)
    each video query retrieved first.
    """

    t2v_ranks: np.ndarray
    v2t_ranks: np.ndarray
    v2t_videos: np.ndarray
    n_videos: int
    n_captions: int
    v2t_convention: str = DEFAULT_V2T
    t2v_top: np.ndarray | None = None
    v2t_top: np.ndarray | None = None

    def metrics(self) -> dict[str, dict]:
        """Both directions' summaries; ``n_gallery`` says what a v2t rank is out of."""
        v2t_gallery = len(self.v2t_videos) if self.v2t_convention == "best_caption" else self.n_captions
        return {"t2v": summarize(self.t2v_ranks, self.n_videos), "v2t": summarize(self.v2t_ranks, v2t_gallery)}


def score_similarity(sim: np.ndarray, caption_video: Sequence[int] | np.ndarray, *,
                     block_elements: int = DEFAULT_BLOCK_ELEMENTS, v2t: str = DEFAULT_V2T) -> RetrievalScores:
    """Both directions from a (captions x videos) similarity matrix; ``v2t`` is a :data:`V2T_CONVENTIONS` name."""
    s = np.asarray(sim)
    if s.ndim != 2 or s.shape[0] != len(caption_video):
        raise UserError(f"similarity matrix shape {s.shape} does not match {len(caption_video)} captions "
                        "(rows must be captions, columns videos)")
    t2v = text_to_video(caption_video, s.shape[1])
    v2t_rel = video_to_text(caption_video, s.shape[1], v2t)
    t2v_ranks, t2v_top = ranks_from_similarity(s, t2v, block_elements=block_elements)
    v2t_ranks, v2t_top = ranks_from_similarity(s.T, v2t_rel, block_elements=block_elements)
    return RetrievalScores(t2v_ranks, v2t_ranks, v2t_rel.queries, s.shape[1], s.shape[0], v2t,
                           t2v_top, _v2t_top(v2t_top, v2t_rel, caption_video))


def score_embeddings(text_emb: np.ndarray, video_emb: np.ndarray, caption_video: Sequence[int] | np.ndarray, *,
                     block_elements: int = DEFAULT_BLOCK_ELEMENTS, v2t: str = DEFAULT_V2T) -> RetrievalScores:
    """Both directions with similarity = dot product (cosine for normalised embeddings), chunked."""
    n_videos = np.asarray(video_emb).shape[0]
    if np.asarray(text_emb).shape[0] != len(caption_video):
        raise UserError(f"{np.asarray(text_emb).shape[0]} caption embeddings for {len(caption_video)} captions")
    t2v = text_to_video(caption_video, n_videos)
    v2t_rel = video_to_text(caption_video, n_videos, v2t)
    t2v_ranks, t2v_top = ranks_from_embeddings(text_emb, video_emb, t2v, block_elements=block_elements)
    v2t_ranks, v2t_top = ranks_from_embeddings(video_emb, text_emb, v2t_rel, block_elements=block_elements)
    return RetrievalScores(t2v_ranks, v2t_ranks, v2t_rel.queries, n_videos, len(caption_video), v2t,
                           t2v_top, _v2t_top(v2t_top, v2t_rel, caption_video))


def _v2t_top(top: np.ndarray, rel: Relevance, caption_video: Sequence[int] | np.ndarray) -> np.ndarray:
    """The video of each v2t query's top item: a caption set's video, or the top caption's video."""
    return rel.queries[top] if rel.groups is not None else np.asarray(caption_video)[top]


def mean_r1(r1_by_dataset: Mapping[str, float]) -> float:
    """mR1: the unweighted mean of R@1 over datasets (each dataset counts once, whatever its size)."""
    if not r1_by_dataset:
        raise UserError("mR1 needs R@1 of at least one dataset")
    return float(sum(r1_by_dataset.values()) / len(r1_by_dataset))
