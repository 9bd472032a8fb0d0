"""Exact match after the normalisation that makes CompAct's forms comparable.

CompAct writes multiword atoms as ``pick_up`` while generative models write
"pick up", and LLMs often end with a period and a capital letter that the
references never have. None of these are errors of content, so both sides
are normalised before comparing: strip, lower-case, ``_`` -> space, runs of
whitespace -> one space, and trailing periods are dropped (a narration never
ends in one). Anything else (other punctuation, articles, word order) still
counts as a mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.metrics._common import check_lengths, mean
from mmcomp_eval.metrics.registry import METRICS, NO_RESOURCES, MetricResources
from mmcomp_eval.textnorm import normalise

__all__ = ["ExactMatch", "normalise"]


@METRICS.register("exact_match", aliases=("em",))
class ExactMatch(Metric):
    """Exact match after normalisation (case, "_" = space, whitespace, trailing period)."""

    name = "exact_match"

    def __init__(self, resources: MetricResources = NO_RESOURCES):
        pass

    def compute(self, predictions: Sequence[str], references: Sequence[str],
                docs: Sequence[Document] = ()) -> MetricResult:
        check_lengths(self.name, predictions, references)
        per_sample = tuple(
            100.0 if normalise(p) == normalise(r) else 0.0 for p, r in zip(predictions, references)
        )
        return MetricResult(self.name, mean(per_sample), per_sample)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "normalisation": "strip, lower-case, '_' as space, collapse whitespace, drop trailing periods",
        }
