"""What the vision-language adapters (``idefics``, ``open_flamingo``, ``otter``) share beyond :class:`LocalModel`.

CompAct prompts a VLM with Fig. 7: narrations, each followed by the keyframe
of its clip, for every few-shot example and for the query. The evaluator
hands the adapter one list of images per request, in prompt order (queries
*and* shots: lm-evaluation-harness and lmms-eval drop few-shot images, which
changes the task); the template's ``<image>`` placeholders mark where each
goes, so the i-th placeholder always gets the i-th image.

``images=false`` withholds the images: placeholders are removed from the
prompt and no frames are read (``reads_images`` is false), which gives the
paper's L vs VL comparison with one model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.model import ModelCapabilities, ProgressCallback, ResultCallback
from mmcomp_eval.api.request import GenerationRequest
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.local import EncodedPrompt, LocalModel, LocalOptions
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from PIL import Image

_PLACEHOLDER_RE = re.compile(r"[ \t]*" + re.escape(IMAGE_PLACEHOLDER))


@dataclass(frozen=True)
class VisionOptions(LocalOptions):
    """:class:`LocalOptions` plus whether and how many images a VLM reads."""

    #: images cost memory per row: a smaller default batch than text-only models
    batch_size: int | str = 4
    #: false: the prompts' placeholders are removed and no frames are read (text-only evaluation)
    images: bool = True
    #: most images one request may carry (unset: no limit)
    max_images: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_images is not None and self.max_images < 1:
            raise UserError(f"model argument max_images={self.max_images} must be at least 1")

    def torch_dtype(self) -> Any:
        """``auto``: bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow and less exact).

        Not the checkpoint's dtype, as for text-only models: Flamingo's new
        parts are built from configs and need one dtype for every part.
        """
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if torch.cuda.is_available() else torch.float32
        return getattr(torch, self.dtype)


def strip_placeholders(text: str) -> str:
    """The prompt without its ``<image>`` placeholders (text-only evaluation of a VLM)."""
    return _PLACEHOLDER_RE.sub("", text)


def interleave(text: str, images: Sequence[Any]) -> list[Any]:
    """``"a <image> b <image> c"`` + ``[i0, i1]`` -> ``["a ", i0, " b ", i1, " c"]`` (empty text pieces dropped)."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 != len(images):
        raise UserError(f"prompt holds {len(pieces) - 1} {IMAGE_PLACEHOLDER} placeholders but {len(images)} images "
                        "were given; the template's image() calls and the media disagree")
    out: list[Any] = []
    for k, piece in enumerate(pieces):
        if piece:
            out.append(piece)
        if k < len(images):
            out.append(images[k])
    return out


class VisionLanguageModel(LocalModel):
    """A :class:`LocalModel` whose requests carry images: the image checks, rendering and capabilities."""

    options_type = VisionOptions
    options: VisionOptions

    def __init__(self, options: Mapping[str, Any]):
        super().__init__(options)
        self.capabilities = self.capabilities_for(options)
        self.reads_images = self.capabilities.reads_images
        self.max_images = self.capabilities.max_images

    @classmethod
    def capabilities_for(cls, args: Mapping[str, Any]) -> ModelCapabilities:
        # text-only runs (images=false) keep the image tasks' prompts but read no frames
        images, max_images = bool(args.get("images", True)), args.get("max_images")
        if max_images is not None and (isinstance(max_images, bool) or not isinstance(max_images, int)
                                       or max_images < 1):
            raise UserError(f"model argument max_images={max_images!r} must be a whole number of at least 1")
        return ModelCapabilities(generate=True, images=True, reads_images=images,
                                 max_images=max_images if images else None, reports_each_result=True)

    def generate(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None,
                 on_result: ResultCallback | None = None,
                 images: Sequence[Sequence[Image.Image]] | None = None) -> list[str]:
        """One answer per request; ``images[i]`` are request ``i``'s images in prompt order."""
        if not self.reads_images:
            images = None
        elif images is None and any(r.images for r in requests):
            raise UserError(f"model '{self.name}' got prompts with images but no image data; give the task "
                            "a media section, or run the model with images=false")
        elif images is not None and len(images) != len(requests):
            raise ValueError(f"{len(images)} image lists for {len(requests)} requests")
        return self._generate_requests(requests, progress, on_result, images)

    def _encode(self, request: GenerationRequest) -> EncodedPrompt:
        text = self._render(request)
        return EncodedPrompt(text, len(self.tokenizer(text).input_ids))

    def _render(self, request: GenerationRequest) -> str:
        """The model's prompt text for one request (placeholders removed when it reads no images)."""
        text = self._prompt_text(request)
        return text if self.reads_images else strip_placeholders(text)

    def _prompt_text(self, request: GenerationRequest) -> str:
        return request.prompt if request.messages is None else self._chat(request.messages)

    def _chat(self, messages) -> str:
        raise UserError(f"model '{self.name}' has no chat format; drop --apply-chat-template")

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "images": self.reads_images}
