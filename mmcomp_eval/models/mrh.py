"""The Most Recent Heuristic baseline (CompAct Table 2).

MRH predicts that the next action reuses the most recent verb and the most
recent noun of the context. It reads the document rather than a prompt, and
runs through the same evaluator and metrics as the language models so that
its numbers are comparable by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.model import Model, ModelCapabilities, ProgressCallback
from mmcomp_eval.api.request import GenerationRequest
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.config.task_config import TaskConfig

ANSWER_KINDS = ("verb", "noun", "narration")


def mrh_prediction(fields, answer_kind: str) -> str:
    """The last context clip's verb / noun (normalised), or both for a narration."""
    verb, noun = fields["verbs"][-2], fields["nouns"][-2]
    answers = {"verb": verb, "noun": noun, "narration": f"{verb} {noun}"}
    if answer_kind not in answers:
        raise UserError(f"model 'mrh': answer kind {answer_kind!r} is not one of {', '.join(ANSWER_KINDS)}")
    return answers[answer_kind]


class MostRecentHeuristic(Model):
    """The Most Recent Heuristic baseline (CompAct Table 2): the most recent verb and noun of the context."""
    name = "mrh"
    capabilities = ModelCapabilities(generate=False, reads_documents=True)

    def generate(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None) -> list[str]:
        raise UserError("model 'mrh' reads CompAct documents, not prompts; use it with a compact_* task")

    def predict_from_documents(self, docs: Sequence[Document], task: TaskConfig) -> list[str]:
        for d in docs:
            if not all(isinstance(d.fields.get(k), list) and len(d.fields[k]) >= 2 for k in ("verbs", "nouns")):
                raise UserError(f"model 'mrh': document {d.id} has no 'verbs'/'nouns' lists of context + target; "
                                "MRH needs CompAct documents")
        return [mrh_prediction(d.fields, task.answer_kind) for d in docs]


def mrh_atom_scores(rows: Sequence[dict]) -> dict[str, float]:
    """EM and CA (x100) of MRH on verb and noun classification.

    CA needs no parsing here: the prediction *is* a context clip, whose
    class the annotation gives.
    """
    n = max(len(rows), 1)
    out = {}
    for atom, cls_field, trg in (("verb", "verb_classes", "trg_verb"), ("noun", "noun_classes", "trg_noun")):
        em = sum(mrh_prediction(r, atom) == r[trg] for r in rows)
        ca = sum(r[cls_field][-2] == r[f"{trg}_class"] for r in rows)
        out[f"{atom}_em"] = round(100 * em / n, 2)
        out[f"{atom}_ca"] = round(100 * ca / n, 2)
    return out


MODELS.add("mrh", MostRecentHeuristic)
