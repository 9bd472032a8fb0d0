"""Where metrics register, and what they may borrow from the run.

Metrics are registered as classes, not instances, because most take options
from the task file (``max_n``, ``atom``, ``model``) and one (BERTScore) must
not load anything until it is actually used.

Some metrics need something bigger than their options (category accuracy:
the EK-100 category map, learned from the annotations). A metric names such
resources in its ``resources`` class attribute; each name is registered in
:data:`METRIC_RESOURCES` with a function that builds it from the run's data
settings. :class:`MetricResources` builds each one at most once per run and
only when a metric declares it, so the evaluator never needs to know which
metric needs what.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.metric import Metric
from mmcomp_eval.errors import UserError
from mmcomp_eval.registry import Registry

if TYPE_CHECKING:
    from mmcomp_eval.tasks.loaders import DataContext

METRICS = Registry[type[Metric]]("metric")


@dataclass(frozen=True)
class MetricResource:
    #: builds the resource from the run's data settings (``--ek100-dir``, ``--offline``)
    build: Callable[[DataContext], Any]
    #: what it is made from, for the error when a metric is built without a run to build it
    made_from: str


METRIC_RESOURCES = Registry[MetricResource]("metric resource")


class MetricResources:
    """The resources of one run, built on first request and shared by every metric of the run.

    ``data``: the run's data settings; without them only ``prebuilt``
    resources exist (a metric built outside a run, in a test or a script,
    is given what it needs). ``offline``: whether the run may touch the
    network (BERTScore's model lookup).
    """

    def __init__(self, data: DataContext | None = None, *, offline: bool | None = None,
                 prebuilt: Mapping[str, Any] | None = None):
        self.data = data
        self.offline = bool(data.offline if offline is None and data is not None else offline)
        self._built: dict[str, Any] = dict(prebuilt or {})

    def get(self, name: str) -> Any:
        """The resource ``name``, built now if this run has not built it yet."""
        if name not in self._built:
            resource = METRIC_RESOURCES.get(name)
            if self.data is None:
                raise UserError(f"{name} is built from {resource.made_from}, and these resources have no "
                                f"data settings; pass MetricResources(DataContext(...)) or prebuilt={{'{name}': ...}}")
            self._built[name] = resource.build(self.data)
        return self._built[name]

    def for_metric(self, metric: type[Metric]) -> dict[str, Any]:
        """Every resource ``metric`` declares, built (a missing one fails here, naming the metric)."""
        out = {}
        for name in metric.resources:
            try:
                out[name] = self.get(name)
            except UserError as exc:
                raise UserError(f"metric '{metric.name}' needs {name}: {exc}") from None
        return out


NO_RESOURCES = MetricResources()
