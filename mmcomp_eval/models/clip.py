"""``clip``: zero-shot CLIP video retrieval, CLIP4Clip "meanP" (any transformers CLIP checkpoint).

A caption is CLIP's text embedding of at most the request's
``max_text_tokens`` tokens (CLIP4Clip's ``max_words``: 32 on MSR-VTT). A
video is its precomputed feature file when the task gives one, else frames
sampled as the request says (CLIP4Clip: one per second, at most
``n_frames`` evenly spaced; ``uniform``: segment centres), each embedded by
CLIP's image tower after the visual projection, normalised, averaged and
normalised again. Frame and text settings come from the task, so they are
part of each request and of its response-store key, not of the model.

Presets ``clip-b32``, ``clip-b16``, ``clip-l14`` name the OpenAI
checkpoints. The loading options are the local adapters' (``dtype``,
``device``, ``offline``, ...; ``models/local.py``) with float32 and 64
texts or frames per batch by default; CLIP4Clip runs float16.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mmcomp_eval.api.request import VideoInputs
from mmcomp_eval.errors import UserError
from mmcomp_eval.media.video import FRAME_SAMPLINGS, sample_frames
from mmcomp_eval.models.embedding import (
    EmbeddingModel,
    EmbeddingOptions,
    Report,
    batched,
    checkpoint_fingerprint,
    l2norm,
    load_feature_file,
    mean_pool,
    reduced_precision_guard,
)
from mmcomp_eval.models.loading import guarded_load, resolve_pretrained
from mmcomp_eval.models.registry import MODELS

if TYPE_CHECKING:
    from PIL import Image


def load_checkpoint(what: str, arg: str, load):
    """``guarded_load``, also for a folder that is not a checkpoint of that kind (transformers raises ValueError)."""
    try:
        return guarded_load(what, load, arg)
    except ValueError as exc:
        reason = " ".join(str(exc).split())[:180]
        raise UserError(f"cannot load checkpoint '{what}': {reason} -- give a folder holding that model with "
                        f"--model-args {arg}=/local/folder") from None


class ClipEncoder:
    """A transformers CLIP checkpoint: captions and frames into its joint space, float32 whatever ``dtype`` is."""

    def __init__(self, pretrained: str, revision: str | None, options: EmbeddingOptions, batch_size: int,
                 arg: str = "pretrained"):
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        self.source = resolve_pretrained(pretrained)
        hub = {"revision": revision, **options.hub_kwargs()}
        self.model = load_checkpoint(pretrained, arg, lambda: CLIPModel.from_pretrained(
            self.source, **hub, **options.weights_kwargs()))
        self.tokenizer = load_checkpoint(pretrained, arg, lambda: AutoTokenizer.from_pretrained(self.source, **hub))
        self.processor = load_checkpoint(pretrained, arg,
                                         lambda: AutoImageProcessor.from_pretrained(self.source, **hub))
        device = options.target_device()
        if device is not None:
            self.model.to(device)
        self.model.eval()
        self.device = self.model.device
        self.dtype = options.dtype
        self.torch_dtype = self.model.dtype
        self.batch_size = batch_size
        self.dim = int(self.model.config.projection_dim)
        #: the checkpoint's text context in tokens, start and end tokens included (77 for OpenAI CLIP)
        positions = int(self.model.config.text_config.max_position_embeddings)
        if options.max_length and options.max_length > positions:
            raise UserError(f"model argument max_length={options.max_length}: this CLIP's text tower has "
                            f"{positions} positions; use at most {positions}")
        self.context_length = options.max_length or min(int(self.tokenizer.model_max_length), positions)
        self.fingerprint = checkpoint_fingerprint(self.source, self.model, revision)

    def text(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        """Caption (or transcript) embeddings, each text cut to ``max_tokens`` tokens (default: the context)."""
        limit = self.context_length if max_tokens is None else max_tokens
        if not 2 <= limit <= self.context_length:
            raise UserError(f"retrieval.max_text_tokens={limit} must be between 2 and the checkpoint's context of "
                            f"{self.context_length} tokens")

        def encode(batch: list[str]):
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=limit,
                                 return_tensors="pt").to(self.device)
            return reduced_precision_guard(self.dtype, self.device, lambda: self.model.get_text_features(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]))

        feats = batched(texts, self.batch_size, self.dim, encode)
        return l2norm(feats, "a text embedding") if len(feats) else feats

    def frames(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Per-frame image embeddings (not normalised: :func:`mean_pool` does that)."""
        def encode(batch: list[Image.Image]):
            pixels = self.processor(images=batch, return_tensors="pt")["pixel_values"]
            pixels = pixels.to(self.device, dtype=self.torch_dtype)
            return reduced_precision_guard(self.dtype, self.device,
                                           lambda: self.model.get_image_features(pixel_values=pixels))

        return batched(images, self.batch_size, self.dim, encode)


@MODELS.register("clip", aliases=("clip4clip-meanp",))
class ClipRetrieval(EmbeddingModel):
    """Zero-shot CLIP video retrieval with CLIP4Clip's meanP pooling."""

    name = "clip"

    def __init__(self, pretrained: str = "openai/clip-vit-base-patch32", revision: str | None = None, **options: Any):
        super().__init__(options)
        self.pretrained = pretrained
        self.encoder = ClipEncoder(pretrained, revision, self.options, self.batch_size)

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name, "pooling": "meanP", "dtype": self.encoder.dtype, "device": self.encoder.device.type,
                "context_length": self.encoder.context_length, "checkpoint": self.encoder.fingerprint}

    def embed_texts(self, texts: Sequence[str], max_tokens: int | None) -> np.ndarray:
        return self.encoder.text(texts, max_tokens)

    def embed_videos(self, videos: Sequence[VideoInputs], report: Report) -> None:
        """Feature files at once; video files decoded, their frames batched across videos, pooled per video."""
        pending: list[tuple[int, list]] = []  # (position, frames) waiting for a batch
        n_frames = 0
        for j, video in enumerate(videos):
            if video.features is not None:
                report(j, load_feature_file(Path(video.features.path), self.encoder.dim))
                continue
            if video.video is None:
                raise UserError(f"video '{video.video_id}' has neither a video file nor a feature file; give the task "
                                "retrieval.videos_dir or retrieval.features_dir")
            if video.frame_sampling not in FRAME_SAMPLINGS:
                raise UserError(f"frame_sampling {video.frame_sampling!r} is not one of {', '.join(FRAME_SAMPLINGS)}")
            frames = sample_frames(video.video.path, video.n_frames, video.frame_sampling)
            pending.append((j, frames))
            n_frames += len(frames)
            if n_frames >= self.batch_size:
                self._encode(pending, report)
                pending, n_frames = [], 0
        self._encode(pending, report)

    def _encode(self, pending: list[tuple[int, list]], report: Report) -> None:
        if not pending:
            return
        feats = self.encoder.frames([f for _, frames in pending for f in frames])
        start = 0
        for j, frames in pending:
            report(j, mean_pool(feats[start:start + len(frames)], f"the frames of gallery video {j}"))
            start += len(frames)
            self.videos_encoded += 1


for _preset, _checkpoint in (("clip-b32", "openai/clip-vit-base-patch32"), ("clip-b16", "openai/clip-vit-base-patch16"),
                             ("clip-l14", "openai/clip-vit-large-patch14")):
    MODELS.add_preset(_preset, "clip", f"zero-shot CLIP4Clip meanP with {_checkpoint}", pretrained=_checkpoint)
