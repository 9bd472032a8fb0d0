"""Retrieval models: ``clip`` (CLIP4Clip meanP, zero-shot) and ``fusion`` (a score-fusion baseline of ours).

A retrieval model turns captions and videos into vectors whose dot product is
the caption-video similarity. That one contract is all the scorer needs, and
it lets :mod:`mmcomp_eval.retrieval.metrics` compute similarities block by
block from embeddings instead of holding a captions x videos matrix. A model
whose scores depend on the whole gallery (``fusion`` normalises over it) maps
the embeddings once more in :meth:`RetrievalModel.score_vectors`.

* ``clip``: CLIP4Clip "meanP" as its code runs it by default: frames sampled
  at one per second, at most ``n_frames`` (12) of them evenly spaced
  (``frame_sampling=clip4clip``; ``uniform`` takes ``n_frames`` segment
  centres instead), CLIP image embeddings normalised per frame, mean-pooled
  and normalised again; a caption is CLIP's text embedding of at most
  ``max_text_tokens`` (32) tokens. Video embeddings are cached on disk (see
  :mod:`mmcomp_eval.retrieval.cache`). A video may come as a precomputed
  feature file instead (``.npy``/``.npz``: one vector or one per frame,
  already in the joint space).
* ``fusion``: a score-level fusion **baseline of our own**, not SAVE's model
  (SAVE learns a speech-aware video encoder; nothing here is trained): the
  ``clip`` score plus, with weights, the cosine of the caption with the
  video's speech transcript (CLIP text tower on both sides) and, when a CLAP
  checkpoint is given, with its audio track. Each part is z-scored per
  caption over the videos that have it (:mod:`mmcomp_eval.retrieval.fusion`),
  so a missing transcript or audio track neither helps nor hurts a video.

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
from mmcomp_eval.media.video import FRAME_SAMPLINGS, sample_frames
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
from mmcomp_eval.retrieval.fusion import NORMALISATIONS, Modality, fusion_vectors


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
        """(n_videos, d') float32; d' = d unless :meth:`score_vectors` maps both sides to one width."""

    def score_vectors(self, caption_emb: np.ndarray, video_emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectors whose dot product is the score ranked, given the whole gallery; the embeddings themselves here."""
        return caption_emb, video_emb

    def scoring(self) -> str:
        """How a caption-video score is computed, in words (recorded in results)."""
        return "cosine of the caption and video embeddings"


RETRIEVAL_MODELS = ModelRegistry("retrieval model")


#: CLIP4Clip's per-dataset settings where they differ from ``clip``'s defaults (its MSR-VTT, MSVD and LSMDC
#: ones: 12 frames, 32 tokens): DiDeMo is paragraph retrieval there, ``--max_words 64 --max_frames 64``
CLIP4CLIP_DATASET_ARGS: dict[str, dict[str, int]] = {"didemo": {"n_frames": 64, "max_text_tokens": 64}}


def dataset_model_args(model: str, dataset: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """CLIP4Clip's settings for ``dataset`` that ``args`` leaves unset, for the CLIP-based models; else none."""
    if model not in RETRIEVAL_MODELS or RETRIEVAL_MODELS.canonical(model) not in ("clip", "fusion"):
        return {}
    return {k: v for k, v in CLIP4CLIP_DATASET_ARGS.get(dataset, {}).items() if k not in args}


def create_retrieval_model(name: str, args: str | Mapping[str, Any] | None = None) -> RetrievalModel:
    """Build ``--model name --model-args args`` from the retrieval registry."""
    if not name:
        raise UserError("--model is empty; pick one of: " + ", ".join(RETRIEVAL_MODELS.names()))
    return RETRIEVAL_MODELS.create(name, args)


@RETRIEVAL_MODELS.register("clip", aliases=("clip4clip-meanp",))
class ClipRetrieval(RetrievalModel):
    """Zero-shot CLIP video retrieval, CLIP4Clip meanP pooling (any transformers CLIP checkpoint).

    The defaults are CLIP4Clip's MSR-VTT settings (``--max_frames 12
    --max_words 32 --slice_framepos 2``, 1 frame per second); CLIP4Clip runs
    CLIP in float16 (``dtype=float16``), the default here is float32 so that
    CPU runs work everywhere.
    """

    name = "clip"

    def __init__(self, pretrained: str = "openai/clip-vit-base-patch32", n_frames: int = 12,
                 frame_sampling: str = "clip4clip", max_text_tokens: int = 32, dtype: str = "float32",
                 batch_size: int = 64, device: str | None = None, revision: str | None = None,
                 local_files_only: bool = False, offline: bool = False, cache: bool = True):
        if n_frames < 1:
            raise UserError(f"model argument n_frames={n_frames} must be at least 1")
        if frame_sampling not in FRAME_SAMPLINGS:
            raise UserError(f"model argument frame_sampling={frame_sampling} is not one of "
                            f"{', '.join(FRAME_SAMPLINGS)}")
        self.pretrained = pretrained
        self.n_frames = n_frames
        self.frame_sampling = frame_sampling
        self.encoder = ClipEncoder(pretrained, revision=revision, device=device, batch_size=batch_size,
                                   local_files_only=local_files_only or offline, dtype=dtype)
        if not 2 <= max_text_tokens <= self.encoder.context_length:
            raise UserError(f"model argument max_text_tokens={max_text_tokens} must be between 2 and the "
                            f"checkpoint's context of {self.encoder.context_length} tokens")
        self.max_text_tokens = max_text_tokens
        # text is not cached, so max_text_tokens stays out of the video cache key (it is in fingerprint())
        self.cache = EmbeddingCache({"kind": "clip-meanP", "checkpoint": self.encoder.fingerprint,
                                     "n_frames": n_frames, "frame_sampling": frame_sampling,
                                     "dtype": self.encoder.dtype}, enabled=cache)
        #: videos decoded and encoded by this instance (cache misses), for logs and tests
        self.videos_encoded = 0

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name, "pooling": "meanP", "n_frames": self.n_frames,
                "frame_sampling": self.frame_sampling, "max_text_tokens": self.max_text_tokens,
                "dtype": self.encoder.dtype, "checkpoint": self.encoder.fingerprint}

    def embed_captions(self, captions: Sequence[str]) -> np.ndarray:
        return self.encoder.text(captions, self.max_text_tokens)

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
            key = self.cache.key(item.video_path)
            hit = self.cache.get(key)
            if hit is not None:
                out[row] = hit
                continue
            frames = sample_frames(item.video_path, self.n_frames, self.frame_sampling)
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


@RETRIEVAL_MODELS.register("fusion", aliases=("score-fusion",))
class ScoreFusionBaseline(RetrievalModel):
    """Our score-level fusion baseline (not SAVE's learned model): CLIP frames + transcript + CLAP audio scores.

    ``s = w_video z_frames + w_transcript z_transcript + w_audio z_audio``, each
    ``z`` a cosine z-scored per caption over the videos that have that part
    (``normalise=zscore``; ``none`` sums raw cosines, kept to measure the bias
    that causes). The defaults (1, 0.5, 0.5) are ours, not tuned on anything.
    """

    name = "fusion"

    def __init__(self, pretrained: str = "openai/clip-vit-base-patch32", clap: str | None = None,
                 w_video: float = 1.0, w_transcript: float = 0.5, w_audio: float | None = None,
                 normalise: str = "zscore", n_frames: int = 12, frame_sampling: str = "clip4clip",
                 max_text_tokens: int = 32, dtype: str = "float32", batch_size: int = 64,
                 device: str | None = None, local_files_only: bool = False, offline: bool = False,
                 cache: bool = True):
        if w_audio is not None and w_audio > 0 and clap is None:
            raise UserError(f"model argument w_audio={w_audio} needs an audio-text model: add "
                            "clap=laion/clap-htsat-unfused (or a local CLAP folder) to --model-args")
        if normalise not in NORMALISATIONS:
            raise UserError(f"model argument normalise={normalise} is not one of {', '.join(NORMALISATIONS)}")
        self.weights = {"video": float(w_video), "transcript": float(w_transcript),
                        "audio": float(0.0 if clap is None else (0.5 if w_audio is None else w_audio))}
        bad = [f"w_{k}={v}" for k, v in self.weights.items() if v < 0]
        if bad or not any(self.weights.values()):
            raise UserError(f"fusion weights must be >= 0 and not all 0, got {', '.join(bad) or 'all 0'}")
        self.normalise = normalise
        self.clip = ClipRetrieval(pretrained, n_frames=n_frames, frame_sampling=frame_sampling,
                                  max_text_tokens=max_text_tokens, dtype=dtype, batch_size=batch_size,
                                  device=device, local_files_only=local_files_only, offline=offline, cache=cache)
        self.clap = None
        self.audio_cache = None
        if clap is not None:
            self.clap = ClapEncoder(clap, device=device, local_files_only=local_files_only or offline)
            self.audio_cache = EmbeddingCache({"kind": "clap-audio", "checkpoint": self.clap.fingerprint,
                                               "centre_crop_samples": self.clap.max_samples}, enabled=cache)

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "score-level fusion baseline (ours; not SAVE's learned model)",
                "weights": self.weights, "normalise": self.normalise, "video": self.clip.fingerprint(),
                "audio": None if self.clap is None else self.clap.fingerprint}

    def scoring(self) -> str:
        parts = [f"{w:g} x {k}" for k, w in self.weights.items() if w]
        return f"score-level fusion baseline (ours, not SAVE): {' + '.join(parts)}; {NORMALISATIONS[self.normalise]}"

    def embed_captions(self, captions: Sequence[str]) -> np.ndarray:
        """[CLIP text | CLAP text]: the caption in each space, unweighted (weights apply in :meth:`score_vectors`)."""
        parts = [self.clip.embed_captions(captions)]
        if self.clap is not None:
            parts.append(self.clap.text(captions))
        return np.concatenate(parts, axis=1).astype(np.float32)

    def embed_videos(self, items: Sequence[VideoItem]) -> np.ndarray:
        """[frames | transcript | audio], zero where a video lacks that part."""
        parts = [self.clip.embed_videos(items), self._transcripts(items)]
        if self.clap is not None:
            parts.append(self._audio(items))
        return np.concatenate(parts, axis=1)

    def modalities(self, caption_emb: np.ndarray, video_emb: np.ndarray) -> list[Modality]:
        """The concatenated embeddings split back into their parts."""
        d = self.clip.encoder.dim
        clip_text = caption_emb[:, :d]
        parts = [Modality("video", self.weights["video"], clip_text, video_emb[:, :d]),
                 Modality("transcript", self.weights["transcript"], clip_text, video_emb[:, d:2 * d])]
        if self.clap is not None:
            parts.append(Modality("audio", self.weights["audio"], caption_emb[:, d:], video_emb[:, 2 * d:]))
        return parts

    def score_vectors(self, caption_emb: np.ndarray, video_emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return fusion_vectors(self.modalities(caption_emb, video_emb), self.normalise)

    def _transcripts(self, items: Sequence[VideoItem]) -> np.ndarray:
        """Transcripts in CLIP's text space, cut at the checkpoint's full context (they are not captions)."""
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
