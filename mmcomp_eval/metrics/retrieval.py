"""Retrieval metrics per direction: ``{t2v,v2t}_{r1,r5,r10,mdr,mnr,sumr}``.

A retrieval task (``output_type: retrieval``) has one document per query of
both directions: each caption is a text-to-video (``t2v``) query, each video
with captions a video-to-text (``v2t``) query (``direction`` field). Its
prediction is the rank of the query's relevant item (1 = retrieved first;
ties pessimistic, see :mod:`mmcomp_eval.retrieval.ranking`). A metric of one
direction scores that direction's queries and gives NaN for the others, so
its per-sample scores are per query and a bootstrap resamples queries:

==========  ============================================  ==================
name        per query                                     corpus value
==========  ============================================  ==================
``*_r1``    100 if rank <= 1 else 0 (also r5, r10)        mean: R@k in %
``*_sumr``  100 x ([rank<=1] + [rank<=5] + [rank<=10])    mean: R1+R5+R10
``*_mnr``   the rank                                      mean: MnR
``*_mdr``   the rank                                      median: MdR
==========  ============================================  ==================

SumR is a sum of percents (up to 300), SAVE's primary score. MdR and MnR
are lower-is-better. mR1 (the mean R@1 over datasets) is not a task metric:
``compare`` computes it over runs, only where every run has every dataset.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.errors import UserError
from mmcomp_eval.metrics.registry import METRICS

DIRECTIONS = {"t2v": "text-to-video: each caption ranks the gallery videos",
              "v2t": "video-to-text: each video ranks the captions (see the task's v2t convention)"}


class RetrievalMetric(Metric):
    """A summary of the ranks of one direction's queries."""

    output_types = ("retrieval",)
    direction: ClassVar[str]
    statistic: ClassVar[str]  # what the per-query score is, in words

    def __init__(self, resources=None):
        pass

    @abstractmethod
    def per_query(self, ranks: np.ndarray) -> np.ndarray:
        """The score of each query of this direction, from its rank."""

    def compute(self, predictions: Sequence[str], references: Sequence[str], docs: Sequence[Document]) -> MetricResult:
        mine = [i for i, d in enumerate(docs) if d.get("direction") == self.direction]
        if not mine:
            raise UserError(f"metric {self.name}: no {self.direction} query among {len(docs)} documents; "
                            "retrieval metrics score documents of a retrieval task")
        try:
            ranks = np.array([int(predictions[i]) for i in mine], dtype=np.int64)
        except ValueError:
            raise UserError(f"metric {self.name}: predictions must be ranks (1, 2, ...), got "
                            f"{predictions[mine[0]]!r}; it scores output_type retrieval") from None
        per = np.full(len(docs), np.nan)
        per[mine] = self.per_query(ranks)
        scored = per[mine]
        value = float(np.median(scored) if self.aggregation == "median" else scored.mean())
        return MetricResult(self.name, value, tuple(per.tolist()))

    def describe(self) -> dict:
        return {"name": self.name, "direction": DIRECTIONS[self.direction], "per_query": self.statistic,
                "aggregation": self.aggregation, "higher_is_better": self.higher_is_better,
                "tie_rule": "pessimistic: an irrelevant item scoring the same as the best relevant one ranks before it"}


class _RecallAt(RetrievalMetric):
    k: ClassVar[int]

    def per_query(self, ranks: np.ndarray) -> np.ndarray:
        return 100.0 * (ranks <= self.k)


class _SumR(RetrievalMetric):
    statistic = "100 x ([rank <= 1] + [rank <= 5] + [rank <= 10]); the mean is R@1 + R@5 + R@10"

    def per_query(self, ranks: np.ndarray) -> np.ndarray:
        return 100.0 * ((ranks <= 1).astype(float) + (ranks <= 5) + (ranks <= 10))


class _Rank(RetrievalMetric):
    higher_is_better = False
    statistic = "the rank (1 = retrieved first)"

    def per_query(self, ranks: np.ndarray) -> np.ndarray:
        return ranks.astype(float)


def _register() -> None:
    """Twelve metrics, the same six summaries for each direction; the class names say which."""
    kinds: list[tuple[str, type[RetrievalMetric], dict]] = [
        *((f"r{k}", _RecallAt, {"k": k, "statistic": f"100 if rank <= {k} else 0; the mean is R@{k} in %"})
          for k in (1, 5, 10)),
        ("sumr", _SumR, {}),
        ("mnr", _Rank, {"statistic": "the rank; the mean is MnR (mean rank)"}),
        ("mdr", _Rank, {"aggregation": "median", "statistic": "the rank; the median is MdR (median rank)"}),
    ]
    for direction in DIRECTIONS:
        for short, base, attrs in kinds:
            name = f"{direction}_{short}"
            statistic = attrs["statistic"] if "statistic" in attrs else base.statistic
            doc = f"{short.upper()} {direction}: {statistic}"
            METRICS.add(name, type(f"{direction.upper()}_{short.upper()}", (base,),
                                   {"name": name, "direction": direction, "__doc__": doc, **attrs}))


_register()
