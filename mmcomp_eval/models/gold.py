"""The ``gold`` model: answers every document with its own reference answer.

A sanity check of a task's metrics, not a baseline: given the reference
itself, every metric must reach its maximum (EM, BLEU, category accuracy and
BERTScore 100), so a task whose gold run scores less has a metric or data
problem, never a model problem. No network, no weights.

It answers from the document (``capabilities.reads_documents``), so no prompt is rendered
and no keyframe is read: image tasks such as ``compact_nup_idefics`` run
without any frames, on all of their documents. The answer is
``str(document[target_field])``, exactly the string the metrics receive as
the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.model import Model, ModelCapabilities, ProgressCallback
from mmcomp_eval.api.request import GenerationRequest
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.config.task_config import TaskConfig


class GoldAnswers(Model):
    """Answers each document with its own reference: a metric sanity check (every score 100), no weights."""
    name = "gold"
    capabilities = ModelCapabilities(generate=False, reads_documents=True)

    def generate(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None) -> list[str]:
        raise UserError("model 'gold' answers from documents, not prompts; run it through a task")

    def predict_from_documents(self, docs: Sequence[Document], task: TaskConfig) -> list[str]:
        return [str(d[task.target_field]) for d in docs]


MODELS.add("gold", GoldAnswers)
