"""From the evaluator's ``doc_id#clip`` image references to keyframe images.

A document names its clips' frames with the CompAct fields ``video_id``,
``participant_id``, ``start_frames`` and ``stop_frames`` (one entry per
clip, EK-100 1-based frame numbers; ``video_id``/``participant_id`` may also
be lists, one per clip). The task's ``media`` section says where frames
live and how a keyframe is picked (see :mod:`mmcomp_eval.media.keyframes`).

:meth:`TaskMedia.materialise` runs when a task is prepared, before the
model is asked anything: every image of every prompt (queries *and* their
few-shot examples, for every seed) is made into a cached keyframe, so that a
broken video costs seconds, not a GPU hour. A document whose prompt needs a
frame that cannot be read is an error for that document: with
``on_error: stop`` the run stops with one line naming the document and the
file; with ``on_error: skip`` the document is left out of every seed and
listed (with the reason) in the results.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.media.cache import KeyframeCache, load_image
from mmcomp_eval.media.keyframes import build_strategy, resize_short_side
from mmcomp_eval.media.sources import FrameSource, locate
from mmcomp_eval.media.video import DECODES, MediaError

if TYPE_CHECKING:
    from mmcomp_eval.api.request import GenerationRequest
    from mmcomp_eval.config.task_config import MediaConfig, TaskConfig

#: used for both frames and videos when a task's media section names neither
MEDIA_DIR_ENV = "MMCOMP_MEDIA_DIR"
ON_ERROR = ("stop", "skip")


def _root(value: str | None, base: Path | None) -> Path | None:
    if not value:
        return None
    p = Path(os.path.expandvars(os.path.expanduser(value)))
    if not p.is_absolute() and base is not None:
        p = base / p
    if "$" in str(p):
        raise UserError(f"media root {value!r} names an environment variable that is not set")
    return p


class KeyframeResolver:
    """Makes (or finds in the cache) the keyframe of one clip of one document."""

    def __init__(self, media: MediaConfig, base_dir: Path | None = None, cache: KeyframeCache | None = None):
        self.frames_root = _root(media.frames_root, base_dir)
        self.videos_root = _root(media.videos_root, base_dir)
        if self.frames_root is None and self.videos_root is None and os.environ.get(MEDIA_DIR_ENV):
            self.frames_root = self.videos_root = Path(os.environ[MEDIA_DIR_ENV]).expanduser()
        if self.frames_root is None and self.videos_root is None:
            raise UserError(f"the task's media section names no frames_root or videos_root and ${MEDIA_DIR_ENV} "
                            "is not set; say where the EK-100 frames or videos are")
        for label, root in (("frames_root", self.frames_root), ("videos_root", self.videos_root)):
            if root is not None and not root.is_dir():
                raise UserError(f"media {label} {root} is not a folder")
        if media.on_error not in ON_ERROR:
            raise UserError(f"media on_error {media.on_error!r} is not one of {', '.join(ON_ERROR)}")
        if media.resize < 0:
            raise UserError(f"media resize {media.resize} must be 0 (keep) or a positive shorter-side length")
        self.media = media
        self.strategy = build_strategy(media.keyframe, dict(media.keyframe_options))
        self.cache = cache or KeyframeCache()
        self._sources: dict[tuple[str, str], FrameSource | MediaError] = {}

    def keyframe(self, doc: Document, clip: int) -> Path:
        video, participant, start, stop = _clip_fields(doc, clip)
        source = self._source(video, participant)
        numbers = self.strategy.frames(start, stop)
        key = KeyframeCache.key(source.identity(numbers), numbers, self.strategy.describe(), self.media.resize)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        images = [resize_short_side(im, self.media.resize) for im in source.read(numbers)]
        return self.cache.put(key, self.strategy.combine(images))

    def _source(self, video: str, participant: str | None) -> FrameSource:
        k = (video, participant or "")
        if k not in self._sources:
            try:
                self._sources[k] = locate(video, participant, self.frames_root, self.videos_root)
            except MediaError as exc:
                self._sources[k] = exc
        found = self._sources[k]
        if isinstance(found, MediaError):
            raise found
        return found


def _clip_fields(doc: Document, clip: int) -> tuple[str, str | None, int, int]:
    def get(name: str, per_clip: bool):
        if name not in doc.fields:
            raise MediaError(f"document {doc.id} has no field '{name}' (needed to find the frames of clip {clip})")
        value = doc.fields[name]
        if isinstance(value, (list, tuple)):
            if not 0 <= clip < len(value):
                raise MediaError(f"document {doc.id}: clip {clip} is out of range ('{name}' has {len(value)})")
            return value[clip]
        if per_clip:
            raise MediaError(f"document {doc.id}: field '{name}' must be a list with one entry per clip")
        return value

    video = str(get("video_id", False))
    participant = doc.fields.get("participant_id")
    if isinstance(participant, (list, tuple)):
        participant = get("participant_id", True)
    try:
        start, stop = int(get("start_frames", True)), int(get("stop_frames", True))
    except (TypeError, ValueError):
        raise MediaError(f"document {doc.id}: start/stop frame of clip {clip} are not integers") from None
    if start < 1 or stop < start:
        raise MediaError(f"document {doc.id}: clip {clip} has frames [{start}, {stop}]; expected 1 <= start <= stop")
    return video, (str(participant) if participant else None), start, stop


@dataclass
class TaskMedia:
    """A prepared task's keyframes (reference -> cached file) and its skipped documents."""

    keyframes: dict[str, Path] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)   # query doc id -> reason
    stats: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def resolver(task: TaskConfig) -> KeyframeResolver:
        """The task's keyframe resolver: a missing media section or folder fails here, before any decoding."""
        if task.media is None:
            raise UserError(f"task {task.task} puts images in its prompts but has no 'media' section saying where "
                            "the frames are; add one, or run the model with images=false (text only)")
        try:
            return KeyframeResolver(task.media, Path(task.source).parent if task.source else None)
        except UserError as exc:
            raise UserError(f"task {task.task}: {exc}") from None

    @classmethod
    def materialise(cls, task: TaskConfig, docs: Sequence[Document], pool: Sequence[Document],
                    prompts: Mapping[int, Sequence], progress: bool = False) -> TaskMedia:
        resolver = cls.resolver(task)
        by_id = {d.id: d for d in pool}
        by_id.update((d.id, d) for d in docs)
        out = cls()
        failed: dict[str, str] = {}
        frames_before = DECODES.frames
        refs = [(d.id, ref) for ps in prompts.values() for d, p in zip(docs, ps) for ref in p.images]
        for query_id, ref in tqdm(refs, desc=f"{task.task} keyframes", disable=not progress, unit="img"):
            key = f"{ref.doc_id}#{ref.clip}"
            if key not in out.keyframes and key not in failed:
                try:
                    out.keyframes[key] = resolver.keyframe(by_id[ref.doc_id], ref.clip)
                except MediaError as exc:
                    failed[key] = str(exc)
            if key in failed:
                reason = failed[key] if ref.doc_id == query_id else f"few-shot example {ref.doc_id}: {failed[key]}"
                if task.media.on_error == "stop":
                    raise UserError(f"task {task.task}, document {query_id}: {reason} "
                                    "(set media.on_error: skip to leave such documents out)")
                out.skipped.setdefault(query_id, reason)
        out.stats = {"keyframes": len(out.keyframes), "cache_hits": resolver.cache.hits,
                     "cache_misses": resolver.cache.misses, "frames_decoded": DECODES.frames - frames_before,
                     "strategy": resolver.strategy.describe(), "resize": task.media.resize}
        return out

    def images_for(self, requests: Sequence[GenerationRequest]) -> RequestImages:
        return RequestImages(self.keyframes, [r.images for r in requests])

    def record(self) -> dict:
        """What the results file says about this task's media."""
        return {"n_skipped": len(self.skipped),
                "skipped": [{"doc_id": k, "reason": v} for k, v in self.skipped.items()],
                "media": self.stats}


class RequestImages(Sequence):
    """The images of each request, loaded from the keyframe cache only when a batch asks for them.

    ``images[i]`` is the list of request ``i``'s images in prompt order, so a
    model never holds more than a batch's images in memory.
    """

    def __init__(self, keyframes: Mapping[str, Path], refs: Sequence[Sequence[str]]):
        self._keyframes = keyframes
        self._refs = list(refs)

    def __len__(self) -> int:
        return len(self._refs)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return [load_image(self._keyframes[r]) for r in self._refs[i]]

    def refs(self, i: int) -> tuple[str, ...]:
        return tuple(self._refs[i])

    def keyframe_ids(self, i: int) -> list[str]:
        """Request ``i``'s keyframe cache keys: they name the source, frames, strategy and resize.

        Response caches key image requests on these instead of hashing pixels.
        """
        return [self._keyframes[r].stem for r in self._refs[i]]
