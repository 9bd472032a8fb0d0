"""The towers retrieval models are built from: CLIP (text, frames) and CLAP (text, audio).

Kept apart from :mod:`mmcomp_eval.retrieval.models` so that the models only
decide *what* to embed and how to combine it, while this module knows *how*
a transformers checkpoint is loaded and run. torch and transformers are
imported inside functions so that importing the package stays cheap.

Every embedding returned here is float32 and L2-normalised, so a dot product
is a cosine similarity.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from mmcomp_eval.errors import UserError
from mmcomp_eval.media.video import MediaError

if TYPE_CHECKING:
    from PIL import Image

T = TypeVar("T")


def l2norm(x: np.ndarray, what: str) -> np.ndarray:
    """Normalise rows (or a vector); a zero row has no direction and is an error, not NaN."""
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    if np.any(n == 0) or not np.all(np.isfinite(n)):
        raise UserError(f"{what} is all zeros or not finite; it cannot be normalised (check the file or model)")
    return (x / n).astype(np.float32)


def mean_pool(frames: np.ndarray, what: str) -> np.ndarray:
    """CLIP4Clip meanP: normalise each frame, average, normalise the average."""
    return l2norm(l2norm(frames, what).mean(axis=0), what)


def load_guard(arg: str, what: str, load: Callable[[], T]) -> T:
    """Run a checkpoint load; 'not available' becomes one line saying how to provide it."""
    try:
        return load()
    except (OSError, ValueError) as exc:  # missing files, offline Hub, not a checkpoint folder
        reason = " ".join(str(exc).split())
        reason = reason[:180] + ("..." if len(reason) > 180 else "")
        raise UserError(
            f"cannot load checkpoint '{what}': {reason} -- give a local copy with --model-args {arg}=/local/folder, "
            f"or fetch it where there is network with `hf download {what}` (or `huggingface-cli download {what}`)"
        ) from None


def resolve_source(arg: str, pretrained: str) -> str:
    """A local folder, checked to exist, or a Hub id left to transformers."""
    path = Path(pretrained).expanduser()
    if path.exists():
        return str(path.resolve())
    if pretrained.startswith(("/", ".", "~")) or pretrained.count("/") > 1:
        raise UserError(f"model argument {arg}={pretrained}: no such folder")
    return pretrained


def checkpoint_fingerprint(source: str, model: Any, revision: str | None) -> dict[str, Any]:
    """Identity of loaded weights: a local folder's file listing, or the Hub commit."""
    fp: dict[str, Any] = {"source": source, "revision": revision, "class": type(model).__name__}
    path = Path(source)
    if path.is_dir():
        h = hashlib.sha256()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            st = f.stat()
            h.update(f"{f.relative_to(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        fp["files"] = h.hexdigest()
    else:
        fp["commit"] = getattr(model.config, "_commit_hash", None)
    return fp


def _pooled(out: Any):
    """transformers 4 returns a tensor from get_*_features, 5 an output whose pooler_output is projected."""
    return out if hasattr(out, "shape") else out.pooler_output


def _batched(items: Sequence, batch_size: int, dim: int, encode: Callable[[list], Any]) -> np.ndarray:
    """Run ``encode`` (a list -> feature tensor) over ``items`` in batches, without gradients.

    All four encoders (CLIP text and frames, CLAP text and audio) batch the same
    way; an empty input gives a (0, dim) array so callers need no special case.
    """
    import torch

    out = []
    for i in range(0, len(items), batch_size):
        with torch.inference_mode():
            feats = _pooled(encode(list(items[i:i + batch_size])))
        out.append(feats.float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, dim), dtype=np.float32)


def _device(device: str | None):
    from mmcomp_eval.models.loading import resolve_device

    return resolve_device(device)


#: ``dtype`` model argument -> torch dtype name; CLIP4Clip casts CLIP's weights to float16 (``convert_weights``)
DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


def canonical_dtype(name: str, arg: str = "dtype") -> str:
    """``fp16`` -> ``float16`` etc.; one line naming the choices otherwise."""
    if name not in DTYPES:
        raise UserError(f"model argument {arg}={name} is not one of float32, float16, bfloat16 "
                        "(or fp32, fp16, bf16)")
    return DTYPES[name]


def _reduced_precision_guard(dtype: str, device: Any, run: Callable[[], T]) -> T:
    """Run a forward pass; an op this torch cannot run in ``dtype`` on ``device`` becomes one line."""
    try:
        return run()
    except RuntimeError as exc:
        if dtype == "float32" or not any(k in str(exc) for k in ("Half", "BFloat16", "bfloat16", "float16")):
            raise
        reason = " ".join(str(exc).split())[:160]
        raise UserError(f"model argument dtype={dtype} is not supported on {device} by this torch ({reason}); "
                        "use dtype=float32 (or dtype=bfloat16 on CPU), or run on a GPU") from None


class ClipEncoder:
    """A transformers CLIP checkpoint: captions and frames into its joint space.

    ``dtype`` is the precision of the weights and activations (CLIP4Clip runs
    CLIP in float16); embeddings are returned as float32 whatever it is.
    """

    def __init__(self, pretrained: str, *, revision: str | None = None, device: str | None = None,
                 local_files_only: bool = False, batch_size: int = 64, dtype: str = "float32",
                 arg: str = "pretrained"):
        import torch
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

        if batch_size < 1:
            raise UserError(f"model argument batch_size={batch_size} must be at least 1")
        self.dtype = canonical_dtype(dtype)
        self.source = resolve_source(arg, pretrained)
        kw = {"revision": revision, "local_files_only": local_files_only}
        self.model = load_guard(arg, pretrained, lambda: CLIPModel.from_pretrained(self.source, **kw))
        self.tokenizer = load_guard(arg, pretrained, lambda: AutoTokenizer.from_pretrained(self.source, **kw))
        self.processor = load_guard(arg, pretrained,
                                    lambda: AutoImageProcessor.from_pretrained(self.source, **kw))
        self.torch_dtype = getattr(torch, self.dtype)
        self.model.eval().to(_device(device), dtype=self.torch_dtype)
        self.device = self.model.device
        self.batch_size = batch_size
        self.dim = int(self.model.config.projection_dim)
        #: the checkpoint's text context in tokens, start and end tokens included (77 for OpenAI CLIP)
        self.context_length = min(int(self.tokenizer.model_max_length),
                                  int(self.model.config.text_config.max_position_embeddings))
        self.fingerprint = checkpoint_fingerprint(self.source, self.model, revision)

    def text(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        """Caption (or transcript) embeddings, each text cut to ``max_tokens`` tokens (default: the context).

        The count includes the start and end tokens, like CLIP4Clip's
        ``max_words`` (32 on MSR-VTT: the start token, 30 word pieces, the end token).
        """
        limit = self.context_length if max_tokens is None else max_tokens

        def encode(batch: list[str]):
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=limit,
                                 return_tensors="pt").to(self.device)
            return _reduced_precision_guard(self.dtype, self.device, lambda: self.model.get_text_features(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]))

        feats = _batched(texts, self.batch_size, self.dim, encode)
        return l2norm(feats, "a text embedding") if len(feats) else feats

    def frames(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Per-frame image embeddings (not normalised: :func:`mean_pool` does that)."""
        def encode(batch: list[Image.Image]):
            pixels = self.processor(images=batch, return_tensors="pt")["pixel_values"]
            pixels = pixels.to(self.device, dtype=self.torch_dtype)
            return _reduced_precision_guard(self.dtype, self.device,
                                            lambda: self.model.get_image_features(pixel_values=pixels))

        return _batched(images, self.batch_size, self.dim, encode)


def load_feature_file(path: Path, dim: int) -> np.ndarray:
    """A precomputed video feature file (``.npy``/``.npz``): one vector, or one per frame, meanP-pooled.

    The vectors must already live in the checkpoint's joint space (CLIP
    ``image_embeds`` after the visual projection), so their width must equal
    the text embedding width.
    """
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                keys = list(z.files)
                if "features" in keys:
                    arr = z["features"]
                elif len(keys) == 1:
                    arr = z[keys[0]]
                else:
                    raise UserError(f"feature file {path} holds arrays {keys}; name the one to use 'features'")
        else:
            arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"feature file {path} cannot be read as numpy: {' '.join(str(exc).split())[:120]}") from None
    arr = np.asarray(arr, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise UserError(f"feature file {path} has shape {arr.shape}; expected (dim,) or (frames, dim)")
    if arr.shape[1] != dim:
        raise UserError(f"feature file {path} has {arr.shape[1]}-d features but the model's joint space is "
                        f"{dim}-d; extract them with the same checkpoint (after the visual projection)")
    return mean_pool(arr, f"feature file {path}")


# -- audio ----------------------------------------------------------------------


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

    def __init__(self, pretrained: str, *, revision: str | None = None, device: str | None = None,
                 local_files_only: bool = False, batch_size: int = 16, arg: str = "clap"):
        from transformers import AutoFeatureExtractor, AutoTokenizer, ClapModel

        self.source = resolve_source(arg, pretrained)
        kw = {"revision": revision, "local_files_only": local_files_only}
        self.model = load_guard(arg, pretrained, lambda: ClapModel.from_pretrained(self.source, **kw))
        self.tokenizer = load_guard(arg, pretrained, lambda: AutoTokenizer.from_pretrained(self.source, **kw))
        self.extractor = load_guard(arg, pretrained, lambda: AutoFeatureExtractor.from_pretrained(self.source, **kw))
        self.model.eval().to(_device(device))
        self.device = self.model.device
        self.batch_size = batch_size
        self.sampling_rate = int(self.extractor.sampling_rate)
        self.max_samples = int(self.extractor.nb_max_samples)
        self.dim = int(self.model.config.projection_dim)
        self.max_text_tokens = clap_text_limit(self.tokenizer, self.model.config.text_config)
        self.fingerprint = checkpoint_fingerprint(self.source, self.model, revision)

    def text(self, texts: Sequence[str]) -> np.ndarray:
        """Caption embeddings, each cut to the text tower's position limit (longer text would not fit it)."""
        def encode(batch: list[str]):
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_text_tokens,
                                 return_tensors="pt").to(self.device)
            return self.model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])

        feats = _batched(texts, self.batch_size, self.dim, encode)
        return l2norm(feats, "a CLAP text embedding") if len(feats) else feats

    def audio(self, waves: Sequence[np.ndarray]) -> np.ndarray:
        def encode(batch: list[np.ndarray]):
            cropped = [centre_crop(w, self.max_samples) for w in batch]
            inputs = self.extractor(cropped, sampling_rate=self.sampling_rate, return_tensors="pt")
            return self.model.get_audio_features(**{k: v.to(self.device) for k, v in inputs.items()})

        feats = _batched(waves, self.batch_size, self.dim, encode)
        return l2norm(feats, "an audio embedding") if len(feats) else feats
