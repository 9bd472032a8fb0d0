"""CLAP, the audio-text tower of the ``fusion`` baseline, and reading a file's audio track.

Audio is decoded with PyAV to mono at the extractor's rate; long audio is
centre-cropped to the extractor's ``max_length_s`` (CLAP's own truncation is
random; this is deterministic). Captions are cut at the text tower's position
limit, whatever the tokenizer claims (see :func:`clap_text_limit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmcomp_eval.errors import UserError
from mmcomp_eval.media.video import MediaError
from mmcomp_eval.models.clip import load_checkpoint
from mmcomp_eval.models.embedding import EmbeddingOptions, batched, checkpoint_fingerprint, l2norm
from mmcomp_eval.models.loading import resolve_pretrained


def decode_audio(path: Path, sampling_rate: int) -> np.ndarray | None:
    """The file's first audio stream as mono float32 at ``sampling_rate``; None when it has none."""
    try:
        import av
    except ImportError:
        raise UserError("reading audio needs PyAV: pip install av") from None

    if not path.is_file():
        raise MediaError(f"audio file {path} does not exist")
    try:
        container = av.open(str(path), mode="r")
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"audio file {path} cannot be opened: {' '.join(str(exc).split())[:160]}") from None
    try:
        if not container.streams.audio:
            return None
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sampling_rate)
        chunks = []
        try:
            for frame in container.decode(audio=0):
                chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            raise MediaError(f"audio of {path} is corrupt: {' '.join(str(exc).split())[:160]}") from None
    finally:
        container.close()
    wave = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    return wave if wave.size else None


def centre_crop(wave: np.ndarray, n: int) -> np.ndarray:
    """The middle ``n`` samples: CLAP's own truncation of long audio is random, this is not."""
    if wave.size <= n:
        return wave
    start = (wave.size - n) // 2
    return wave[start:start + n]


def clap_text_limit(tokenizer: Any, text_config: Any) -> int:
    """Tokens CLAP's RoBERTa-style text tower can place: positions start after the padding index.

    A tokenizer saved without ``model_max_length`` reports a huge number, and
    truncating to it would let a long caption run past the position table
    (an index error deep in torch); so the model's own limit,
    ``max_position_embeddings - pad_token_id - 1`` (512 for laion/clap), caps it.
    """
    positions = int(text_config.max_position_embeddings)
    pad = getattr(text_config, "pad_token_id", None)
    model_limit = positions - (int(pad) + 1 if pad is not None else 0)
    return min(int(tokenizer.model_max_length), model_limit)


class ClapEncoder:
    """A transformers CLAP checkpoint (``ClapModel``): captions and audio into its joint space."""

    def __init__(self, pretrained: str, options: EmbeddingOptions, batch_size: int = 16, arg: str = "clap"):
        from transformers import AutoFeatureExtractor, AutoTokenizer, ClapModel

        self.source = resolve_pretrained(pretrained)
        hub = options.hub_kwargs()
        self.model = load_checkpoint(pretrained, arg, lambda: ClapModel.from_pretrained(self.source, **hub))
        self.tokenizer = load_checkpoint(pretrained, arg, lambda: AutoTokenizer.from_pretrained(self.source, **hub))
        self.extractor = load_checkpoint(pretrained, arg,
                                         lambda: AutoFeatureExtractor.from_pretrained(self.source, **hub))
        device = options.target_device()
        if device is not None:
            self.model.to(device)
        self.model.eval()
        self.device = self.model.device
        self.batch_size = batch_size
        self.sampling_rate = int(self.extractor.sampling_rate)
        self.max_samples = int(self.extractor.nb_max_samples)
        self.dim = int(self.model.config.projection_dim)
        self.max_text_tokens = clap_text_limit(self.tokenizer, self.model.config.text_config)
        self.fingerprint = {**checkpoint_fingerprint(self.source, self.model, None),
                            "centre_crop_samples": self.max_samples, "sampling_rate": self.sampling_rate}

    def text(self, texts: Sequence[str]) -> np.ndarray:
        """Caption embeddings, each cut to the text tower's position limit (longer text would not fit it)."""
        def encode(batch: list[str]):
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_text_tokens,
                                 return_tensors="pt").to(self.device)
            return self.model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])

        feats = batched(texts, self.batch_size, self.dim, encode)
        return l2norm(feats, "a CLAP text embedding") if len(feats) else feats

    def audio(self, waves: Sequence[np.ndarray]) -> np.ndarray:
        def encode(batch: list[np.ndarray]):
            cropped = [centre_crop(w, self.max_samples) for w in batch]
            inputs = self.extractor(cropped, sampling_rate=self.sampling_rate, return_tensors="pt")
            return self.model.get_audio_features(**{k: v.to(self.device) for k, v in inputs.items()})

        feats = batched(waves, self.batch_size, self.dim, encode)
        return l2norm(feats, "an audio embedding") if len(feats) else feats
