"""``fusion``: a score-level fusion baseline of our own (not SAVE's learned model): CLIP frames + transcript + CLAP audio.

SAVE learns a speech-aware video encoder; nothing here is trained. The
score is ``w_video z_frames + w_transcript z_transcript + w_audio z_audio``:
the ``clip`` score, the cosine of the caption with the video's speech
transcript (CLIP text tower on both sides) and, when a CLAP checkpoint is
given, with its audio track, each z-scored per caption over the videos that
have that part (:mod:`mmcomp_eval.retrieval.fusion`), so a missing transcript
or audio track neither helps nor hurts a video. The weights (1, 0.5, 0.5) are
ours, not tuned on anything; ``normalise=none`` sums raw cosines, kept only
to measure the bias that causes.

A caption embeds as ``[CLIP text | CLAP text]`` and a video as ``[frames |
transcript | audio]`` (zeros where a video lacks a part), unweighted: the
weights and the normalisation over the gallery apply in :meth:`score_vectors`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmcomp_eval.api.request import VideoInputs
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.clap import ClapEncoder, centre_crop, decode_audio
from mmcomp_eval.models.clip import ClipEncoder, ClipRetrieval
from mmcomp_eval.models.embedding import EmbeddingModel, Report
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.retrieval.fusion import NORMALISATIONS, Modality, fusion_vectors


@MODELS.register("fusion", aliases=("score-fusion",))
class ScoreFusionBaseline(EmbeddingModel):
    """Our score-level fusion baseline (not SAVE's learned model): CLIP frames, transcript and CLAP audio scores."""

    name = "fusion"

    def __init__(self, pretrained: str = "openai/clip-vit-base-patch32", clap: str | None = None,
                 w_video: float = 1.0, w_transcript: float = 0.5, w_audio: float | None = None,
                 normalise: str = "zscore", revision: str | None = None, **options: Any):
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
        super().__init__(options)
        self.normalise = normalise
        self.clip = ClipRetrieval(pretrained, revision, **options)
        self.clap = None if clap is None else ClapEncoder(clap, self.options)

    @property
    def encoder(self) -> ClipEncoder:
        return self.clip.encoder

    def fingerprint(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "score-level fusion baseline (ours; not SAVE's learned model)",
                "weights": self.weights, "normalise": self.normalise, "video": self.clip.fingerprint(),
                "audio": None if self.clap is None else self.clap.fingerprint}

    def similarity(self) -> str:
        parts = [f"{w:g} x {k}" for k, w in self.weights.items() if w]
        return f"score-level fusion baseline (ours, not SAVE): {' + '.join(parts)}; {NORMALISATIONS[self.normalise]}"

    def embed_texts(self, texts: Sequence[str], max_tokens: int | None) -> np.ndarray:
        """[CLIP text | CLAP text]: the caption in each space, unweighted."""
        parts = [self.clip.embed_texts(texts, max_tokens)]
        if self.clap is not None:
            parts.append(self.clap.text(texts))
        return np.concatenate(parts, axis=1).astype(np.float32)

    def embed_videos(self, videos: Sequence[VideoInputs], report: Report) -> None:
        """[frames | transcript | audio], zero where a video lacks that part; reported a batch of videos at a time."""
        step = max(1, self.batch_size)
        for start in range(0, len(videos), step):
            chunk = videos[start:start + step]
            frames = np.zeros((len(chunk), self.encoder.dim), dtype=np.float32)

            def keep(j: int, vector: np.ndarray) -> None:
                frames[j] = vector

            self.clip.embed_videos(chunk, keep)
            parts = [frames, self._transcripts(chunk)]
            if self.clap is not None:
                parts.append(self._audio(chunk))
            for j, row in enumerate(np.concatenate(parts, axis=1)):
                report(start + j, row)

    def modalities(self, captions: np.ndarray, videos: np.ndarray) -> list[Modality]:
        """The concatenated embeddings split back into their parts."""
        d = self.encoder.dim
        clip_text = captions[:, :d]
        parts = [Modality("video", self.weights["video"], clip_text, videos[:, :d]),
                 Modality("transcript", self.weights["transcript"], clip_text, videos[:, d:2 * d])]
        if self.clap is not None:
            parts.append(Modality("audio", self.weights["audio"], captions[:, d:], videos[:, 2 * d:]))
        return parts

    def score_vectors(self, captions: np.ndarray, videos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return fusion_vectors(self.modalities(captions, videos), self.normalise)

    def _transcripts(self, videos: Sequence[VideoInputs]) -> np.ndarray:
        """Transcripts in CLIP's text space, cut at the checkpoint's full context (they are not captions)."""
        out = np.zeros((len(videos), self.encoder.dim), dtype=np.float32)
        rows = [i for i, v in enumerate(videos) if v.transcript and v.transcript.strip()]
        if rows:
            out[rows] = self.encoder.text([videos[i].transcript for i in rows])
        return out

    def _audio(self, videos: Sequence[VideoInputs]) -> np.ndarray:
        """CLAP audio embeddings of each video's audio file, else its video file's track; zeros without audio."""
        assert self.clap is not None
        out = np.zeros((len(videos), self.clap.dim), dtype=np.float32)
        rows, waves = [], []
        for i, v in enumerate(videos):
            source = v.audio or v.video
            wave = None if source is None else decode_audio(Path(source.path), self.clap.sampling_rate)
            if wave is not None:
                rows.append(i)
                waves.append(centre_crop(wave, self.clap.max_samples))
        if rows:
            out[rows] = self.clap.audio(waves)
        return out
