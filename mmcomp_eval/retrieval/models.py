"""Retrieval models: ``clip`` (CLIP4Clip meanP, zero-shot) and ``fusion`` (SAVE-style audio + speech).

A retrieval model turns captions and videos into vectors whose dot product is
the caption-video similarity. That one contract is all the scorer needs, and
it lets :mod:`mmcomp_eval.retrieval.metrics` compute similarities block by
block from embeddings instead of holding a captions x videos matrix.

* ``clip``: N uniformly sampled frames per video (the media layer), CLIP image
  embeddings normalised per frame, mean-pooled and normalised again (CLIP4Clip
  "meanP"); a caption is CLIP's text embedding. Video embeddings are cached
  on disk (see :mod:`mmcomp_eval.retrieval.cache`). A video may come as a
  precomputed feature file instead (``.npy``/``.npz``: one vector or one per
  frame, already in the joint space).
* ``fusion``: the ``clip`` similarity plus, with weights, the similarity of the
  caption to the video's speech transcript (CLIP text tower on both sides)
  and, when a CLAP checkpoint is given, of the caption to the audio track::

      s = w_video * cos(t, v) + w_transcript * cos(t, transcript) + w_audio * cos_clap(t, audio)

  This is a dot product of concatenated vectors, ``[w_v t, w_s t, w_a t_clap]``
  against ``[v, transcript, audio]``. An item without a transcript or audio
  gets a zero vector there, so that term contributes 0 for it (it neither
  helps nor hurts more than a transcript unrelated to every caption).

Weights of randomly initialised test models produce meaningless scores; they
exercise the code path only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmcomp_eval.errors import UserError
from mmcomp_eval.media.video import sample_uniform_frames
from mmcomp_eval.models.registry import ModelRegistry
from mmcomp_eval.retrieval.cache import EmbeddingCache
from mmcomp_eval.retrieval.encoders import (
    ClapEncoder,
    ClipEncoder,
    centre_crop,
    decode_audio,
    load_feature_file,
    mean_pool,
)


@dataclass(frozen=True)
class VideoItem:
    """One gallery video: where its pixels (or features), audio and transcript come from."""

    video_id: str
    video_path: Path | None = None
    features_path: Path | None = None
    audio_path: Path | None = None
    transcript: str | None = None


class RetrievalModel(ABC):
    """Captions and videos into vectors; similarity is their dot product."""

    name = "retrieval"

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """What identifies this model's scores (recorded in results.json)."""

    @abstractmethod
    def embed_captions(self, captions: Sequence[str]) -> np.ndarray:
        """(n_captions, d) float32."""

    @abstractmethod
    def embed_videos(self, items: Sequence[VideoItem]) -> np.ndarray:
        """(n_videos, d) float32, same d as :meth:`embed_captions`."""


RETRIEVAL_MODELS = ModelRegistry("retrieval model")


def create_retrieval_model(name: str, args: str | Mapping[str, Any] | None = None) -> RetrievalModel:
    """Build ``--model name --model-args args`` from the retrieval registry."""
    if not name:
        raise UserError("--model is empty; pick one of: " + ", ".join(RETRIEVAL_MODELS.names()))
    return RETRIEVAL_MODELS.create(name, args)


@RETRIEVAL_MODELS.register("clip", aliases=("clip4clip-meanp",))
class ClipRetrieval(RetrievalModel):
    """Zero-shot CLIP video retrieval, CLIP4Clip meanP pooling (any transformers CLIP checkpoint)."""

    name = "clip"

    def __init__(self, pretrained: str = "openai/clip-vit-base-patch32", n_frames: int = 12,
                 batch_size: int = 64, device: str | None = None, revision: str | None = None,
                 local_files_only: bool = False, offline: bool = False, cache: bool = True):
        if n_frames < 1:
            raise UserError(f"model argument n_frames={n_frames} must be at least 1")
        self.pretrained = pretrained
        self.n_frames = n_frames
        self.encoder = ClipEncoder(pretrained, revision=revision, device=device, batch_size=batch_size,
                                   local_files_only=local_files_only or offline)
        self.cache = EmbeddingCache({"kind": "clip-meanP", "checkpoint": self.encoder.fingerprint,
                                     "n_frames": n_frames}, enabled=cache)
        #: videos decoded and encoded by this instance (cache misses), for logs and tests
        self.videos_encoded = 0

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name, "pooling": "meanP", "n_frames": self.n_frames,
                "checkpoint": self.encoder.fingerprint}

    def embed_captions(self, captions: Sequence[str]) -> np.ndarray:
        return self.encoder.text(captions)

    def embed_videos(self, items: Sequence[VideoItem]) -> np.ndarray:
        out = np.zeros((len(items), self.encoder.dim), dtype=np.float32)
        pending: list[tuple[int, str, list]] = []  # (row, cache key, frames) waiting for a batch
        n_pending_frames = 0
        for row, item in enumerate(items):
            if item.features_path is not None:
                out[row] = load_feature_file(Path(item.features_path), self.encoder.dim)
                continue
            if item.video_path is None:
                raise UserError(f"video '{item.video_id}' has neither a video file nor a feature file; "
                                "give --videos-dir or --features-dir")
            key = self.cache.key(item.video_path, n_frames=self.n_frames)
            hit = self.cache.get(key)
            if hit is not None:
                out[row] = hit
                continue
            frames = sample_uniform_frames(item.video_path, self.n_frames)
            pending.append((row, key, frames))
            n_pending_frames += len(frames)
            if n_pending_frames >= self.encoder.batch_size:
                self._encode(pending, out)
                pending, n_pending_frames = [], 0
        self._encode(pending, out)
        return out

    def _encode(self, pending: list[tuple[int, str, list]], out: np.ndarray) -> None:
        if not pending:
            return
        feats = self.encoder.frames([f for _, _, frames in pending for f in frames])
        start = 0
        for row, key, frames in pending:
            emb = mean_pool(feats[start:start + len(frames)], f"frames of video row {row}")
            start += len(frames)
            out[row] = emb
            self.cache.put(key, emb)
            self.videos_encoded += 1


@RETRIEVAL_MODELS.register("fusion", aliases=("save-fusion",))
class FusionRetrieval(RetrievalModel):
    """SAVE-style late fusion: CLIP video + transcript text + (optional) CLAP audio similarities."""

    name = "fusion"

    def __init__(self, pretrained: str = "openai/clip-vit-base-patch32", clap: str | None = None,
                 w_video: float = 1.0, w_transcript: float = 0.5, w_audio: float | None = None,
                 n_frames: int = 12, batch_size: int = 64, device: str | None = None,
                 local_files_only: bool = False, offline: bool = False, cache: bool = True):
        if w_audio is not None and w_audio > 0 and clap is None:
            raise UserError(f"model argument w_audio={w_audio} needs an audio-text model: add "
                            "clap=laion/clap-htsat-unfused (or a local CLAP folder) to --model-args")
        self.weights = {"video": float(w_video), "transcript": float(w_transcript),
                        "audio": float(0.0 if clap is None else (0.5 if w_audio is None else w_audio))}
        bad = [f"w_{k}={v}" for k, v in self.weights.items() if v < 0]
        if bad or not any(self.weights.values()):
            raise UserError(f"fusion weights must be >= 0 and not all 0, got {', '.join(bad) or 'all 0'}")
        self.clip = ClipRetrieval(pretrained, n_frames=n_frames, batch_size=batch_size, device=device,
                                  local_files_only=local_files_only, offline=offline, cache=cache)
        self.clap = None
        self.audio_cache = None
        if clap is not None:
            self.clap = ClapEncoder(clap, device=device, local_files_only=local_files_only or offline)
            self.audio_cache = EmbeddingCache({"kind": "clap-audio", "checkpoint": self.clap.fingerprint,
                                               "centre_crop_samples": self.clap.max_samples}, enabled=cache)

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name, "weights": self.weights, "video": self.clip.fingerprint(),
                "audio": None if self.clap is None else self.clap.fingerprint}

    def embed_captions(self, captions: Sequence[str]) -> np.ndarray:
        t = self.clip.embed_captions(captions)
        parts = [self.weights["video"] * t, self.weights["transcript"] * t]
        if self.clap is not None:
            parts.append(self.weights["audio"] * self.clap.text(captions))
        return np.concatenate(parts, axis=1).astype(np.float32)

    def embed_videos(self, items: Sequence[VideoItem]) -> np.ndarray:
        parts = [self.clip.embed_videos(items), self._transcripts(items)]
        if self.clap is not None:
            parts.append(self._audio(items))
        return np.concatenate(parts, axis=1)

    def _transcripts(self, items: Sequence[VideoItem]) -> np.ndarray:
        out = np.zeros((len(items), self.clip.encoder.dim), dtype=np.float32)
        rows = [i for i, it in enumerate(items) if it.transcript and it.transcript.strip()]
        if rows:
            out[rows] = self.clip.encoder.text([items[i].transcript for i in rows])
        return out

    def _audio(self, items: Sequence[VideoItem]) -> np.ndarray:
        assert self.clap is not None and self.audio_cache is not None
        out = np.zeros((len(items), self.clap.dim), dtype=np.float32)
        pending: list[tuple[int, str, np.ndarray]] = []
        for i, item in enumerate(items):
            source = item.audio_path or item.video_path
            if source is None:
                continue
            key = self.audio_cache.key(source, sampling_rate=self.clap.sampling_rate)
            hit = self.audio_cache.get(key)
            if hit is not None:
                if hit.size:  # an empty entry records 'this file has no audio'
                    out[i] = hit
                continue
            wave = decode_audio(Path(source), self.clap.sampling_rate)
            if wave is None:
                self.audio_cache.put(key, np.zeros(0, np.float32))
                continue
            pending.append((i, key, centre_crop(wave, self.clap.max_samples)))
            if len(pending) >= self.clap.batch_size:
                self._encode_audio(pending, out)
                pending = []
        self._encode_audio(pending, out)
        return out

    def _encode_audio(self, pending: list[tuple[int, str, np.ndarray]], out: np.ndarray) -> None:
        if not pending:
            return
        emb = self.clap.audio([w for _, _, w in pending])
        for (row, key, _), e in zip(pending, emb):
            out[row] = e
            self.audio_cache.put(key, e)


for _preset, _checkpoint in (("clip-b32", "openai/clip-vit-base-patch32"), ("clip-b16", "openai/clip-vit-base-patch16"),
                             ("clip-l14", "openai/clip-vit-large-patch14")):
    RETRIEVAL_MODELS.add_preset(_preset, "clip", f"zero-shot CLIP4Clip meanP with {_checkpoint}",
                                pretrained=_checkpoint)
