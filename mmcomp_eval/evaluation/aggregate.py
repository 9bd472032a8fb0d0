"""Aggregating a metric over repeated runs (seeds).

The CompAct paper reports mean +- std over runs. We report the sample
standard deviation (ddof=1), which is 0 for a single run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class AggregatedMetric:
    name: str
    mean: float
    std: float
    per_seed: tuple[float, ...]

    def as_dict(self) -> dict:
        return {"mean": round(self.mean, 4), "std": round(self.std, 4), "per_seed": [round(v, 4) for v in self.per_seed]}


def aggregate(name: str, values: list[float]) -> AggregatedMetric:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return AggregatedMetric(name, statistics.fmean(values), std, tuple(values))
