"""Metrics: BLEU, exact match, category accuracy, BERTScore, and the retrieval metrics (R@k, MdR, MnR, SumR).

Importing this package registers every metric in :data:`METRICS`; tasks ask
for them by name through :func:`build_metric`, which is where option names
from a task file are checked, so a typo fails at load time with a
suggestion rather than being silently ignored.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from mmcomp_eval.api.metric import Metric
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.metrics import bertscore, bleu, category_accuracy, exact_match, retrieval  # noqa: F401  (register)
from mmcomp_eval.metrics.registry import METRIC_RESOURCES, METRICS, MetricResource, MetricResources
from mmcomp_eval.plugins import register_metrics

register_metrics(METRICS)  # entry points "mmcomp_eval.metrics" of installed packages

__all__ = ["METRICS", "METRIC_RESOURCES", "MetricResource", "MetricResources", "build_metric", "metric_options"]


def metric_options(name: str) -> list[str]:
    """The option names a metric accepts: its keyword-only constructor parameters."""
    cls = METRICS.get(name)
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def build_metric(name: str, options: Mapping[str, Any] | None, resources: MetricResources) -> Metric:
    """The metric ``name`` with its task-file options; the resources it declares are built first."""
    canonical = METRICS.canonical(name)
    options = dict(options or {})
    known = metric_options(canonical)
    for key in options:
        if key not in known:
            listing = ", ".join(known) if known else "none"
            raise UserError(
                f"metric '{canonical}' has no option '{key}'{did_you_mean(str(key), known)}; "
                f"its options: {listing}"
            )
    cls = METRICS.get(canonical)
    resources.for_metric(cls)
    return cls(resources, **options)
