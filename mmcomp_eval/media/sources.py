"""Where a video's frames come from: extracted JPEGs (folder or tar) or a video file.

EPIC-KITCHENS-100 as its download script writes it::

    EPIC-KITCHENS/P01/rgb_frames/P01_01.tar     (frames, one tar per video)
    EPIC-KITCHENS/P01/videos/P01_01.MP4         (videos)

Most users untar the frames in place, giving
``P01/rgb_frames/P01_01/frame_0000000001.jpg``. All three are accepted
(folder, tar, video), as are flat trees (``<root>/P01_01/``,
``<root>/P01_01.MP4``) and a root that still has the ``EPIC-KITCHENS``
folder above the participants.

Frame *numbers* here are EK-100's: 1-based, as in ``frame_0000000001.jpg``
and the annotations' ``start_frame``/``stop_frame`` (frames were extracted at
the video's native rate, so number ``k`` is decoded video frame ``k - 1``).

Every source has an ``identity`` (path, size, modification time) so that the
keyframe cache notices a replaced file.
"""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mmcomp_eval.media.video import DECODES, MediaError, read_frames

if TYPE_CHECKING:
    from PIL import Image

FRAME_NAME = "frame_{:010d}.jpg"
VIDEO_SUFFIXES = (".MP4", ".mp4", ".mkv", ".avi", ".webm", ".mov")


def _stat_identity(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


class FrameSource:
    """The frames of one video."""

    kind = "source"

    def __init__(self, path: Path):
        self.path = path

    def identity(self, numbers: Sequence[int]) -> list:
        """What the cache key needs to notice a change in the frames ``numbers``."""
        return [self.kind, *_stat_identity(self.path)]

    def read(self, numbers: Sequence[int]) -> list[Image.Image]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path})"


class FolderFrames(FrameSource):
    """``<video>/frame_0000000001.jpg``, one JPEG per frame."""

    kind = "frames"

    def _frame(self, n: int) -> Path:
        return self.path / FRAME_NAME.format(n)

    def identity(self, numbers: Sequence[int]) -> list:
        out = [self.kind, str(self.path.resolve())]
        for n in numbers:
            frame = self._frame(n)
            if not frame.is_file():
                raise MediaError(f"frame {frame} does not exist{_last_frame_hint(self.path)}")
            out.append(_stat_identity(frame)[1:])
        return out

    def read(self, numbers: Sequence[int]) -> list[Image.Image]:
        out = []
        for n in numbers:
            frame = self._frame(n)
            out.append(_open_jpeg(frame, frame.read_bytes if frame.is_file() else None, str(frame)))
        return out


class TarFrames(FrameSource):
    """EK-100's ``rgb_frames/P01_01.tar`` read in place (members ``./frame_0000000001.jpg``).

    Listing a tar's members reads its headers once; the listing is kept per
    file for the life of the process.
    """

    kind = "tar"
    _members: dict[tuple, dict[str, tarfile.TarInfo]] = {}
    _lock = threading.Lock()

    def _index(self) -> dict[str, tarfile.TarInfo]:
        key = tuple(_stat_identity(self.path))
        with self._lock:
            if key not in self._members:
                try:
                    with tarfile.open(self.path) as tar:
                        self._members[key] = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
                except (tarfile.TarError, OSError) as exc:
                    raise MediaError(f"frame archive {self.path} cannot be read: {exc}") from None
            return self._members[key]

    def identity(self, numbers: Sequence[int]) -> list:
        index = self._index()
        for n in numbers:
            if FRAME_NAME.format(n) not in index:
                raise MediaError(f"frame archive {self.path} has no {FRAME_NAME.format(n)} "
                                 f"({len(index)} frames in it)")
        return super().identity(numbers)

    def read(self, numbers: Sequence[int]) -> list[Image.Image]:
        index = self._index()
        out = []
        with tarfile.open(self.path) as tar:
            for n in numbers:
                name = FRAME_NAME.format(n)
                member = index.get(name)
                if member is None:
                    raise MediaError(f"frame archive {self.path} has no {name}")
                out.append(_open_jpeg(Path(name), lambda m=member: tar.extractfile(m).read(), f"{self.path}:{name}"))
        return out


class VideoFrames(FrameSource):
    """A video file; frame number ``k`` is decoded frame ``k - 1``."""

    kind = "video"

    def identity(self, numbers: Sequence[int]) -> list:
        if not self.path.is_file():
            raise MediaError(f"video {self.path} does not exist")
        return super().identity(numbers)

    def read(self, numbers: Sequence[int]) -> list[Image.Image]:
        if any(n < 1 for n in numbers):
            raise MediaError(f"video {self.path}: frame numbers are 1-based, got {min(numbers)}")
        return read_frames(self.path, [n - 1 for n in numbers])


def _open_jpeg(path: Path, read_bytes, label: str) -> Image.Image:
    from PIL import Image, UnidentifiedImageError

    if read_bytes is None:
        raise MediaError(f"frame {label} does not exist{_last_frame_hint(path.parent)}")
    data = read_bytes()
    if not data:
        raise MediaError(f"frame {label} is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            image = im.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise MediaError(f"frame {label} is not a readable image: {exc}") from None
    DECODES.add(frames=1, files=1)
    return image


def _last_frame_hint(folder: Path) -> str:
    if not folder.is_dir():
        return f" (folder {folder} is missing)"
    frames = sorted(folder.glob("frame_*.jpg"))
    if not frames:
        return f" (folder {folder} holds no frame_*.jpg files)"
    return f" (the folder's frames run {frames[0].name} .. {frames[-1].name})"


def _roots(root: Path) -> list[Path]:
    nested = root / "EPIC-KITCHENS"
    return [root, nested] if nested.is_dir() else [root]


def frame_candidates(root: Path, participant: str, video: str) -> list[tuple[type[FrameSource], Path]]:
    out: list[tuple[type[FrameSource], Path]] = []
    for r in _roots(root):
        for base in (r / participant / "rgb_frames", r / participant, r):
            out.append((FolderFrames, base / video))
            out.append((TarFrames, base / f"{video}.tar"))
    return out


def video_candidates(root: Path, participant: str, video: str) -> list[tuple[type[FrameSource], Path]]:
    return [(VideoFrames, base / f"{video}{suffix}")
            for r in _roots(root) for base in (r / participant / "videos", r / participant, r)
            for suffix in VIDEO_SUFFIXES]


def locate(video: str, participant: str | None, frames_root: Path | None, videos_root: Path | None) -> FrameSource:
    """The frames of ``video``: an extracted-frames folder or tar first, else a video file."""
    participant = participant or video.split("_")[0]
    candidates = []
    if frames_root is not None:
        candidates += frame_candidates(frames_root, participant, video)
    if videos_root is not None:
        candidates += video_candidates(videos_root, participant, video)
    for cls, path in candidates:
        if (cls is FolderFrames and path.is_dir()) or (cls is not FolderFrames and path.is_file()):
            return cls(path)
    where = " or ".join(dict.fromkeys(str(r) for r in (frames_root, videos_root) if r is not None))
    expected = []
    if frames_root is not None:
        expected.append(f"{participant}/rgb_frames/{video}/ (or .tar)")
    if videos_root is not None:
        expected.append(f"{participant}/videos/{video}.MP4")
    raise MediaError(f"no frames for video {video} under {where} (expected {' or '.join(expected)})")
