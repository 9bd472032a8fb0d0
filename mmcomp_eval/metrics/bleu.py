"""BLEU as torchtext computes it, so scores compare with CompAct's tables.

CompAct reports ``torchtext.data.metrics.bleu_score(..., max_n=1,
weights=[1.0])``. torchtext cannot be installed next to current torch, so
its algorithm is reproduced here step for step:

* n-gram counts per pair, clipped by the reference counts;
* corpus-level sums of clipped counts, candidate n-gram counts, candidate
  length ``c`` and reference length ``r``;
* 0 as soon as any order has no clipped match at all (this is also what an
  empty candidate gets), otherwise
  ``exp(min(1 - r/c, 0)) * exp(sum_n w_n log p_n)`` with ``w_n = 1/max_n``.

Text is split on whitespace and nothing else: no lower-casing, and CompAct's
``pick_up`` stays one token, as in the paper's own evaluation.

torchtext keeps its counts in float32 tensors; this module computes in
float64, so the two differ by float32 rounding (under 1e-7 relative, e.g.
33.333331 vs 33.333333 on the 0-100 scale), far below reported precision.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.errors import UserError
from mmcomp_eval.metrics._common import check_lengths
from mmcomp_eval.metrics.registry import METRICS, NO_RESOURCES, MetricResources


def _ngrams(tokens: list[str], max_n: int) -> Counter:
    return Counter(
        tuple(tokens[i:i + n]) for n in range(1, max_n + 1) for i in range(len(tokens) - n + 1)
    )


class _Counts:
    """The sufficient statistics of BLEU; corpus counts are sums of pair counts."""

    def __init__(self, max_n: int):
        self.clipped = [0] * max_n
        self.total = [0] * max_n
        self.cand_len = 0
        self.ref_len = 0

    def add(self, candidate: list[str], reference: list[str]) -> None:
        max_n = len(self.clipped)
        for ngram, count in (_ngrams(candidate, max_n) & _ngrams(reference, max_n)).items():
            self.clipped[len(ngram) - 1] += count
        for i in range(len(self.total)):
            self.total[i] += max(len(candidate) - i, 0)
        self.cand_len += len(candidate)
        self.ref_len += len(reference)

    def score(self) -> float:
        if min(self.clipped) == 0:
            return 0.0
        weight = 1.0 / len(self.clipped)
        log_precision = sum(weight * math.log(m / t) for m, t in zip(self.clipped, self.total))
        brevity = math.exp(min(1 - self.ref_len / self.cand_len, 0))
        return brevity * math.exp(log_precision)


def bleu(candidates: Sequence[str], references: Sequence[str], max_n: int = 1) -> tuple[float, list[float]]:
    """(corpus BLEU, per-pair BLEU), both on the 0-1 scale."""
    corpus = _Counts(max_n)
    per_pair = []
    for cand, ref in zip(candidates, references, strict=True):
        cand_tokens, ref_tokens = cand.split(), ref.split()
        corpus.add(cand_tokens, ref_tokens)
        pair = _Counts(max_n)
        pair.add(cand_tokens, ref_tokens)
        per_pair.append(pair.score())
    return corpus.score(), per_pair


@METRICS.register("bleu")
class Bleu(Metric):
    """Corpus BLEU (unigram by default, as in CompAct); per sample, each pair alone.

    The per-sample scores do not average to the corpus score: BLEU pools
    counts over the corpus before dividing, which is what torchtext reports.
    """

    name = "bleu"
    decomposable = False

    def __init__(self, resources: MetricResources = NO_RESOURCES, *, max_n: int = 1):
        if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
            raise UserError(f"metric 'bleu': max_n must be a positive integer, got {max_n!r}")
        self.max_n = max_n

    def compute(self, predictions: Sequence[str], references: Sequence[str],
                docs: Sequence[Document] = ()) -> MetricResult:
        check_lengths(self.name, predictions, references)
        corpus, per_pair = bleu(predictions, references, self.max_n)
        return MetricResult(self.name, 100 * corpus, tuple(100 * s for s in per_pair))

    def corpus_stats(self, predictions: Sequence[str], references: Sequence[str],
                     docs: Sequence[Document] = ()) -> list[tuple[float, ...]]:
        """Per pair: clipped matches and candidate n-grams per order, candidate and reference length."""
        check_lengths(self.name, predictions, references)
        rows = []
        for cand, ref in zip(predictions, references):
            c = _Counts(self.max_n)
            c.add(cand.split(), ref.split())
            rows.append((*c.clipped, *c.total, c.cand_len, c.ref_len))
        return rows

    def from_stats(self, totals: Sequence[float]) -> float:
        c = _Counts(self.max_n)
        n = self.max_n
        c.clipped, c.total = list(totals[:n]), list(totals[n : 2 * n])
        c.cand_len, c.ref_len = totals[2 * n], totals[2 * n + 1]
        return 100 * c.score()

    def describe(self) -> dict:
        return {
            "name": self.name,
            "max_n": self.max_n,
            "weights": "uniform",
            "tokenisation": "whitespace",
            "reference": "torchtext.data.metrics.bleu_score",
        }
