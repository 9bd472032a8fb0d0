"""``output_type: generate``: the model continues the prompt; the first line of its text is the answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from mmcomp_eval.api.model import ModelCapabilities
from mmcomp_eval.api.request import GenerationRequest
from mmcomp_eval.api.task import ModelCall, OutputType
from mmcomp_eval.tasks.outputs.registry import OUTPUT_TYPES
from mmcomp_eval.textnorm import answer_text


@OUTPUT_TYPES.register("generate")
class Generate(OutputType):
    """Free text, decoded with the task's ``generation:`` settings (``--gen-kwargs`` applied)."""

    name = "generate"

    @classmethod
    def model_problem(cls, capabilities: ModelCapabilities) -> str | None:
        return None if capabilities.generate else "cannot generate text"

    def requests(self, prepared, seed: int) -> ModelCall:
        settings = self.task.generation.for_seed(seed)
        reqs = [GenerationRequest(d.id, p.text, settings, p.messages, tuple(f"{i.doc_id}#{i.clip}" for i in p.images))
                for d, p in zip(prepared.docs, prepared.prompts[seed])]
        extra = {"images": prepared.media.images_for(reqs)} if prepared.media else {}
        return ModelCall("generate", reqs, extra)

    def parse(self, answers: Sequence[Any]) -> list[str]:
        """Each continuation's first line, stripped (:func:`~mmcomp_eval.textnorm.answer_text`)."""
        return [answer_text(raw) for raw in answers]

    def record(self, prepared) -> dict[str, Any]:
        settings = asdict(self.task.generation)
        del settings["seed"]
        sampling = ("per request: a hash of the seed and the request's prompt, messages and images"
                    if self.task.generation.do_sample else "none (deterministic decoding: the seed only changes the shots)")
        return {"generation": {**settings, "sampling_seed": sampling}}
