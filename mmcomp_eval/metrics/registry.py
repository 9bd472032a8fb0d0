"""Where metrics register, and what they may borrow from the run.

Metrics are registered as classes, not instances, because most take options
from the task file (``max_n``, ``atom``, ``model``) and one (BERTScore) must
not load anything until it is actually used.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmcomp_eval.api.metric import Metric
from mmcomp_eval.data.category_map import CategoryMap
from mmcomp_eval.registry import Registry

METRICS = Registry[type[Metric]]("metric")


@dataclass(frozen=True)
class MetricResources:
    """Things a metric cannot build from its own options.

    The EK-100 category map (annotations + class tables) is loaded once per
    run, not once per metric, and whether the run may touch the network is a
    property of the run.
    """

    category_map: CategoryMap | None = None
    offline: bool = False


NO_RESOURCES = MetricResources()
