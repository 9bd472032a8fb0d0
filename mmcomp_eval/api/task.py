"""The contract of a task's output type: what it asks a model and how it reads the answers.

A task file names its ``output_type`` (``generate``, ``rank_choices``, ``retrieval``);
each is an :class:`OutputType` subclass registered by that name in
``mmcomp_eval.tasks.outputs.OUTPUT_TYPES`` (plugins add their own through the
``mmcomp_eval.output_types`` entry point). The evaluator only ever talks to
this interface, so a new kind of task is a new subclass, not a new branch in
the evaluator: the subclass checks its task-file settings, says which model
capabilities it needs, loads what it answers over (a list of choices), builds
one :class:`ModelCall` per seed and turns the model's answers into the
predictions metrics score.

Most types ask about a rendered prompt (a template and few-shot examples,
``prompted = True``). A type that asks about the documents themselves
(``retrieval`` embeds captions and videos) sets ``prompted = False``: it
loads its own documents (:meth:`OutputType.documents`) and says, per seed,
what text each document stands for (:meth:`OutputType.inputs`), and no
template or shot is involved.

An output type is built per task when the task is prepared, before any
model loads, so whatever it reads (class tables, a gallery) fails early.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from mmcomp_eval.api.document import Document
    from mmcomp_eval.api.model import Model, ModelCapabilities
    from mmcomp_eval.config.task_config import TaskConfig
    from mmcomp_eval.evaluation.prepare import PreparedTask
    from mmcomp_eval.tasks.loaders import DataContext
    from mmcomp_eval.tasks.prompting import RenderedPrompt

#: the model methods a :class:`ModelCall` may name; also the response store's request kinds
MODEL_METHODS = ("generate", "loglikelihood", "embed")


@dataclass(frozen=True)
class ModelCall:
    """The requests one seed of one task sends to one model method.

    ``extra`` holds per-request sequences passed as keyword arguments
    (``images``: request ``i``'s images), sliced like the requests when a
    data-parallel process answers a share of them.
    """

    method: str
    requests: list
    extra: dict[str, Sequence] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in MODEL_METHODS:
            raise ValueError(f"ModelCall.method {self.method!r} is not one of {', '.join(MODEL_METHODS)}")


class OutputType(ABC):
    """One kind of task answer; subclasses are registered by ``name``."""

    name: ClassVar[str] = "output"
    #: requests are built from rendered prompts (a template, few-shot examples); False: from the documents
    #: themselves, through :meth:`documents` and :meth:`inputs`
    prompted: ClassVar[bool] = True

    @classmethod
    def check_config(cls, task: TaskConfig, where: str) -> None:
        """Refuse task-file settings this type cannot use; called when the task file is read.

        ``where`` names the file and task for the one-line error.
        """

    @classmethod
    @abstractmethod
    def model_problem(cls, capabilities: ModelCapabilities) -> str | None:
        """Why a model with ``capabilities`` cannot answer this type's requests (None: it can).

        Checked against the capabilities the adapter declares before it is
        built (``Model.capabilities_for``), so the mismatch costs no load.
        """

    def __init__(self, task: TaskConfig, data: DataContext):
        """Load what the answers are chosen from; ``task`` has ``--gen-kwargs`` applied."""
        self.task = task

    @abstractmethod
    def requests(self, prepared: PreparedTask, seed: int) -> ModelCall:
        """The requests of one seed, one per document of ``prepared``, in document order."""

    def parse(self, answers: Sequence[Any]) -> list[str]:
        """The predictions metrics score, one per answer of the model's ``method`` (used by :meth:`read`)."""
        raise NotImplementedError(f"output type {self.name} reads answers in read()")

    def read(self, answers: Sequence[Any], model: Model) -> tuple[list, list[str]]:
        """(what samples.jsonl shows as each document's raw output, the predictions metrics score), per document.

        One answer per document by default, parsed by :meth:`parse`. A type
        whose requests are not one per document (retrieval asks for every
        caption and every gallery video) overrides this; ``model`` is the
        model that answered, for what only it knows (how its embeddings
        become scores).
        """
        return list(answers), self.parse(answers)

    def documents(self, split: str, limit: int | float | None) -> list[Document]:
        """The documents of ``split`` this task is scored on (``prompted = False`` only); ``limit``: ``--limit``."""
        raise NotImplementedError(f"output type {self.name} renders prompts; its documents come from the task loader")

    def inputs(self, docs: list[Document], seed: int) -> list[RenderedPrompt]:
        """What each document stands for in the requests of ``seed`` (``prompted = False`` only).

        Recorded like rendered prompts (``prompts_sha256``, the samples'
        ``prompt``), so that ``compare`` refuses runs that asked different things.
        """
        raise NotImplementedError(f"output type {self.name} renders prompts")

    def record(self, prepared: PreparedTask) -> dict[str, Any]:
        """What ``results.json`` records about how answers were obtained (keys of the task record)."""
        return {}


def limited(count: int, limit: int | float | None) -> int:
    """How many of ``count`` documents ``--limit`` keeps: N, or ceil(count * fraction) below 1 (as lm-eval)."""
    if limit is None:
        return count
    return min(count, math.ceil(count * limit) if limit < 1 else int(limit))
