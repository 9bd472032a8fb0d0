"""``output_type: rank_choices``: every candidate answer is scored as a continuation; the likeliest wins.

The candidates come from the choice source the task names (``choices:``),
registered in :data:`mmcomp_eval.data.choice_sources.CHOICE_SOURCES`, and
are loaded when the task is prepared, before the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmcomp_eval.api.model import ModelCapabilities
from mmcomp_eval.api.request import LoglikelihoodRequest
from mmcomp_eval.api.task import ModelCall, OutputType
from mmcomp_eval.data.choice_sources import CHOICE_SOURCES
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.tasks.outputs.registry import OUTPUT_TYPES


@OUTPUT_TYPES.register("rank_choices")
class RankChoices(OutputType):
    """The choice with the highest summed log-likelihood after the prompt (a space before each choice)."""

    name = "rank_choices"

    @classmethod
    def check_config(cls, task, where: str) -> None:
        known = CHOICE_SOURCES.names()
        if task.choices is None:
            raise UserError(f"{where}: output_type 'rank_choices' needs 'choices' ({', '.join(known)})")
        if task.choices not in CHOICE_SOURCES:
            raise UserError(f"{where}: choices {task.choices!r} is not one of {', '.join(known)}"
                            f"{did_you_mean(task.choices, known)}")

    @classmethod
    def model_problem(cls, capabilities: ModelCapabilities) -> str | None:
        return None if capabilities.loglikelihood else "cannot score log-likelihoods"

    def __init__(self, task, data):
        super().__init__(task, data)
        self.choices: tuple[str, ...] = tuple(CHOICE_SOURCES.get(task.choices)(task, data))
        if not self.choices:
            raise UserError(f"task {task.task}: choices {task.choices!r} gave no candidate answers")

    def requests(self, prepared, seed: int) -> ModelCall:
        continuations = tuple(" " + c for c in self.choices)
        return ModelCall("loglikelihood", [LoglikelihoodRequest(d.id, p.text, continuations, p.messages)
                                           for d, p in zip(prepared.docs, prepared.prompts[seed])])

    def parse(self, answers: Sequence[Any]) -> list[str]:
        """The highest-scoring choice per answer; the earliest wins a tie, so results are stable."""
        out = []
        for scores in answers:
            best = max(range(len(self.choices)), key=lambda i: (scores[i], -i))
            out.append(self.choices[best])
        return out

    def record(self, prepared) -> dict[str, Any]:
        return {"generation": None, "choices": {"source": self.task.choices, "count": len(self.choices)}}
