"""Category accuracy (CA): right when the prediction names the target's EK-100 class.

CompAct counts "slice paneer" as right for "dice parmesan" because EK-100
folds slice/dice into the verb class *cut* and paneer/parmesan into the noun
class *cheese*. The targets' classes are read from the document
(``trg_verb_class``, ``trg_noun_class``), not re-derived from the reference
text, so a reference the map cannot read never turns into a silent miss.

The prediction's classes come from :class:`~mmcomp_eval.data.category_map.CategoryMap`,
learned from the EK-100 annotations (annotated narration -> its majority
classes, then verb/noun phrases, then the class tables, then spaCy lemmas;
see that module). Which tier decided how many predictions goes into
``describe()``.

* ``atom: action`` -- right only if both the verb class and the noun class
  are the target's.
* ``atom: verb`` / ``noun`` -- the whole prediction is looked up as one
  phrase first ("pick up", "chopping board"); if it is not one, it is read as
  a narration, so "pick up the knife" still answers a verb question with *take*.

A prediction equal to the reference after exact-match normalisation is
always right (the *identity rule*): the map gives a handful of annotated
texts a class other than the one this document has (a text annotated with
two pairs), and CA must never be below exact match on a sample. How many
samples only the identity rule made right is reported, so it is never hidden.

A prediction whose needed atom cannot be mapped is wrong (unless the identity
rule applies). How many there were is not a score, so it is not in
:class:`MetricResult`; the ids of those documents from the latest
``compute`` are kept in ``last_unmapped`` and their number is in
``describe()``, so the results file can tell "the model named the wrong
class" from "the model's output names no verb/noun the map knows".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.data.category_map import CategoryMap
from mmcomp_eval.data.category_rules import ATOMS, TARGET_FIELDS
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.metrics._common import check_lengths, mean
from mmcomp_eval.metrics.registry import METRIC_RESOURCES, METRICS, NO_RESOURCES, MetricResource, MetricResources

#: the resource this metric reads: the category map of the run's EK-100 annotations
CATEGORY_MAP = "ek100_category_map"


def _load_category_map(data) -> CategoryMap:
    from mmcomp_eval.data import ek100

    return CategoryMap.load(ek100.locate(data.ek100_dir, offline=data.offline))


METRIC_RESOURCES.add(CATEGORY_MAP, MetricResource(
    _load_category_map, "the EK-100 annotations and class tables (EPIC_100_train.csv, EPIC_100_validation.csv, "
                        "EPIC_100_verb_classes.csv, EPIC_100_noun_classes.csv; --ek100-dir)"))


@METRICS.register("category_accuracy", aliases=("ca",))
class CategoryAccuracy(Metric):
    """EK-100 class match of the predicted verb/noun (or both) with the target's."""

    name = "category_accuracy"
    resources = (CATEGORY_MAP,)

    def __init__(self, resources: MetricResources = NO_RESOURCES, *, atom: str = "action"):
        if atom not in ATOMS:
            raise UserError(
                f"metric 'category_accuracy': atom must be one of {', '.join(ATOMS)}, "
                f"got {atom!r}{did_you_mean(str(atom), ATOMS)}"
            )
        self.atom = atom
        self.categories: CategoryMap = resources.get(CATEGORY_MAP)
        self.last_unmapped: tuple[str, ...] | None = None
        self._last: dict | None = None

    def compute(self, predictions: Sequence[str], references: Sequence[str],
                docs: Sequence[Document]) -> MetricResult:
        check_lengths(self.name, predictions, references)
        check_lengths(self.name, predictions, docs)
        per_sample = []
        unmapped = []
        decided_by: Counter = Counter()
        identity_only = 0
        for prediction, reference, doc in zip(predictions, references, docs):
            verdict = self.categories.rules.judge(self.atom, str(prediction), str(reference), _targets(doc, self.atom))
            if verdict.unmapped:
                unmapped.append(doc.id)
            decided_by[verdict.mapped.source or "unmapped"] += 1
            identity_only += verdict.by_identity
            per_sample.append(100.0 if verdict.right else 0.0)
        self.last_unmapped = tuple(unmapped)
        self._last = {"scored": len(per_sample), "unmapped": len(unmapped),
                      "right_by_identity_only": identity_only, "decided_by": dict(sorted(decided_by.items()))}
        return MetricResult(self.name, mean(per_sample), tuple(per_sample))

    def describe(self) -> dict:
        info = {"name": self.name, "atom": self.atom, "classes": "EK-100",
                "identity_rule": "a prediction equal to the reference after exact-match normalisation is right",
                "mapping": self.categories.describe()}
        if self._last is not None:
            info.update(self._last)
        return info


def _targets(doc: Document, atom: str) -> tuple[int, ...]:
    classes = []
    for field in TARGET_FIELDS[atom]:
        value = doc.get(field)
        try:
            if isinstance(value, bool) or value is None:
                raise ValueError
            classes.append(int(value))
        except (TypeError, ValueError):
            raise UserError(
                f"document {doc.id}: category_accuracy needs an integer EK-100 class id in "
                f"field '{field}', got {value!r}"
            ) from None
    return tuple(classes)
