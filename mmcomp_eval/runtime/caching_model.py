"""A Model wrapper that answers from the response store and records the rest.

The evaluator never knows whether answers came from the store: it talks to
this wrapper as to any model. Only cache misses reach the inner model, and
each answer is committed the moment the inner model yields it, so a crash
loses at most the requests that were inside the model at the time:

* adapters whose ``generate``/``loglikelihood`` take an ``on_result``
  keyword (the local adapters do, ``models/local.py``) report every finished request;
* for other adapters the misses are sent in chunks of the adapter's
  ``batch_size`` (1 when it has none) and stored after each chunk.

Identical requests within one call are sent once. Values come back from the
store exactly as produced (JSON round-trips Python floats exactly), so a
resumed run scores the very numbers an uninterrupted one would.

Image requests carry ``doc_id#clip`` references, which say nothing about
which keyframe was picked or how it was resized; the request key therefore
adds each image's identity: ``images.keyframe_ids(i)`` when the images
object offers it (content-addressed cache names), else a hash of the pixels.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from mmcomp_eval.errors import UserError

from mmcomp_eval.api.model import Model, ProgressCallback
from mmcomp_eval.api.request import EmbeddingRequest, GenerationRequest, LoglikelihoodRequest
from mmcomp_eval.runtime import vectors
from mmcomp_eval.runtime.response_store import ResponseStore, model_key, request_key

log = logging.getLogger(__name__)

#: model arguments that never change an answer: left out of the key of
#: adapters that do not define their own ``fingerprint``
NON_SEMANTIC_ARGS = frozenset({"batch_size", "max_batch_size", "device", "device_map", "offline",
                               "local_files_only"})


def cache_identity(model: Model, args: dict[str, Any]) -> dict[str, Any]:
    """What identifies ``model``'s answers.

    An adapter that keeps the base class's ``fingerprint`` (just its name)
    would make every checkpoint share answers, so its model arguments are
    added to the identity.
    """
    fp = model.fingerprint()
    if type(model).fingerprint is Model.fingerprint:
        fp = {**fp, "args": {k: v for k, v in sorted(args.items()) if k not in NON_SEMANTIC_ARGS}}
    return fp


#: requests per call for adapters that do not report each answer as it is finished: their answers
#: are stored after every chunk, so a crash loses at most one chunk
UNREPORTED_CHUNK = 32


class CachingModel(Model):
    def __init__(self, inner: Model, store: ResponseStore, identity: dict[str, Any],
                 unreported_chunk: int = UNREPORTED_CHUNK):
        self.inner = inner
        self.unreported_chunk = unreported_chunk
        self.store = store
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.defaults = inner.defaults
        self.model_key = model_key(identity)
        self.hits = 0
        self.misses = 0
        store.register_model(self.model_key, identity)

    def fingerprint(self) -> dict[str, Any]:
        return self.inner.fingerprint()

    def cache_report(self) -> dict[str, Any]:
        """What results.json records under ``cache``."""
        return {"enabled": True, "path": str(self.store.path), "model_key": self.model_key,
                "hits": self.hits, "misses": self.misses}

    def generate(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None,
                 images: Sequence | None = None) -> list[str]:
        return self._answer("generate", requests, progress, self.inner.generate, images)

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest],
                      progress: ProgressCallback | None = None) -> list[list[float]]:
        return self._answer("loglikelihood", requests, progress, self.inner.loglikelihood)

    def embed(self, requests: Sequence[EmbeddingRequest], progress: ProgressCallback | None = None) -> list:
        """Embeddings, stored as :mod:`~mmcomp_eval.runtime.vectors` text and handed back as float32 arrays."""
        def encoded(send, progress=None, on_result=None):
            report = {} if on_result is None else {"on_result": lambda i, v: on_result(i, vectors.encode(v))}
            return [vectors.encode(v) for v in self.inner.embed(send, progress=progress, **report)]

        answers = self._answer("embed", requests, progress, encoded)
        try:
            return [vectors.decode(a) for a in answers]
        except ValueError as exc:
            raise UserError(f"response store {self.store.path}: an embedding of model {self.model_key[:12]}... is "
                            f"damaged ({exc}); move the store away or pick another --cache-dir") from None

    def score_vectors(self, captions, videos):
        return self.inner.score_vectors(captions, videos)

    def similarity(self) -> str:
        return self.inner.similarity()

    def predict_from_documents(self, docs, task):
        return self.inner.predict_from_documents(docs, task)

    def keys(self, kind: str, requests: Sequence, images: Sequence | None = None) -> list[str]:
        if images is None:
            return [request_key(kind, r) for r in requests]
        return [request_key(kind, r, media=_media_ids(images, i)) for i, r in enumerate(requests)]

    def _answer(self, kind: str, requests: Sequence, progress: ProgressCallback | None, call: Callable,
                images: Sequence | None = None) -> list:
        keys = self.keys(kind, requests, images)
        found = self.store.get_many(self.model_key, keys)
        todo: dict[str, int] = {}  # key -> index of its first request
        for i, k in enumerate(keys):
            if k not in found:
                todo.setdefault(k, i)
        self.hits += len(requests) - len(todo)
        log.info("%d of %d answers from the response store, %d to compute", len(requests) - len(todo), len(requests),
                 len(todo))
        if progress and len(requests) > len(todo):
            progress(len(requests) - len(todo))
        if todo:
            send_keys = list(todo)
            send = [requests[todo[k]] for k in send_keys]
            self.misses += len(send)
            extra = {} if images is None else {"images": _Subset(images, [todo[k] for k in send_keys])}
            found.update(self._ask(kind, send_keys, send, progress, call, extra))
        return [found[k] for k in keys]

    def _ask(self, kind: str, keys: list[str], send: list, progress, call: Callable, extra: dict) -> dict[str, Any]:
        out: dict[str, Any] = {}

        def on_result(i: int, value: Any) -> None:
            self.store.put(self.model_key, keys[i], kind, value)
            out[keys[i]] = value

        if self.capabilities.reports_each_result:
            values = call(send, progress=progress, on_result=on_result, **extra)
            for i, v in enumerate(values):  # adapters that report only some results
                if keys[i] not in out:
                    on_result(i, v)
            return out
        size = self.unreported_chunk
        for start in range(0, len(send), size):
            chunk = {k: _Subset(v, range(start, min(start + size, len(send)))) for k, v in extra.items()}
            for j, v in enumerate(call(send[start : start + size], progress=progress, **chunk)):
                on_result(start + j, v)
        return out


def _media_ids(images: Sequence, i: int) -> list[str]:
    ids = getattr(images, "keyframe_ids", None)
    if callable(ids):
        return [str(x) for x in ids(i)]
    out = []
    for im in images[i]:
        h = hashlib.sha256(f"{getattr(im, 'mode', '')}{getattr(im, 'size', '')}".encode())
        h.update(im.tobytes() if hasattr(im, "tobytes") else repr(im).encode())
        out.append(h.hexdigest())
    return out


class _Subset(Sequence):
    """Some rows of a lazily loaded images sequence, without loading the others."""

    def __init__(self, base: Sequence, rows: Sequence[int]):
        self._base = base
        self._rows = list(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._base[self._rows[i]]

    def __getattr__(self, name: str):
        # per-row accessors of the base (``refs(i)``, ``keyframe_ids(i)``), re-indexed
        if name.startswith("_") or name not in ("refs", "keyframe_ids"):
            raise AttributeError(name)
        method = getattr(self._base, name)
        return lambda i: method(self._rows[i])
