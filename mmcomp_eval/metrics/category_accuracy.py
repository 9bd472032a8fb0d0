"""Category accuracy (CA): right when the prediction names the target's EK-100 class.

CompAct counts "slice paneer" as right for "dice parmesan" because EK-100
folds slice/dice into the verb class *cut* and paneer/parmesan into the noun
class *cheese*. The targets' classes are read from the document
(``trg_verb_class``, ``trg_noun_class``), not re-derived from the reference
text, so a reference spelling the index cannot parse never turns into a
silent miss.

How a prediction is mapped:

* ``atom: action`` -- the prediction is parsed as a narration; right only if
  both its verb class and its noun class are the target's.
* ``atom: verb`` / ``noun`` -- the whole prediction is looked up as one
  spelling first ("pick up", "chopping board"); if it is not one, it is parsed
  as a narration and its verb (noun) is used, so "pick up the knife" still
  answers a verb question with *take*.

A prediction in which the needed atom cannot be recognised is wrong. How
many there were is not a score, so it does not go into :class:`MetricResult`;
the metric keeps the ids of those documents from its latest ``compute`` in
``last_unparsed`` and ``describe()`` reports their number, so the results
file can tell "the model named the wrong class" from "the model's output was
not a verb/noun at all".
"""

from __future__ import annotations

from collections.abc import Sequence

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.data.vocab import CategoryIndex
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.metrics._common import check_lengths, mean
from mmcomp_eval.metrics.registry import METRICS, NO_RESOURCES, MetricResources

ATOMS = ("action", "verb", "noun")
TARGET_FIELDS = {"verb": ("trg_verb_class",), "noun": ("trg_noun_class",),
                 "action": ("trg_verb_class", "trg_noun_class")}


@METRICS.register("category_accuracy", aliases=("ca",))
class CategoryAccuracy(Metric):
    """EK-100 class match of the predicted verb/noun (or both) with the target's."""

    name = "category_accuracy"

    def __init__(self, resources: MetricResources = NO_RESOURCES, *, atom: str = "action"):
        if atom not in ATOMS:
            raise UserError(
                f"metric 'category_accuracy': atom must be one of {', '.join(ATOMS)}, "
                f"got {atom!r}{did_you_mean(str(atom), ATOMS)}"
            )
        if resources.category_index is None:
            raise UserError(
                "metric 'category_accuracy' needs the EK-100 class tables "
                "(EPIC_100_verb_classes.csv, EPIC_100_noun_classes.csv); pass --ek100-dir"
            )
        self.atom = atom
        self.index: CategoryIndex = resources.category_index
        self.last_unparsed: tuple[str, ...] | None = None
        self._last_count = 0

    def compute(self, predictions: Sequence[str], references: Sequence[str],
                docs: Sequence[Document]) -> MetricResult:
        check_lengths(self.name, predictions, references)
        check_lengths(self.name, predictions, docs)
        per_sample = []
        unparsed = []
        for prediction, doc in zip(predictions, docs):
            predicted = self._classes(prediction)
            if None in predicted:
                unparsed.append(doc.id)
            per_sample.append(100.0 if predicted == _targets(doc, self.atom) else 0.0)
        self.last_unparsed = tuple(unparsed)
        self._last_count = len(per_sample)
        return MetricResult(self.name, mean(per_sample), tuple(per_sample))

    def _classes(self, prediction: str) -> tuple[int | None, ...]:
        if self.atom == "action":
            return self.index.parse_narration(prediction)
        if self.atom == "verb":
            whole = self.index.verb_class(prediction)
            return (whole if whole is not None else self.index.parse_narration(prediction)[0],)
        whole = self.index.noun_class(prediction)
        return (whole if whole is not None else self.index.parse_narration(prediction)[1],)

    def describe(self) -> dict:
        info = {"name": self.name, "atom": self.atom, "classes": "EK-100"}
        if self.last_unparsed is not None:
            info["scored"] = self._last_count
            info["unparsed"] = len(self.last_unparsed)
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
