"""Where a retrieval task's gallery videos are: video files, precomputed features, audio, transcripts.

A task's ``retrieval:`` section names folders of files called after the
video ids (``<video_id>.mp4``, ``<video_id>.npy``, ``<video_id>.wav``) and a
transcript file. :func:`resolve_folders` expands them like the CompAct
media roots (relative to the task file, ``~`` and ``$VARS``), and
:func:`gallery_inputs` finds every gallery video's files once, when the task
is prepared, so that a missing file is one line before any model loads.
Each folder is listed once instead of probed per video.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval.api.request import MediaFile, VideoInputs
from mmcomp_eval.errors import UserError
from mmcomp_eval.textfiles import read_text

VIDEO_EXTS = (".mp4", ".avi", ".webm", ".mkv", ".mov", ".m4v", ".mpg", ".mpeg")
FEATURE_EXTS = (".npy", ".npz")
AUDIO_EXTS = (".wav", ".flac", ".mp3", ".m4a", ".aac", ".ogg", ".opus")


@dataclass(frozen=True)
class GalleryFolders:
    """The folders (and transcript file) a task's gallery is read from; None: off."""

    videos: Path | None = None
    features: Path | None = None
    audio: Path | None = None
    transcripts: Path | None = None
    #: settings that are off, with why (``videos_dir: $VAR/msvd (variable unset)``), for errors and results
    off: tuple[str, ...] = ()

    def record(self) -> dict[str, str | None]:
        return {"videos_dir": _text(self.videos), "features_dir": _text(self.features),
                "audio_dir": _text(self.audio), "transcripts": _text(self.transcripts)}


def _text(p: Path | None) -> str | None:
    return None if p is None else str(p)


def expand(value: str | None, base: Path | None) -> Path | None:
    """``~`` and ``$VARS`` expanded, relative to ``base``; None when unset or naming an unset variable."""
    if not value:
        return None
    expanded = os.path.expandvars(os.path.expanduser(value))
    if "$" in expanded:
        return None
    p = Path(expanded)
    return p if p.is_absolute() or base is None else base / p


def resolve_folders(settings, base: Path | None, where: str) -> GalleryFolders:
    """The folders of a ``retrieval:`` section (``settings``: its config) that exist.

    A setting naming an unset variable or a path that does not exist is off,
    so one pair of variables (``$MMCOMP_RETRIEVAL_VIDEOS``,
    ``$MMCOMP_RETRIEVAL_FEATURES``) can serve tasks on several datasets whose
    media the user has in one form or the other; results list what was off
    and why. At least one of ``videos_dir`` and ``features_dir`` must be on,
    and every gallery video must then be found (:func:`gallery_inputs`), so an
    off folder can never shrink a gallery.
    """
    values = {"videos": settings.videos_dir, "features": settings.features_dir, "audio": settings.audio_dir,
              "transcripts": settings.transcripts}
    found: dict[str, Path | None] = {}
    off = []
    for key, value in values.items():
        path = expand(value, base)
        is_file = key == "transcripts"
        if value and path is None:
            off.append(f"{_setting(key)}: {value} (variable unset)")
        elif path is not None and not (path.is_file() if is_file else path.is_dir()):
            off.append(f"{_setting(key)}: {path} (not a {'file' if is_file else 'folder'})")
            path = None
        found[key] = path
    if found["videos"] is None and found["features"] is None:
        media = [o for o in off if o.startswith(("videos_dir", "features_dir"))]
        raise UserError(f"{where}: no gallery media: give retrieval.videos_dir (video files) or retrieval.features_dir "
                        f"(precomputed .npy/.npz per video)" + (f"; {'; '.join(media)}" if media else ""))
    return GalleryFolders(found["videos"], found["features"], found["audio"], found["transcripts"], tuple(off))


def _setting(key: str) -> str:
    return "transcripts" if key == "transcripts" else f"{key}_dir"


def _index_dir(directory: Path, exts: tuple[str, ...]) -> dict[str, Path]:
    """video id (file stem) -> file, for files with one of ``exts``; the first extension in sorted order wins a clash."""
    out: dict[str, Path] = {}
    for p in sorted(directory.iterdir()):
        if p.suffix.lower() in exts and p.is_file():
            out.setdefault(p.stem, p)
    return out


def read_transcripts(path: Path) -> dict[str, str]:
    """A JSON object ``{video_id: transcript}``, or JSONL lines ``{"video_id": ..., "transcript": ...}``."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise UserError(f"transcripts {path}: cannot read ({exc.strerror})") from None
    try:
        obj = json.loads(text)
        if isinstance(obj, dict) and all(isinstance(v, str) for v in obj.values()):
            return obj
    except json.JSONDecodeError:
        pass
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[str(row["video_id"])] = str(row["transcript"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            at = f":{exc.colno} ({exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
            raise UserError(f"transcripts {path}:{n}{at}: expected a JSON object {{video_id: text}} or JSONL rows "
                            '{"video_id": ..., "transcript": ...}') from None
    return out


def gallery_inputs(videos: Sequence[str], folders: GalleryFolders, *, n_frames: int, frame_sampling: str,
                   where: str) -> list[VideoInputs]:
    """Each gallery video's files; a video with neither a feature file nor a video file is an error.

    The gallery is never silently shrunk: a missing video changes every
    metric, so the error names how many are missing and the first one.
    """
    vids = _index_dir(folders.videos, VIDEO_EXTS) if folders.videos else {}
    feats = _index_dir(folders.features, FEATURE_EXTS) if folders.features else {}
    audio = _index_dir(folders.audio, AUDIO_EXTS) if folders.audio else {}
    transcripts: Mapping[str, str] = read_transcripts(folders.transcripts) if folders.transcripts else {}
    missing = [v for v in videos if v not in feats and v not in vids]
    if missing:
        place = " or ".join(str(d) for d in (folders.features, folders.videos) if d)
        exts = (FEATURE_EXTS if folders.features else ()) + (VIDEO_EXTS if folders.videos else ())
        raise UserError(f"{where}: {len(missing)} of {len(videos)} gallery videos have no file in {place} (first: "
                        f"{missing[0]}, looked for {missing[0]}{'|'.join(exts)}); add the files, or use --limit for "
                        "a smoke run on the first videos")

    def ref(files: dict[str, Path], v: str) -> MediaFile | None:
        return MediaFile.of(files[v]) if v in files else None

    return [VideoInputs(v, ref(vids, v), ref(feats, v), ref(audio, v), transcripts.get(v), n_frames, frame_sampling)
            for v in videos]
