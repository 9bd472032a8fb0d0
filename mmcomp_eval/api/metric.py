"""The interface every metric implements.

Metrics work on whole lists rather than one pair at a time because the two
that matter most are not averages of per-sample scores: BLEU is a corpus
statistic and BERTScore batches through a neural model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from mmcomp_eval.api.document import Document


@dataclass(frozen=True)
class MetricResult:
    """Scores are on a 0-100 scale, as the papers report them."""

    name: str
    value: float  # the corpus-level score
    #: one score per prediction, same scale; NaN for a document the metric does not score (a retrieval
    #: metric of one direction does not score the other direction's queries)
    per_sample: tuple[float, ...]


class Metric(ABC):
    name: str = "metric"
    higher_is_better: bool = True
    #: the corpus value is the mean of the per-sample scores, so bootstrap
    #: resamples per-sample scores; corpus statistics (BLEU) set False and are
    #: recomputed on every resample (fast through ``corpus_stats``/``from_stats``)
    decomposable: bool = True
    #: how the corpus value follows from the per-sample scores when ``decomposable``: their ``mean``, or
    #: their ``median`` (median rank)
    aggregation: str = "mean"
    #: the output types whose predictions this metric reads; None: any whose predictions are answer text
    output_types: tuple[str, ...] | None = None
    #: names of run-level resources this metric reads (``MetricResources.get``), registered in
    #: ``mmcomp_eval.metrics.registry.METRIC_RESOURCES``: each is built once per run, before the model
    #: under evaluation loads, and only when a metric of the run declares it
    resources: tuple[str, ...] = ()

    def corpus_stats(self, predictions: Sequence[str], references: Sequence[str],
                     docs: Sequence[Document]) -> list[tuple[float, ...]] | None:
        """Per-sample sufficient statistics that add up over a corpus, or None.

        A non-decomposable metric that provides them (with :meth:`from_stats`)
        is bootstrapped by summing rows instead of calling :meth:`compute`
        a thousand times.
        """
        return None

    def from_stats(self, totals: Sequence[float]) -> float:
        """The corpus value (0-100) from summed :meth:`corpus_stats` rows."""
        raise NotImplementedError

    @abstractmethod
    def compute(
        self,
        predictions: Sequence[str],
        references: Sequence[str],
        docs: Sequence[Document],
    ) -> MetricResult: ...

    def describe(self) -> dict:
        """What the results file records about how this metric was computed."""
        return {"name": self.name}
