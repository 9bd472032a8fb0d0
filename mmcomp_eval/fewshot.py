"""Choosing few-shot examples from the training split.

``similar`` is CompAct's heuristic (appendix E.3.2): a training instance is
as similar to the query as the number of nouns plus the number of verbs the
two share. Only the *context* clips count on both sides by default: the
query's target is what the model must predict, so looking at it would leak
the answer into the choice of examples.

All samplers are deterministic for a seed, never return the query itself,
and score every query against the whole pool at once (one sparse product),
so 2,175 queries x 4,407 candidates take milliseconds, not a Python loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.registry import Registry

SAMPLERS: Registry[type[Sampler]] = Registry("few-shot sampler")


class Sampler(ABC):
    def __init__(self, **options):
        if options:
            key = next(iter(options))
            raise UserError(f"few-shot sampler '{self.name}' has no option '{key}'")

    name = "sampler"

    def select(self, queries: Sequence[Document], pool: Sequence[Document], k: int, seed: int) -> list[list[int]]:
        """For each query, ``k`` indices into ``pool``, best first."""
        if k == 0:
            return [[] for _ in queries]
        if k < 0:
            raise UserError(f"--shots {k}: expected 0 or more")
        pool_ids = {d.id: i for i, d in enumerate(pool)}
        overlap = any(q.id in pool_ids for q in queries)
        if k > len(pool) - int(overlap):
            raise UserError(f"--shots {k} is larger than the few-shot pool ({len(pool)} documents"
                            f"{', the query excluded' if overlap else ''}); use at most {len(pool) - int(overlap)}")
        self_index = np.array([pool_ids.get(q.id, -1) for q in queries])
        return self._select(queries, pool, k, np.random.default_rng(seed), self_index)

    @abstractmethod
    def _select(self, queries, pool, k: int, rng: np.random.Generator, self_index: np.ndarray) -> list[list[int]]: ...


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

    def select(self, queries, pool, k, seed):
        return [[] for _ in queries]

    def _select(self, queries, pool, k, rng, self_index):  # pragma: no cover - select() never calls it
        return [[] for _ in queries]


@SAMPLERS.register("first")
class FirstShots(Sampler):
    """The first ``k`` pool documents (skipping the query): a fixed prompt for all queries."""

    name = "first"

    def _select(self, queries, pool, k, rng, self_index):
        return [[i for i in range(k + 1) if i != s][:k] for s in self_index]


@SAMPLERS.register("random")
class RandomShots(Sampler):
    """``k`` distinct pool documents drawn uniformly per query (seeded)."""

    name = "random"

    def _select(self, queries, pool, k, rng, self_index):
        keys = rng.random((len(queries), len(pool)))
        rows = np.arange(len(queries))
        has_self = self_index >= 0
        keys[rows[has_self], self_index[has_self]] = -1.0
        return np.argpartition(-keys, k - 1, axis=1)[:, :k].tolist()


@SAMPLERS.register("similar")
class SimilarShots(Sampler):
    """Most shared nouns + verbs first; ties broken by a seeded random order."""

    name = "similar"
    CLIP_SCOPES = ("context", "all")

    def __init__(self, noun_field: str = "nouns", verb_field: str = "verbs", clips: str = "context"):
        if clips not in self.CLIP_SCOPES:
            raise UserError(f"few-shot sampler 'similar': clips {clips!r} is not one of "
                            f"{', '.join(self.CLIP_SCOPES)}{did_you_mean(clips, self.CLIP_SCOPES)}")
        self.noun_field, self.verb_field, self.clips = noun_field, verb_field, clips

    def _atoms(self, doc: Document) -> set[str]:
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

    def _select(self, queries, pool, k, rng, self_index):
        vocab: dict[str, int] = {}
        pool_rows = [[vocab.setdefault(a, len(vocab)) for a in self._atoms(d)] for d in pool]
        query_rows = [[vocab[a] for a in self._atoms(q) if a in vocab] for q in queries]
        pool_m = _indicator(pool_rows, len(vocab))
        query_m = _indicator(query_rows, len(vocab))
        scores = (query_m @ pool_m.T).toarray() if hasattr(query_m, "toarray") else query_m @ pool_m.T
        scores = np.asarray(scores).astype(np.int32)
        has_self = self_index >= 0
        scores[np.arange(len(queries))[has_self], self_index[has_self]] = -1
        tie_rank = rng.permutation(len(pool))
        return _top_k(scores, k, tie_rank)


def _indicator(rows: list[list[int]], width: int):
    """A sparse 0/1 matrix (scipy when available, else dense float32)."""
    indptr = np.cumsum([0, *map(len, rows)])
    indices = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(indptr[-1]))
    try:
        from scipy.sparse import csr_matrix
    except ImportError:
        dense = np.zeros((len(rows), width), dtype=np.float32)
        dense[np.repeat(np.arange(len(rows)), np.diff(indptr)), indices] = 1.0
        return dense
    return csr_matrix((np.ones(len(indices), dtype=np.float32), indices, indptr), shape=(len(rows), width))


def build_sampler(name: str, options: dict) -> Sampler:
    cls = SAMPLERS.get(name)
    try:
        return cls(**options)
    except TypeError as exc:
        raise UserError(f"few-shot sampler '{name}': bad options {options} ({exc})") from None
