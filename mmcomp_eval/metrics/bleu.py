"""Corpus BLEU through sacrebleu, set up to give CompAct's torchtext numbers.

CompAct reports ``torchtext.data.metrics.bleu_score(..., max_n=1,
weights=[1.0])`` on whitespace tokens. torchtext cannot be installed next to
current torch, so the score comes from sacrebleu::

    BLEU(max_ngram_order=max_n, tokenize="none", lowercase=False,
         smooth_method="none", effective_order=False)

which computes the same quantity: n-gram counts per pair clipped by the
reference counts, summed over the corpus; 0 as soon as an order has no
clipped match (also what an empty candidate gets); otherwise the brevity
penalty ``exp(min(1 - r/c, 0))`` from the corpus lengths times the geometric
mean of the n-gram precisions with uniform weights. ``tests/test_metrics.py``
pins the two to each other on random corpora for max_n 1-4. They differ
only in float rounding (torchtext sums counts in float32: under 1e-5 on the
0-100 scale) and in what the options below change.

Options (task file, ``metrics: [{name: bleu, options: {...}}]``):

* ``max_n`` (default 1, the paper's): highest n-gram order, uniform weights.
* ``tokenize`` (default ``none``: split on whitespace, so CompAct's
  ``pick_up`` stays one token and punctuation stays attached, as in the
  paper): any sacrebleu tokenizer, e.g. ``13a`` (sacrebleu's default for MT,
  splits punctuation off) -- then the number is sacrebleu's, *not* torchtext's.
* ``lowercase`` (default false: case-sensitive, as torchtext): fold case first.

Per sample, each pair is scored alone (sentence BLEU without smoothing, so
mostly 0 for max_n > 1); these do not average to the corpus score, which
pools counts before dividing.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.metrics._common import check_lengths
from mmcomp_eval.metrics.registry import METRICS, NO_RESOURCES, MetricResources

#: tokenize/lowercase values under which the score is torchtext's bleu_score on str.split() tokens
TORCHTEXT_SETTING = {"tokenize": "none", "lowercase": False}


@METRICS.register("bleu")
class Bleu(Metric):
    """Corpus BLEU (unigram by default, as in CompAct) by sacrebleu; per sample, each pair alone."""

    name = "bleu"
    decomposable = False

    def __init__(self, resources: MetricResources = NO_RESOURCES, *, max_n: int = 1, tokenize: str = "none",
                 lowercase: bool = False):
        from sacrebleu.metrics import BLEU

        if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
            raise UserError(f"metric 'bleu': max_n must be a positive integer, got {max_n!r}")
        tokenizers = list(BLEU.TOKENIZERS)
        if not isinstance(tokenize, str) or tokenize not in tokenizers:
            raise UserError(f"metric 'bleu': tokenize must be one of {', '.join(tokenizers)}, got {tokenize!r}"
                            f"{did_you_mean(str(tokenize), tokenizers)}")
        if not isinstance(lowercase, bool):
            raise UserError(f"metric 'bleu': lowercase must be true or false, got {lowercase!r}")
        self.max_n, self.tokenize, self.lowercase = max_n, tokenize, lowercase
        try:
            # force: CompAct's text legitimately ends in " ." (the context separator); no tokenisation warning
            self._bleu = BLEU(max_ngram_order=max_n, tokenize=tokenize, lowercase=lowercase, smooth_method="none",
                              effective_order=False, force=True)
        except (ImportError, RuntimeError) as e:  # mecab/sentencepiece tokenizers need extra packages
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"metric 'bleu': tokenizer {tokenize!r} cannot be loaded: {first}") from None

    def compute(self, predictions: Sequence[str], references: Sequence[str],
                docs: Sequence[Document] = ()) -> MetricResult:
        stats = self.corpus_stats(predictions, references, docs)
        per_pair = tuple(self.from_stats(row) for row in stats)
        corpus = self.from_stats([sum(col) for col in zip(*stats)]) if stats else 0.0
        return MetricResult(self.name, corpus, per_pair)

    def corpus_stats(self, predictions: Sequence[str], references: Sequence[str],
                     docs: Sequence[Document] = ()) -> list[tuple[float, ...]]:
        """Per pair: clipped matches and candidate n-grams per order, candidate and reference length."""
        check_lengths(self.name, predictions, references)
        rows = []
        for cand, ref in zip(predictions, references):
            s = self._bleu.corpus_score([str(cand)], [[str(ref)]])
            rows.append((*s.counts, *s.totals, s.sys_len, s.ref_len))
        return rows

    def from_stats(self, totals: Sequence[float]) -> float:
        from sacrebleu.metrics import BLEU

        n = self.max_n
        return BLEU.compute_bleu(
            correct=[int(c) for c in totals[:n]], total=[int(t) for t in totals[n:2 * n]],
            sys_len=int(totals[2 * n]), ref_len=int(totals[2 * n + 1]),
            smooth_method="none", effective_order=False, max_ngram_order=n,
        ).score

    def describe(self) -> dict:
        torchtext = {"tokenize": self.tokenize, "lowercase": self.lowercase} == TORCHTEXT_SETTING
        return {
            "name": self.name,
            "max_n": self.max_n,
            "weights": "uniform",
            "tokenize": self.tokenize,
            "lowercase": self.lowercase,
            "smooth_method": "none",
            "implementation": f"sacrebleu=={importlib.metadata.version('sacrebleu')} BLEU",
            "equals": (f"torchtext.data.metrics.bleu_score(max_n={self.max_n}, uniform weights) on str.split() "
                       "tokens" if torchtext else "sacrebleu BLEU only (not torchtext: tokenised or lower-cased)"),
        }
