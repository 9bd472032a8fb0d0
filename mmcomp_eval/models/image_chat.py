"""Our prompts in a vision-language processor's chat format (used by the ``hf_vlm`` adapter).

A rendered prompt is text with ``<image>`` placeholders plus an ordered list
of images (``models/vlm.py``); with ``--apply-chat-template`` it is also a
list of turns (system = instruction, a user/assistant pair per shot, the
query as the last user turn). transformers' processors take a conversation
whose message contents are lists of parts, ``{"type": "text", "text": ...}``
and ``{"type": "image"}``, and their chat template decides what text stands
for each image. The conversion:

* a plain prompt (the default) becomes **one user turn**, its text cut at
  each placeholder with an image part in between, so the i-th image sits
  where the i-th placeholder was. Few-shot answers stay inside that turn, as
  in the paper's Fig. 7 prompt, and the template's generation prompt
  (``Assistant:``, ``<|im_start|>assistant``, ``ASSISTANT:``) primes the answer;
* chat turns (``--apply-chat-template``) become one message each, cut the
  same way;
* text-only runs (``images=false``) drop the placeholders and send text parts only.

Not every template keeps image parts where they are: LLaVA's and LLaVA-NeXT's
print all of a turn's images first, then its text, which would move every
keyframe of Fig. 7 to the start. :func:`find_image_slots` renders a probe
turn (text, image, text, image, text) once per model and checks where the
images land. Templates that keep them in place get image parts; the others
get the processor's image token written into the text at each placeholder
(``USER: take knife <image> . wash plate <image> => ASSISTANT:``), which the
processor expands exactly as it expands the token the template would have
printed. Either way the text the processor reads holds one image token per
image, in prompt order (checked for every request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mmcomp_eval.api.request import ChatMessage
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.vlm import strip_placeholders
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

#: texts of the probe turn: unlikely in any template, and free of characters templates escape
_PROBE = ("mmcompProbeA", "mmcompProbeB", "mmcompProbeC")


@dataclass(frozen=True)
class ImageSlots:
    """Where a checkpoint's chat template puts images, and the text that stands for one image."""

    #: True: image parts stay where they are in a turn; False: the image token goes inline in the text
    in_parts: bool
    #: the text that stands for one image in what the processor reads (``<image>``,
    #: ``<|vision_start|><|image_pad|><|vision_end|>``); also used for ``prompt_format=raw``
    markup: str
    #: the token the processor expands into the image's tokens (one per image in its input text)
    image_token: str

    @property
    def placement(self) -> str:
        return "content_parts" if self.in_parts else "inline"


def find_image_slots(processor, what: str) -> ImageSlots:
    """Render a probe turn (text, image, text, image, text) through the processor's chat template and look."""
    image_token = getattr(processor, "image_token", None)
    if not isinstance(image_token, str) or not image_token:
        raise UserError(f"the processor of '{what}' ({type(processor).__name__}) has no image token; "
                        "hf_vlm needs an image-text-to-text processor")
    a, b, c = _PROBE
    probe = [{"role": "user", "content": [_text(a), {"type": "image"}, _text(b), {"type": "image"}, _text(c)]}]
    text = render(processor, [probe], what)[0]
    i_a, i_b, i_c = (text.find(p) for p in _PROBE)
    if 0 <= i_a < i_b < i_c:
        first, second = text[i_a + len(a) : i_b], text[i_b + len(b) : i_c]
        if first == second and first.count(image_token) == 1 and text.count(image_token) == 2:
            return ImageSlots(True, first, image_token)
    return ImageSlots(False, image_token, image_token)


def has_chat_template(processor) -> bool:
    return bool(getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None))


def render(processor, conversations: Sequence[list[dict[str, Any]]], what: str) -> list[str]:
    """Each conversation as the text its chat template gives, with the generation prompt appended."""
    import jinja2

    try:
        return [processor.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    except jinja2.TemplateError as exc:
        raise UserError(f"the chat template of '{what}' rejects the prompt ({exc}); run without "
                        "--apply-chat-template, or with prompt_format=raw") from None


def conversation(prompt: str, messages: Sequence[ChatMessage] | None, slots: ImageSlots,
                 with_images: bool) -> list[dict[str, Any]]:
    """The processor's conversation for one request: the plain prompt as one user turn, or each chat turn."""
    if messages is None:
        return [{"role": "user", "content": content_parts(prompt, slots, with_images)}]
    return [{"role": m.role, "content": content_parts(m.content, slots, with_images)} for m in messages]


def content_parts(text: str, slots: ImageSlots, with_images: bool) -> list[dict[str, Any]]:
    """``"a <image> b"`` -> text ``"a "``, an image, text ``" b"`` (or one text part with the image token inline)."""
    if not with_images:
        return [_text(strip_placeholders(text))]
    if not slots.in_parts:
        return [_text(text.replace(IMAGE_PLACEHOLDER, slots.markup))]
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append(_text(piece))
    return parts or [_text("")]


def raw_text(prompt: str, slots: ImageSlots, with_images: bool) -> str:
    """``prompt_format=raw``: the prompt as written, each placeholder replaced by the model's image markup."""
    return prompt.replace(IMAGE_PLACEHOLDER, slots.markup) if with_images else strip_placeholders(prompt)


def check_image_tokens(text: str, slots: ImageSlots, expected: int, request_id: str) -> None:
    """The text the processor reads must hold one image token per image of the request."""
    found = text.count(slots.image_token)
    if found != expected:
        raise UserError(f"request {request_id}: the prompt sent to the model holds {found} image tokens "
                        f"({slots.image_token}) but the request has {expected} images; the prompt's text "
                        f"must not contain {slots.image_token} itself")


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}
