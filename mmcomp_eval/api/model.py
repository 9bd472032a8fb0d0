"""The interface every model adapter implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.request import GenerationRequest, LoglikelihoodRequest

if TYPE_CHECKING:
    from mmcomp_eval.config.task_config import TaskConfig

ProgressCallback = Callable[[int], None]  # called with the number of requests just finished
#: ``on_result(i, answer)``: request ``i`` is finished. Optional: an adapter
#: whose ``generate``/``loglikelihood`` accept an ``on_result`` keyword lets
#: the response store commit each answer the moment it exists (see
#: ``mmcomp_eval.runtime.caching_model``); adapters without it still work, batch by batch.
ResultCallback = Callable[[int, Any], None]


class Model(ABC):
    """A model answers batches of requests.

    Adapters receive their arguments already parsed (see
    ``mmcomp_eval.config.model_args``) as keyword arguments of ``__init__``.
    ``fingerprint`` identifies everything that can change an answer; it goes
    into results files and cache keys.
    """

    name: str = "model"
    #: whether the adapter can use images in requests
    accepts_images: bool = False
    #: whether the adapter answers from the document instead of a prompt (baselines, ``gold``): no
    #: prompt is rendered and no media is loaded for it, and it answers every seed the same
    uses_documents: bool = False

    @abstractmethod
    def generate(
        self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None
    ) -> list[str]:
        """One continuation per request, in request order, stop strings removed."""

    def loglikelihood(
        self, requests: Sequence[LoglikelihoodRequest], progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Summed log-probability of each continuation given the context."""
        raise NotImplementedError(f"model '{self.name}' cannot score log-likelihoods")

    def predict_from_documents(self, docs: Sequence[Document], task: TaskConfig) -> list[str]:
        """One answer per document, for adapters that read documents (``uses_documents``).

        The whole task config is passed because what to answer depends on it:
        MRH reads ``answer_kind``, ``gold`` the ``target_field``.
        """
        raise NotImplementedError(f"model '{self.name}' does not read documents")

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name}
