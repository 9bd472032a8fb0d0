"""What the evaluator asks a model for, and what it gets back.

Requests are plain frozen dataclasses so that they can be hashed into cache
keys and compared across runs; models never see task or document objects.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


#: fields that only matter when ``do_sample`` is true
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")


@dataclass(frozen=True)
class GenerationSettings:
    """How to decode: a task's ``generation:`` section, ``--gen-kwargs`` and every request use this one type.

    Greedy unless ``do_sample``; beam search when ``num_beams`` > 1. The
    defaults are Hugging Face ``generate``'s, except ``max_new_tokens`` (16:
    CompAct answers are a few words) and ``stop`` (a newline ends an answer).
    Every field is part of the response-store key (the request is hashed
    with its settings), so changing any of them never reuses old answers.
    """

    max_new_tokens: int = 16
    #: generation stops once the new text contains one of these; the answer is cut before it
    stop: tuple[str, ...] = ("\n",)
    do_sample: bool = False
    #: sampling only: logits are divided by it (must be > 0; use ``do_sample: false`` for greedy)
    temperature: float = 1.0
    #: sampling only: nucleus sampling keeps the most probable tokens whose mass reaches ``top_p``
    top_p: float = 1.0
    #: sampling only: keep the ``top_k`` most probable tokens first (0: no limit); 50 is HF's default
    top_k: int = 50
    #: beam search width (greedy or beam search only; not combined with sampling)
    num_beams: int = 1
    #: beam search only: a finished beam's score is its log-probability divided by length**length_penalty
    #: (HF's default 1.0; OpenFlamingo's evaluation uses 0.0, the plain sum)
    length_penalty: float = 1.0
    #: HF's CTRL-style penalty on tokens already in the prompt or answer (1.0: none)
    repetition_penalty: float = 1.0
    #: forbid repeating any n-gram of this size (0: off)
    no_repeat_ngram_size: int = 0
    #: the run's seed (``--seed``/``--seeds``); 0 for deterministic decoding, where it changes nothing
    seed: int = 0

    def problem(self) -> str | None:
        """What is wrong with these settings, as ``field=value: why``; None when they are usable."""
        if self.max_new_tokens < 1:
            return f"max_new_tokens={self.max_new_tokens}: must be at least 1"
        if self.num_beams < 1:
            return f"num_beams={self.num_beams}: must be at least 1"
        if self.repetition_penalty <= 0:
            return f"repetition_penalty={self.repetition_penalty}: must be > 0 (1.0 is no penalty)"
        if self.length_penalty != 1.0 and self.num_beams == 1:
            return f"length_penalty={self.length_penalty} only applies to beam search; add num_beams > 1 (or drop it)"
        if self.no_repeat_ngram_size < 0:
            return f"no_repeat_ngram_size={self.no_repeat_ngram_size}: must be 0 (off) or more"
        if any(not s for s in self.stop):
            return "stop holds an empty string; remove it"
        if not self.do_sample:
            changed = [f"{name}={getattr(self, name)}" for name in SAMPLING_FIELDS
                       if getattr(self, name) != getattr(DEFAULT_SETTINGS, name)]
            if changed:
                return f"{', '.join(changed)} only applies when sampling; add do_sample=true (or drop it)"
            return None
        if self.num_beams > 1:
            return (f"do_sample=true with num_beams={self.num_beams}: beam-search sampling is not supported "
                    "(its draws would depend on the batch); use one of them")
        if not self.temperature > 0:
            return f"temperature={self.temperature}: must be > 0 when sampling (for greedy decoding use do_sample=false)"
        if not 0 < self.top_p <= 1:
            return f"top_p={self.top_p}: must be in (0, 1] (1.0 keeps every token)"
        if self.top_k < 0:
            return f"top_k={self.top_k}: must be 0 (no limit) or more"
        return None

    def for_seed(self, seed: int) -> GenerationSettings:
        """The settings of one seeded run: the seed only where it changes the answer (sampling).

        Deterministic decoding gets seed 0, so a prompt that two seeds share
        is answered once and found in the response store by both.
        """
        return replace(self, seed=seed if self.do_sample else 0)


DEFAULT_SETTINGS = GenerationSettings()


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

    def sampling_seed(self) -> int:
        """The seed of this request's random draws: a hash of the run seed and what is asked.

        Derived from content rather than from the document id or position,
        like the response store's keys: the draws do not depend on which
        other requests share a batch, on the number of processes, or on what
        a resumed run still has to ask, and a request the store answers was
        sampled exactly as re-asking it would be. Two documents with the very
        same prompt get the same draws (the store would answer them once anyway).
        """
        body = {
            "seed": self.settings.seed,
            "prompt": self.prompt,
            "messages": None if self.messages is None else [[m.role, m.content] for m in self.messages],
            "images": list(self.images),
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).digest()
        return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """Score each of ``continuations`` as a continuation of ``context``."""

    request_id: str
    context: str
    continuations: tuple[str, ...]
    messages: tuple[ChatMessage, ...] | None = None


@dataclass(frozen=True)
class MediaFile:
    """A file a request reads, with what cheaply identifies its content.

    The response store keys a request by its content, so the size and
    modification time are part of it: a replaced file is a new request and
    never gets the old file's answer (a content hash would read every video).
    """

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike) -> MediaFile:
        resolved = os.path.realpath(path)
        st = os.stat(resolved)
        return cls(resolved, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class VideoInputs:
    """Everything one gallery video offers a retrieval model, and how its frames are sampled.

    A model uses what it reads: CLIP the precomputed ``features`` when
    given, else frames of ``video``; the ``fusion`` baseline also the
    ``transcript`` and the audio (``audio``, else the video file's own track).
    """

    video_id: str
    video: MediaFile | None = None
    #: ``<video_id>.npy``/``.npz``: one vector or one per frame, already in the model's joint space
    features: MediaFile | None = None
    audio: MediaFile | None = None
    transcript: str | None = None
    #: frames per video (CLIP4Clip ``max_frames``)
    n_frames: int = 12
    #: ``clip4clip`` (1 per second, then evenly spaced) or ``uniform`` (segment centres); see media/video.py
    frame_sampling: str = "clip4clip"


@dataclass(frozen=True)
class EmbeddingRequest:
    """Embed one caption (``text``) or one gallery video (``video``) into the model's joint space.

    Exactly one of the two is set. ``max_text_tokens`` cuts a caption to
    that many tokens, start and end tokens included (CLIP4Clip's
    ``max_words``); None: the model's whole context. Like every request it is
    keyed in the response store by its content, so a caption is embedded once
    per text and settings, and a video once per file and frame settings.
    """

    request_id: str
    text: str | None = None
    max_text_tokens: int | None = None
    video: VideoInputs | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.video is None):
            raise ValueError(f"EmbeddingRequest {self.request_id}: set exactly one of text and video")
