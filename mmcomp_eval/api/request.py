"""What the evaluator asks a model for, and what it gets back.

Requests are plain frozen dataclasses so that they can be hashed into cache
keys and compared across runs; models never see task or document objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class GenerationSettings:
    """Decoding settings; greedy unless ``do_sample``."""

    max_new_tokens: int = 32
    stop: tuple[str, ...] = ("\n",)
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class GenerationRequest:
    """Generate a continuation of ``prompt``.

    ``messages`` is set instead of relying on ``prompt`` when the user asked
    for the tokenizer's chat template: few-shot examples become user/assistant
    turns. ``images`` holds media references in prompt order (used by
    vision-language models; text-only models reject requests that carry any).
    """

    request_id: str
    prompt: str
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    messages: tuple[ChatMessage, ...] | None = None
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """Score each of ``continuations`` as a continuation of ``context``."""

    request_id: str
    context: str
    continuations: tuple[str, ...]
    messages: tuple[ChatMessage, ...] | None = None
