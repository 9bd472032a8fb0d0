"""Choosing few-shot examples from the training split.

``similar`` is CompAct's heuristic (appendix E.3.2): a training instance is
as similar to the query as the size of the intersection of their noun sets
plus that of their verb sets. Only the *context* clips count on both sides
by default: the query's target is what the model must predict, so looking at
it would leak the answer into the choice of examples, and the shot's target
is left out too so that like is compared with like (the inputs a model sees),
as in the input-similarity retrieval of Liu et al. (2022) the paper follows.

Shots never share a clip with their query. CompAct windows overlap
(``P01_01_241-244`` and ``P01_01_244-247`` share clip 244), so without this
rule a shot can show the query's target narration as its own context: the
similar sampler did so for 34 of 2,156 compositional and 490 of 2,156
random-split test queries (bench/bench_shot_leaks.py). Every sampler drops
the pool documents that share a clip (same ``video_id``, a common entry of
``narration_ids``) with the query before it chooses; the task option
``fewshot.options.exclude_shared_clips: false`` turns this off. Documents
without those two fields (most user tasks) have no clips to share: the rule
is then recorded as not applicable and only the query itself is excluded.

All samplers are deterministic for a seed, never return the query itself,
and score every query against the whole pool at once (sparse products), so
2,156 queries x 4,453 candidates take a fraction of a second (bench/bench_compact.py).
Dropping later queries (``--limit``) never changes an earlier query's shots;
for ``similar`` and ``first`` a query's shots do not depend on the other
queries at all (``random`` draws one row of keys per query position).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.registry import Registry

SAMPLERS: Registry[type[Sampler]] = Registry("few-shot sampler")

#: The option every sampler takes; it survives ``--sampler`` overriding the task's sampler.
EXCLUDE_OPTION = "exclude_shared_clips"
#: Fields that say which clips a document covers.
VIDEO_FIELD, CLIPS_FIELD = "video_id", "narration_ids"
SHARED_CLIP_RULE = (f"a pool document that shares a clip with the query (same {VIDEO_FIELD}, a common "
                    f"{CLIPS_FIELD} entry) is never one of its shots")


@dataclass(frozen=True)
class ShotExclusion:
    """What the shared-clip rule did to one task's few-shot candidates (results.json).

    ``status``: ``applied``; ``off`` (the task set the option to false);
    ``not_applicable`` (the documents carry no ``video_id`` / ``narration_ids``);
    ``no_shots`` (0 shots, nothing chosen). The counts are candidates removed,
    (query, pool document) pairs, the query itself not counted.
    """

    status: str
    excluded_pairs: int = 0
    queries_affected: int = 0
    max_excluded_per_query: int = 0

    def as_dict(self) -> dict:
        return {"rule": SHARED_CLIP_RULE, "option": f"fewshot.options.{EXCLUDE_OPTION}", "status": self.status,
                "excluded_pairs": self.excluded_pairs, "queries_affected": self.queries_affected,
                "max_excluded_per_query": self.max_excluded_per_query}


@dataclass(frozen=True)
class Selection:
    picks: list[list[int]]  # per query, indices into the pool, best first
    exclusion: ShotExclusion


@dataclass(frozen=True)
class _Excluded:
    """(query row, pool index) pairs no sampler may pick: the query itself and shared-clip documents."""

    rows: np.ndarray
    cols: np.ndarray


class Sampler(ABC):
    name = "sampler"

    def __init__(self, exclude_shared_clips: bool = True):
        if not isinstance(exclude_shared_clips, bool):
            raise UserError(f"few-shot sampler '{self.name}': option {EXCLUDE_OPTION} is "
                            f"{exclude_shared_clips!r}; expected true or false")
        self.exclude_shared_clips = exclude_shared_clips

    def select(self, queries: Sequence[Document], pool: Sequence[Document], k: int, seed: int) -> list[list[int]]:
        """For each query, ``k`` indices into ``pool``, best first."""
        return self.choose(queries, pool, k, seed).picks

    def choose(self, queries: Sequence[Document], pool: Sequence[Document], k: int, seed: int) -> Selection:
        """The shots of every query, with what the shared-clip rule excluded."""
        if k < 0:
            raise UserError(f"--shots {k}: expected 0 or more")
        if k == 0:
            return Selection([[] for _ in queries], ShotExclusion("no_shots"))
        pool_ids = {d.id: i for i, d in enumerate(pool)}
        overlap = any(q.id in pool_ids for q in queries)
        if k > len(pool) - int(overlap):
            raise UserError(f"--shots {k} is larger than the few-shot pool ({len(pool)} documents"
                            f"{', the query excluded' if overlap else ''}); use at most {len(pool) - int(overlap)}")
        self_index = np.array([pool_ids.get(q.id, -1) for q in queries], dtype=np.int64)
        exclusion, excluded = self._exclusions(queries, pool, self_index)
        _check_enough_candidates(queries, len(pool), k, excluded.rows)
        return Selection(self._select(queries, pool, k, np.random.default_rng(seed), excluded), exclusion)

    def _exclusions(self, queries, pool, self_index: np.ndarray) -> tuple[ShotExclusion, _Excluded]:
        """The query itself (where the pool holds it) and, by default, every pool document sharing a clip."""
        rows, cols = np.flatnonzero(self_index >= 0), self_index[self_index >= 0]
        if not self.exclude_shared_clips:
            return ShotExclusion("off"), _Excluded(rows, cols)
        shared = shared_clip_pairs(queries, pool)
        if shared is None:
            return ShotExclusion("not_applicable"), _Excluded(rows, cols)
        not_self = shared[1] != self_index[shared[0]]
        per_query = np.bincount(shared[0][not_self], minlength=len(queries))
        exclusion = ShotExclusion("applied", int(per_query.sum()), int((per_query > 0).sum()),
                                  int(per_query.max(initial=0)))
        key = np.unique(np.concatenate([rows, shared[0]]) * len(pool) + np.concatenate([cols, shared[1]]))
        return exclusion, _Excluded(*np.divmod(key, len(pool)))

    @abstractmethod
    def _select(self, queries, pool, k: int, rng: np.random.Generator, excluded: _Excluded) -> list[list[int]]: ...


def _check_enough_candidates(queries: Sequence[Document], pool_size: int, k: int, rows: np.ndarray) -> None:
    excluded = np.bincount(rows, minlength=len(queries))
    short = np.flatnonzero(pool_size - excluded < k)
    if len(short):
        i = int(short[0])
        most = pool_size - int(excluded.max())
        raise UserError(f"--shots {k}: query {queries[i].id} has only {pool_size - int(excluded[i])} few-shot "
                        f"candidates once the pool documents sharing a clip with it are excluded "
                        f"({len(short)} queries are short); use --shots {most} or fewer, or set "
                        f"fewshot.options.{EXCLUDE_OPTION}: false")


def shared_clip_pairs(queries: Sequence[Document], pool: Sequence[Document]) -> tuple[np.ndarray, np.ndarray] | None:
    """(query row, pool index) of every pair that shares a clip, or ``None`` when no document has clips.

    A clip is a (``video_id``, narration id) pair, so ids need only be unique within a
    video. One sparse product of query x clip and clip x pool indicators.
    """
    query_clips, pool_clips = _clips(queries, "query"), _clips(pool, "few-shot pool")
    if query_clips is None and pool_clips is None:
        return None
    if query_clips is None or pool_clips is None:
        side = "query" if query_clips is None else "few-shot pool"
        raise UserError(f"few-shot exclusion: the {side} documents have no '{VIDEO_FIELD}' / '{CLIPS_FIELD}' fields "
                        f"but the others do; give every document both, or set fewshot.options.{EXCLUDE_OPTION}: false")
    vocab: dict[tuple[str, str], int] = {}
    pool_rows = [[vocab.setdefault(c, len(vocab)) for c in clips] for clips in pool_clips]
    query_rows = [[vocab[c] for c in clips if c in vocab] for clips in query_clips]
    product = (_indicator(query_rows, len(vocab)) @ _indicator(pool_rows, len(vocab)).T).tocoo()
    return product.row.astype(np.int64), product.col.astype(np.int64)


def _clips(docs: Sequence[Document], role: str) -> list[list[tuple[str, str]]] | None:
    """Each document's clips; ``None`` when no document carries clip fields."""
    if not any(VIDEO_FIELD in d.fields or CLIPS_FIELD in d.fields for d in docs):
        return None
    out = []
    for d in docs:
        missing = [f for f in (VIDEO_FIELD, CLIPS_FIELD) if f not in d.fields]
        if missing:
            raise UserError(f"few-shot exclusion: {role} document {d.id} has no field '{missing[0]}' while other "
                            f"documents carry clips; give every document '{VIDEO_FIELD}' and '{CLIPS_FIELD}', "
                            f"or set fewshot.options.{EXCLUDE_OPTION}: false")
        ids = d.fields[CLIPS_FIELD]
        if not isinstance(ids, (list, tuple)):
            raise UserError(f"few-shot exclusion: {role} document {d.id} has {CLIPS_FIELD} {ids!r}; "
                            "expected a list of narration ids")
        video = str(d.fields[VIDEO_FIELD])
        out.append([(video, str(i)) for i in ids])
    return out


def _top_k(scores: np.ndarray, k: int, tie_rank: np.ndarray) -> list[list[int]]:
    """Highest ``scores`` per row; equal scores ordered by ``tie_rank`` (lower first)."""
    n = scores.shape[1]
    # Integer keys (exact, and argpartition is faster on int32 than float64).
    dtype = np.int32 if (scores.max(initial=0) + 2) * (n + 1) < 2**31 else np.int64
    key = scores.astype(dtype) * dtype(n + 1) - tie_rank.astype(dtype)[None, :]
    part = np.argpartition(-key, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(key, part, axis=1).argsort(axis=1)[:, ::-1]
    return np.take_along_axis(part, order, axis=1).tolist()


@SAMPLERS.register("none")
class NoShots(Sampler):
    name = "none"

    def choose(self, queries, pool, k, seed):
        return Selection([[] for _ in queries], ShotExclusion("no_shots"))

    def _select(self, queries, pool, k, rng, excluded):  # pragma: no cover - choose() never calls it
        return [[] for _ in queries]


@SAMPLERS.register("first")
class FirstShots(Sampler):
    """The first ``k`` pool documents that are allowed: one fixed prompt, except where it overlaps the query."""

    name = "first"

    def _select(self, queries, pool, k, rng, excluded):
        per_query = np.bincount(excluded.rows, minlength=len(queries))
        width = min(len(pool), k + int(per_query.max(initial=0)))  # the first k allowed lie in here
        blocked = np.zeros((len(queries), width), dtype=bool)
        near = excluded.cols < width
        blocked[excluded.rows[near], excluded.cols[near]] = True
        return np.argsort(blocked, axis=1, kind="stable")[:, :k].tolist()


@SAMPLERS.register("random")
class RandomShots(Sampler):
    """``k`` distinct pool documents drawn uniformly per query (seeded)."""

    name = "random"

    def _select(self, queries, pool, k, rng, excluded):
        keys = rng.random((len(queries), len(pool)))  # row-major: a query's row does not depend on later rows
        keys[excluded.rows, excluded.cols] = -1.0
        return np.argpartition(-keys, k - 1, axis=1)[:, :k].tolist()


@SAMPLERS.register("similar")
class SimilarShots(Sampler):
    """Most shared nouns + verbs first (set intersections); ties in a seeded random order.

    Tie-break: ``rank = numpy.random.default_rng(seed).permutation(len(pool))``
    and among equal scores the pool document with the lower ``rank`` comes
    first. The order depends on the seed and the pool only (the same for every
    query), so a query's shots are the same whatever other queries are scored.
    """

    name = "similar"
    CLIP_SCOPES = ("context", "all")

    def __init__(self, noun_field: str = "nouns", verb_field: str = "verbs", clips: str = "context",
                 exclude_shared_clips: bool = True):
        super().__init__(exclude_shared_clips)
        if clips not in self.CLIP_SCOPES:
            raise UserError(f"few-shot sampler 'similar': clips {clips!r} is not one of "
                            f"{', '.join(self.CLIP_SCOPES)}{did_you_mean(clips, self.CLIP_SCOPES)}")
        self.noun_field, self.verb_field, self.clips = noun_field, verb_field, clips

    def _atoms(self, doc: Document) -> set[str]:
        """Prefixed so that a word used as a noun and as a verb ("peel") counts in each set only."""
        out = set()
        for prefix, fname in (("n:", self.noun_field), ("v:", self.verb_field)):
            if fname not in doc.fields:
                raise UserError(f"few-shot sampler 'similar': document {doc.id} has no field '{fname}'")
            values = doc.fields[fname]
            values = [values] if isinstance(values, str) else list(values)
            if self.clips == "context" and len(values) > 1:
                values = values[:-1]
            out.update(prefix + str(v) for v in values)
        return out

    def _select(self, queries, pool, k, rng, excluded):
        vocab: dict[str, int] = {}
        pool_rows = [[vocab.setdefault(a, len(vocab)) for a in self._atoms(d)] for d in pool]
        query_rows = [[vocab[a] for a in self._atoms(q) if a in vocab] for q in queries]
        scores = (_indicator(query_rows, len(vocab)) @ _indicator(pool_rows, len(vocab)).T).toarray()
        scores = scores.astype(np.int32)
        scores[excluded.rows, excluded.cols] = -1
        tie_rank = rng.permutation(len(pool))
        return _top_k(scores, k, tie_rank)


def _indicator(rows: list[list[int]], width: int) -> csr_matrix:
    """A sparse 0/1 matrix with a row per list of column indices."""
    indptr = np.cumsum([0, *map(len, rows)])
    indices = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(indptr[-1]))
    return csr_matrix((np.ones(len(indices), dtype=np.float32), indices, indptr), shape=(len(rows), width))


def sampler_options(name: str, task_sampler: str, task_options: Mapping) -> dict:
    """The options for sampler ``name``: all the task's when it is the task's sampler, else
    (``--sampler`` overrides it) only the option every sampler takes."""
    if name == task_sampler:
        return dict(task_options)
    return {k: v for k, v in task_options.items() if k == EXCLUDE_OPTION}


def build_sampler(name: str, options: Mapping) -> Sampler:
    cls = SAMPLERS.get(name)
    known = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    for key in options:
        if key not in known:
            raise UserError(f"few-shot sampler '{name}' has no option '{key}'{did_you_mean(str(key), known)}; "
                            f"its options: {', '.join(known)}")
    return cls(**options)
