"""The interface every model adapter implements."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.request import EmbeddingRequest, GenerationRequest, LoglikelihoodRequest

if TYPE_CHECKING:
    import numpy as np

    from mmcomp_eval.config.task_config import TaskConfig

ProgressCallback = Callable[[int], None]  # called with the number of requests just finished
#: ``on_result(i, answer)``: request ``i`` is finished. Optional: an adapter
#: whose ``generate``/``loglikelihood`` accept an ``on_result`` keyword lets
#: the response store commit each answer the moment it exists (see
#: ``mmcomp_eval.runtime.caching_model``); adapters without it still work, batch by batch.
ResultCallback = Callable[[int, Any], None]


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model can be asked, declared by the adapter instead of probed.

    The evaluator and the response store read this record before sending
    anything, so a task a model cannot run fails with one line before any
    inference, and wrappers (the caching model) pass it on unchanged instead of
    forwarding unknown attributes.
    """

    #: answers :class:`GenerationRequest` (``generate``)
    generate: bool = True
    #: answers :class:`LoglikelihoodRequest` (``loglikelihood``), needed by ``rank_choices`` tasks
    loglikelihood: bool = False
    #: accepts prompts with image placeholders (vision-language models)
    images: bool = False
    #: looks at the pixels of those images; False for a VLM run text-only (``images=false``), whose
    #: prompts keep the task's layout but need no keyframes
    reads_images: bool = False
    #: most images one request may carry (None: no limit known)
    max_images: int | None = None
    #: answers from the document instead of a rendered prompt (baselines, ``gold``): no prompt is
    #: rendered and no media loaded for it, and it answers every seed the same
    reads_documents: bool = False
    #: answers :class:`EmbeddingRequest` (``embed``): captions and videos into one space, needed by
    #: ``retrieval`` tasks
    embeddings: bool = False
    #: ``generate``/``loglikelihood``/``embed`` take ``on_result`` and report each answer as it is finished, so
    #: the response store can commit it at once; without it answers are stored batch by batch
    reports_each_result: bool = False


@dataclass(frozen=True)
class ModelDefaults:
    """How a model's original code asks it, applied by a run wherever the task and the command line are silent.

    Declared by the adapter like :class:`ModelCapabilities` and read before
    the model loads. A run records what it applied, per task, in
    ``results.json`` (``tasks.<name>.model_defaults``).
    """

    #: ``GenerationSettings`` fields and the values the original evaluation code decodes with
    #: (OpenFlamingo: beams); each is used only where neither the task file nor ``--gen-kwargs`` sets
    #: the field and only if it fits what they chose (no beam width under sampling)
    generation: Mapping[str, Any] = field(default_factory=dict)
    #: the prompt format the model was trained with: a task whose ``prompt.variants`` has this key
    #: renders that template for this model instead of its own
    prompt_variant: str | None = None


#: ``pretrained`` of a model handed over already loaded without a name: nothing identifies its weights, so
#: its answers are not stored (a later run with other weights would get them back)
IN_MEMORY = "<in memory>"


class Model:
    """A model answers batches of requests.

    Adapters receive their arguments already parsed (see
    ``mmcomp_eval.config.model_args``) as keyword arguments of ``__init__``.
    ``fingerprint`` identifies everything that can change an answer; it goes
    into results files and cache keys.
    """

    name: str = "model"
    #: what this adapter can be asked; adapters whose abilities depend on their arguments
    #: (``images=false``) set it per instance and override :meth:`capabilities_for`
    capabilities: ModelCapabilities = ModelCapabilities()
    #: decoding and prompt format of the model's original code (none by default)
    defaults: ModelDefaults = ModelDefaults()

    @classmethod
    def capabilities_for(cls, args: Mapping[str, Any]) -> ModelCapabilities:
        """The capabilities an instance built with keyword arguments ``args`` will have, without building it.

        A run reads this before the model loads, so that a task the model
        cannot run (images for a text-only model, more images than it
        takes, choices to rank without log-likelihoods) costs no load. The
        default is the class attribute; an adapter whose capabilities depend
        on its arguments overrides this, and a run refuses an instance whose
        ``capabilities`` turn out different from what this promised.
        """
        return cls.capabilities

    @classmethod
    def defaults_for(cls, args: Mapping[str, Any]) -> ModelDefaults:
        """The decoding and prompt defaults an instance built with ``args`` will have, without building it.

        The class attribute unless an adapter's arguments choose the original
        code it follows (OpenFlamingo or Otter weights through one adapter).
        """
        return cls.defaults

    def generate(
        self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None
    ) -> list[str]:
        """One continuation per request, in request order, stop strings removed.

        Not abstract: a model implements what its ``capabilities`` promise
        (a retrieval model only embeds), and a run never asks for more.
        """
        raise NotImplementedError(f"model '{self.name}' does not generate text")

    def loglikelihood(
        self, requests: Sequence[LoglikelihoodRequest], progress: ProgressCallback | None = None
    ) -> list[list[float]]:
        """Summed log-probability of each continuation given the context."""
        raise NotImplementedError(f"model '{self.name}' cannot score log-likelihoods")

    def embed(self, requests: Sequence[EmbeddingRequest], progress: ProgressCallback | None = None) -> list[np.ndarray]:
        """One float32 vector per request, in request order, captions and videos in one joint space."""
        raise NotImplementedError(f"model '{self.name}' does not embed captions or videos")

    def score_vectors(self, captions: np.ndarray, videos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectors whose dot product is the caption-video score a retrieval task ranks by.

        ``captions`` and ``videos`` are the stacked :meth:`embed` answers of a
        task's captions and of its whole gallery. The embeddings themselves
        here; a model whose scores depend on the gallery (``fusion``
        normalises each modality over it) maps them once more.
        """
        return captions, videos

    def similarity(self) -> str:
        """How a caption-video score is computed, in words (results.json records it)."""
        return "dot product of the caption and video embeddings"

    def predict_from_documents(self, docs: Sequence[Document], task: TaskConfig) -> list[str]:
        """One answer per document, for adapters that read documents (``capabilities.reads_documents``).

        The whole task config is passed because what to answer depends on it:
        MRH reads ``answer_kind``, ``gold`` the ``target_field``.
        """
        raise NotImplementedError(f"model '{self.name}' does not read documents")

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name}

    def cache_report(self) -> dict[str, Any]:
        """What results.json records under ``cache``: no response store unless a wrapper provides one."""
        return {"enabled": False}
