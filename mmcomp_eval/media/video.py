"""Frames of video files, decoded with PyAV.

Why PyAV rather than decord or torchcodec: PyAV ships manylinux wheels with
FFmpeg bundled (nothing to install system-wide), has no dependency on torch
(torchcodec is built against one torch release and breaks on others; our
torch is pinned by the user), is actively maintained (decord has had no
release since 2021 and no wheels for current Pythons), and exposes
presentation timestamps, which is what frame-accurate seeking needs.

Frame indices are 0-based positions in presentation order. The index of a
decoded frame is computed from its timestamp and the stream's average frame
rate (``round(pts * time_base * fps)``), which is exact for the
constant-frame-rate files EPIC-KITCHENS and most datasets ship; reading a
frame seeks to the nearest keyframe before it and decodes forward, so that a
clip in the middle of an hour-long video costs one GOP, not the whole file.

Every failure to read a file (missing, empty, not a video, index out of
range) is a :class:`MediaError`: one line naming the file, so that the
evaluator can report or skip the document that needs it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from mmcomp_eval.errors import UserError

if TYPE_CHECKING:
    from PIL import Image

#: a forward gap (in frames) beyond which seeking (to the keyframe before the target) beats decoding on;
#: the first frame read from a file is always sought
SEEK_GAP = 60


class MediaError(UserError):
    """A video, frame or frame folder that cannot be read (one line, names the file)."""


class DecodeCounter:
    """How many frames this process decoded from sources (videos and JPEG files).

    The keyframe cache promises that a second run decodes nothing; this
    counter is how that promise is checked (tests, ``--verbose`` logs).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.frames = 0
        self.files_opened = 0

    def add(self, frames: int = 0, files: int = 0) -> None:
        with self._lock:
            self.frames += frames
            self.files_opened += files


DECODES = DecodeCounter()


def _check_file(path: Path) -> None:
    if not path.exists():
        raise MediaError(f"video {path} does not exist")
    if not path.is_file():
        raise MediaError(f"video {path} is not a file")
    if path.stat().st_size == 0:
        raise MediaError(f"video {path} is empty (0 bytes)")


def _open(path: Path):
    import av

    _check_file(path)
    try:
        container = av.open(str(path), mode="r")
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"video {path} cannot be opened: {_reason(exc)}") from None
    if not container.streams.video:
        container.close()
        raise MediaError(f"video {path} has no video stream")
    DECODES.add(files=1)
    return container


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] or type(exc).__name__


def _fps(stream) -> Fraction:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate:
        raise MediaError(f"video stream {stream.container.name} has no frame rate")
    return Fraction(rate)


def _index_of(frame, stream, fps: Fraction, start_pts: int) -> int:
    if frame.pts is None:
        raise MediaError(f"video {stream.container.name} has frames without timestamps")
    return int(round((frame.pts - start_pts) * stream.time_base * fps))


@dataclass(frozen=True)
class VideoInfo:
    """What frame sampling needs to know about a file: its frame count and frame rate."""

    n_frames: int
    fps: Fraction


def probe(path: str | Path) -> VideoInfo:
    """Frame count and average frame rate of the file's first video stream.

    The container's frame count is used when it has one; otherwise (some MP4
    and MKV muxers leave it at 0) the packets are counted, which demuxes but
    does not decode.
    """
    path = Path(path)
    container = _open(path)
    try:
        stream = container.streams.video[0]
        fps = _fps(stream)
        if stream.frames:
            return VideoInfo(int(stream.frames), fps)
        try:
            n = sum(1 for p in container.demux(stream) if p.size)
        except Exception as exc:  # av.error.* and friends: the file is broken
            raise MediaError(f"video {path} cannot be read: {_reason(exc)}") from None
        if n == 0:
            raise MediaError(f"video {path} has no frames")
        return VideoInfo(n, fps)
    finally:
        container.close()


def count_frames(path: str | Path) -> int:
    """Number of video frames in the file (see :func:`probe`)."""
    return probe(path).n_frames


def read_frames(path: str | Path, indices: Sequence[int]) -> list[Image.Image]:
    """The frames at ``indices`` (0-based, any order, repeats allowed), as RGB images.

    Indices are read in ascending order with one forward pass per run of
    nearby indices; the result follows the order of ``indices``.
    """
    path = Path(path)
    if not indices:
        return []
    if any(int(i) < 0 for i in indices):
        raise MediaError(f"video {path}: negative frame index in {list(indices)}")
    wanted = sorted(set(int(i) for i in indices))
    container = _open(path)
    found: dict[int, Image.Image] = {}
    try:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        fps = _fps(stream)
        start_pts = stream.start_time or 0
        pos = None  # index of the last decoded frame; None: nothing decoded yet
        pending = list(wanted)
        while pending:
            target = pending[0]
            if (pos is None and target > 0) or (pos is not None and (target < pos or target - pos > SEEK_GAP)):
                offset = int(start_pts + math.floor(Fraction(target) / fps / stream.time_base))
                container.seek(max(offset, start_pts), stream=stream, backward=True, any_frame=False)
            reached = False
            for frame in _decode(container, stream, path):
                pos = _index_of(frame, stream, fps, start_pts)
                DECODES.add(frames=1)
                while pending and pending[0] <= pos:
                    # a seek can land past a target only if the index is not
                    # in the file's timeline (duplicate/missing timestamps)
                    found[pending.pop(0)] = frame.to_image()
                if not pending or pending[0] - pos > SEEK_GAP:
                    reached = True
                    break
            if not reached and pending:
                if pos is None:
                    raise MediaError(f"video {path}: frame {pending[0]} is past the end of the video")
                raise MediaError(f"video {path} has {pos + 1} frames; frame {pending[0]} was asked for")
    finally:
        container.close()
    return [found[int(i)] for i in indices]


def _decode(container, stream, path: Path):
    import av

    try:
        yield from container.decode(stream)
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"video {path} is corrupt: {_reason(exc)}") from None


def uniform_indices(start: int, stop: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``[start, stop]`` (inclusive), centred in equal segments.

    The centre of each of ``n`` equal segments is used (TSN-style sampling),
    so that ``n = 1`` gives the middle frame and no two picks sit on the clip
    boundary, where cuts and blur are most likely.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if stop < start:
        raise ValueError(f"empty frame range [{start}, {stop}]")
    length = stop - start + 1
    # centre of segment k is at offset (2k+1)L/(2n) - 1/2 (frames are points 0..L-1); round half down so
    # that n = 1 agrees with the "middle" strategy, (start + stop) // 2
    return [start + min(length - 1, max(0, math.ceil((2 * k + 1) * length / (2 * n) - 1))) for k in range(n)]


def clip4clip_indices(n_frames: int, fps: float | Fraction, max_frames: int) -> list[int]:
    """CLIP4Clip's frames: one per second, then ``max_frames`` evenly spaced among them when there are more.

    CLIP4Clip (``RawVideoExtractorCV2`` with ``feature_framerate=1``, then
    ``slice_framepos=2``) reads frame ``k * int(fps)`` for every second ``k``
    while that frame exists, so the stride is the integer part of the frame
    rate as OpenCV reports it (29.97 fps -> every 29th frame). When that gives
    more than ``max_frames`` it keeps ``linspace(0, count - 1, max_frames)``
    of them, rounded down. A short video is never padded: a 10 s clip gives
    10 frames. A frame rate below 1 (where CLIP4Clip's reader fails) takes
    every frame.
    """
    if max_frames < 1:
        raise ValueError(f"max_frames must be at least 1, got {max_frames}")
    if n_frames < 1:
        raise ValueError(f"a video needs at least one frame, got {n_frames}")
    per_second = list(range(0, n_frames, max(1, int(fps))))
    if len(per_second) <= max_frames:
        return per_second
    import numpy as np

    return [per_second[i] for i in np.linspace(0, len(per_second) - 1, num=max_frames, dtype=int)]


#: how a retrieval model picks a video's frames: name -> what it does (see :func:`sample_frames`)
FRAME_SAMPLINGS = {
    "clip4clip": "one frame per second (stride int(fps)), then n evenly spaced (linspace, floored) when there are "
                 "more than n; never padded",
    "uniform": "n frames at the centres of n equal segments of the whole video; short videos repeat frames",
}


def sample_frames(path: str | Path, n: int, sampling: str = "clip4clip") -> list[Image.Image]:
    """Frames of the whole video by ``sampling`` (:data:`FRAME_SAMPLINGS`).

    ``clip4clip`` gives at most ``n`` frames (fewer for videos shorter than
    ``n`` seconds), ``uniform`` exactly ``n``.
    """
    if sampling not in FRAME_SAMPLINGS:
        raise UserError(f"frame sampling {sampling!r} is not one of {', '.join(FRAME_SAMPLINGS)}")
    if n < 1:
        raise MediaError(f"video {path}: asked for {n} frames; expected at least 1")
    info = probe(path)
    if sampling == "uniform":
        return read_frames(path, uniform_indices(0, info.n_frames - 1, n))
    return read_frames(path, clip4clip_indices(info.n_frames, info.fps, n))


def sample_uniform_frames(path: str | Path, n: int) -> list[Image.Image]:
    """``n`` uniformly spaced frames of the whole video (see :func:`uniform_indices`)."""
    return sample_frames(path, n, "uniform")
