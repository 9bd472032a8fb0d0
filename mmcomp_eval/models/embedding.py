"""The base of retrieval models: captions and gallery videos into one joint space (``embed``).

A retrieval model answers :class:`~mmcomp_eval.api.request.EmbeddingRequest`
s: a caption (cut to the request's ``max_text_tokens``) or a gallery video
(its precomputed features, else frames sampled as the request says). Scores
are dot products of the answers (see ``output_type: retrieval``); a model
whose scores need the whole gallery maps the stacked answers once more in
:meth:`~mmcomp_eval.api.model.Model.score_vectors`.

What every such model shares lives here: the loading options of the local
adapters (:class:`~mmcomp_eval.models.local.LocalOptions`, with CLIP's
defaults), the embedding loop that reports each answer as it is finished (so
the response store keeps it even if the run dies on the next batch), and the
arithmetic of CLIP4Clip's meanP pooling and of precomputed feature files.
Every vector returned is float32 and L2-normalised, so a dot product of two is
a cosine. torch and transformers are imported inside functions.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from mmcomp_eval.api.model import Model, ModelCapabilities, ProgressCallback, ResultCallback
from mmcomp_eval.api.request import EmbeddingRequest, VideoInputs
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.local import LocalOptions

#: ``dtype`` spellings CLIP users know (CLIP4Clip's ``fp16``), mapped to the names every local adapter takes
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
#: an answer is ready: ``report(i, vector)`` for the ``i``-th item of the call
Report = Callable[[int, np.ndarray], None]


@dataclass(frozen=True)
class EmbeddingOptions(LocalOptions):
    """The local adapters' loading options with a retrieval model's defaults.

    ``dtype`` defaults to float32 so that CPU runs work everywhere
    (CLIP4Clip runs CLIP in float16: ``dtype=float16``, also spelt ``fp16``);
    ``batch_size`` counts texts or frames per forward pass and is a number
    (there is no generation to size automatically).
    """

    dtype: str = "float32"
    batch_size: int | str = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        if self.dtype == "auto":
            raise UserError("model argument dtype=auto: name one of float32, float16, bfloat16 for a retrieval model")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise UserError(f"model argument dtype={self.dtype} is not one of float32, float16, bfloat16 "
                            "(or fp32, fp16, bf16)")
        super().__post_init__()
        if self.batch_size == "auto":
            raise UserError("model argument batch_size=auto: retrieval models take a number of texts or frames "
                            "per forward pass")


class EmbeddingModel(Model):
    """A model that embeds captions and videos; subclasses say how (:meth:`embed_texts`, :meth:`embed_videos`)."""

    capabilities = ModelCapabilities(generate=False, embeddings=True, reports_each_result=True)
    options_type: ClassVar[type[LocalOptions]] = EmbeddingOptions

    def __init__(self, options: Mapping[str, Any]):
        self.options = self.options_type.from_arguments(self.name, options)
        self.batch_size = int(self.options.batch_size)
        #: videos decoded and encoded by this instance (not answered from features), for logs and tests
        self.videos_encoded = 0

    def embed(self, requests: Sequence[EmbeddingRequest], progress: ProgressCallback | None = None,
              on_result: ResultCallback | None = None) -> list[np.ndarray]:
        """One vector per request; captions in batches per text length, then videos, each reported when done."""
        out: list[np.ndarray | None] = [None] * len(requests)

        def finished(rows: Sequence[int]) -> Report:
            def report(j: int, vector: np.ndarray) -> None:
                out[rows[j]] = vector
                if on_result:
                    on_result(rows[j], vector)
                if progress:
                    progress(1)
            return report

        texts: dict[int | None, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            if r.text is not None:
                texts[r.max_text_tokens].append(i)
        for max_tokens, rows in texts.items():
            report = finished(rows)
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start:start + self.batch_size]
                for j, vector in enumerate(self.embed_texts([requests[i].text for i in chunk], max_tokens)):
                    report(start + j, vector)
        videos = [i for i, r in enumerate(requests) if r.video is not None]
        if videos:
            self.embed_videos([requests[i].video for i in videos], finished(videos))
        return out  # type: ignore[return-value]

    @abstractmethod
    def embed_texts(self, texts: Sequence[str], max_tokens: int | None) -> np.ndarray:
        """(len(texts), d) caption embeddings, each text cut to ``max_tokens`` tokens (None: the model's context)."""

    @abstractmethod
    def embed_videos(self, videos: Sequence[VideoInputs], report: Report) -> None:
        """Embed each video, calling ``report(j, vector)`` for ``videos[j]`` as soon as it is done."""

    def similarity(self) -> str:
        return "cosine of the caption and video embeddings"


# -- arithmetic shared by every retrieval model --------------------------------------------------------------


def l2norm(x: np.ndarray, what: str) -> np.ndarray:
    """Normalise rows (or a vector); a zero row has no direction and is an error, not NaN."""
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    if np.any(n == 0) or not np.all(np.isfinite(n)):
        raise UserError(f"{what} is all zeros or not finite; it cannot be normalised (check the file or model)")
    return (x / n).astype(np.float32)


def mean_pool(frames: np.ndarray, what: str) -> np.ndarray:
    """CLIP4Clip meanP: normalise each frame, average, normalise the average."""
    return l2norm(l2norm(frames, what).mean(axis=0), what)


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


def batched(items: Sequence, batch_size: int, dim: int, encode: Callable[[list], Any]) -> np.ndarray:
    """Run ``encode`` (a list -> feature tensor) over ``items`` in batches, without gradients.

    transformers 4 returns a tensor from ``get_*_features``, 5 an output whose
    ``pooler_output`` is the projected embedding; both are read. An empty
    input gives a (0, dim) array so callers need no special case.
    """
    import torch

    out = []
    for i in range(0, len(items), batch_size):
        with torch.inference_mode():
            feats = encode(list(items[i:i + batch_size]))
        feats = feats if hasattr(feats, "shape") else feats.pooler_output
        out.append(feats.float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, dim), dtype=np.float32)


def reduced_precision_guard(dtype: str, device: Any, run: Callable[[], Any]) -> Any:
    """Run a forward pass; an op this torch cannot run in ``dtype`` on ``device`` becomes one line."""
    try:
        return run()
    except RuntimeError as exc:
        if dtype == "float32" or not any(k in str(exc) for k in ("Half", "BFloat16", "bfloat16", "float16")):
            raise
        reason = " ".join(str(exc).split())[:160]
        raise UserError(f"model argument dtype={dtype} is not supported on {device} by this torch ({reason}); "
                        "use dtype=float32 (or dtype=bfloat16 on CPU), or run on a GPU") from None


def checkpoint_fingerprint(source: str, model: Any, revision: str | None) -> dict[str, Any]:
    """Identity of loaded weights: a local folder's file listing (names, sizes, mtimes), or the Hub commit."""
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
