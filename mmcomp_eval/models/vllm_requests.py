"""How one harness request becomes vLLM's input: sampling parameters, prompt token ids, image parts.

Plain functions over requests and tokenizers, so they are tested on a CPU
machine without vLLM; :mod:`mmcomp_eval.models.vllm_backend` feeds their
results to the engine. The README's mapping table describes the same rules.
"""

from __future__ import annotations

import logging
from typing import Any

from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.vlm import strip_placeholders
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

log = logging.getLogger(__name__)

#: vLLM refuses temperatures above this
MAX_TEMPERATURE = 2.0
#: vLLM's "no top-k limit" (0 in recent versions; -1 is accepted by old and new ones alike)
NO_TOP_K = -1
#: seeds stay within a signed 64-bit integer, which every torch generator and serialiser takes
SEED_MASK = (1 << 63) - 1


def unsupported(settings: GenerationSettings) -> str | None:
    """Which generation setting vLLM cannot run as the task says, as ``field=value (why)``; None when all can."""
    if settings.num_beams > 1:
        return (f"num_beams={settings.num_beams} (vLLM's beam search takes no stop strings or repetition "
                "penalty, so it is not the search hf runs)")
    if settings.no_repeat_ngram_size:
        return f"no_repeat_ngram_size={settings.no_repeat_ngram_size} (vLLM has no n-gram blocking)"
    if settings.do_sample and settings.temperature > MAX_TEMPERATURE:
        return f"temperature={settings.temperature} (vLLM takes at most {MAX_TEMPERATURE})"
    return None


def sampling_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """``vllm.SamplingParams(**...)`` for one request (the README's mapping table).

    Greedy decoding is vLLM's ``temperature=0``. Sampling passes HF's
    warpers' settings (``top_k`` 0 becomes vLLM's "no limit") and the
    request's own seed. ``skip_special_tokens`` matches ``hf``'s decoding;
    stop strings are left out of the text, as ``hf`` cuts them.
    """
    s = request.settings
    kwargs: dict[str, Any] = {"n": 1, "max_tokens": s.max_new_tokens, "stop": list(s.stop),
                              "repetition_penalty": s.repetition_penalty, "skip_special_tokens": True,
                              "include_stop_str_in_output": False}
    if not s.do_sample:
        kwargs["temperature"] = 0.0
        return kwargs
    kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or NO_TOP_K,
                  seed=request.sampling_seed() & SEED_MASK)
    return kwargs


def render_chat(tokenizer, messages, owner: str) -> str:
    """The tokenizer's chat template over the request's turns, as ``hf`` renders it."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer of '{owner}' has no chat template; drop --apply-chat-template")
    chat = [{"role": m.role, "content": m.content} for m in messages]
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def token_prompt(tokenizer, request: GenerationRequest, budget: int, owner: str) -> list[int]:
    """A text request's token ids, exactly as the ``hf`` adapter builds them.

    Special tokens (BOS) are added unless a chat template already wrote
    them; a prompt longer than ``budget`` keeps its last ``budget`` tokens.
    """
    text = request.prompt if request.messages is None else render_chat(tokenizer, request.messages, owner)
    ids = list(tokenizer(text, add_special_tokens=request.messages is None).input_ids)
    if len(ids) > budget:
        log.warning("prompt of %d tokens cut to its last %d", len(ids), budget)
        ids = ids[-budget:]
    return ids


def with_image_tokens(text: str, placeholder) -> str:
    """``text`` with its i-th ``<image>`` replaced by ``placeholder(i)`` (1-based, as vLLM numbers them)."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    out = [pieces[0]]
    for i, piece in enumerate(pieces[1:], start=1):
        out += [placeholder(i), piece]
    return "".join(out)


def content_parts(text: str, images: bool) -> list[dict[str, str]]:
    """A turn as a processor's chat template takes it: text parts and, where ``<image>`` was, image parts."""
    pieces = text.split(IMAGE_PLACEHOLDER) if images else [strip_placeholders(text)]
    parts: list[dict[str, str]] = []
    for k, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if k < len(pieces) - 1:
            parts.append({"type": "image"})
    return parts
