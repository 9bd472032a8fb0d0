"""Synthetic EK-100-style media and CompAct-like documents, for tests and GPU checks.

Nothing here reads reference data: frames are drawn (each frame's colour
encodes its video and number, with a moving bar so frames differ in detail),
videos are encoded with PyAV, and documents are windows of made-up cooking
narrations with the fields the CompAct templates and the media layer need.
Everything is deterministic in its arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from mmcomp_eval.media.sources import FRAME_NAME

if TYPE_CHECKING:
    from PIL import Image

VERBS = ("take", "put down", "wash", "open", "close", "cut", "pick up", "stir", "pour", "peel")
NOUNS = ("knife", "plate", "onion", "cupboard", "tap", "board", "pan", "spoon", "oil", "pepper")


def frame_image(video_index: int, number: int, size: tuple[int, int] = (64, 48)) -> Image.Image:
    """Frame ``number`` (1-based) of synthetic video ``video_index``: distinct per (video, number)."""
    from PIL import Image, ImageDraw

    w, h = size
    im = Image.new("RGB", size, ((37 * video_index) % 256, (5 * number) % 256, (97 * video_index + number) % 256))
    draw = ImageDraw.Draw(im)
    x = (3 * number) % w
    draw.rectangle([x, 0, min(w - 1, x + 1 + number % 7), h - 1], fill=(255, 255, 255))
    return im


def write_frames(root: Path, video_id: str, n_frames: int, video_index: int = 0,
                 size: tuple[int, int] = (64, 48)) -> Path:
    """``<root>/P01/rgb_frames/P01_01/frame_0000000001.jpg`` ... (EK-100's extracted-frames layout)."""
    folder = Path(root) / video_id.split("_")[0] / "rgb_frames" / video_id
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(1, n_frames + 1):
        frame_image(video_index, n, size).save(folder / FRAME_NAME.format(n), quality=95)
    return folder


def write_video(root: Path, video_id: str, n_frames: int, video_index: int = 0, size: tuple[int, int] = (64, 48),
                fps: int = 30, codec: str = "mpeg4", gop: int = 12) -> Path:
    """``<root>/P01/videos/P01_01.MP4`` (EK-100's video layout), frames as :func:`frame_image`."""
    import av

    path = Path(root) / video_id.split("_")[0] / "videos" / f"{video_id}.MP4"
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.gop_size = gop
        stream.options = {"qscale": "2"} if codec == "mpeg4" else {}
        for n in range(1, n_frames + 1):
            frame = av.VideoFrame.from_image(frame_image(video_index, n, size))
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def compact_docs(n: int, videos: list[str], frames_per_clip: int = 10, prefix: str = "d") -> list[dict]:
    """``n`` CompAct-like windows (3 context clips + target) spread over ``videos``.

    Document ``k`` uses video ``videos[k % len(videos)]`` and clips that start
    at frame ``1 + (k // len(videos)) * 4 * frames_per_clip``; a video
    therefore needs ``4 * frames_per_clip * ceil(n / len(videos))`` frames.
    """
    docs = []
    for k in range(n):
        video = videos[k % len(videos)]
        base = 1 + (k // len(videos)) * 4 * frames_per_clip
        starts = [base + c * frames_per_clip for c in range(4)]
        acts = [f"{VERBS[(k + c) % len(VERBS)]} {NOUNS[(2 * k + c) % len(NOUNS)]}" for c in range(4)]
        docs.append({
            "id": f"{prefix}{k}", "narrations": acts[:3], "trg_narration": acts[3],
            "video_id": video, "participant_id": video.split("_")[0],
            "start_frames": starts, "stop_frames": [s + frames_per_clip - 1 for s in starts],
            "narration_ids": [f"{video}_{k * 4 + c}" for c in range(4)],
        })
    return docs


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def corpus() -> list[str]:
    """Text to train a throwaway tokenizer on: every narration the synthetic documents can hold."""
    return [f"{v} {n}" for v in VERBS for n in NOUNS] + [
        "Predict the next narration given 3 sequential previous narrations from a cooking video", " . ", " => "]


def write_clip(path: Path, colour: tuple[int, int, int], n_frames: int = 12, fps: int = 8, size: int = 48,
               tone_hz: float | None = None) -> Path:
    """A video file of one ``colour`` with a moving white bar (and a 1.5 s sine tone when ``tone_hz``), via PyAV.

    For retrieval tests: a gallery video whose frames differ in detail, and
    whose audio track (or its absence) the ``fusion`` model reads.
    """
    import av
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        audio = None
        if tone_hz is not None:
            audio = container.add_stream("aac", rate=16000)
            audio.layout = "mono"
        for i in range(n_frames):
            img = np.zeros((size, size, 3), np.uint8)
            img[:] = colour
            img[:, (4 * i) % size:(4 * i) % size + 4] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio is not None:
            wave = (0.3 * np.sin(np.arange(24000) * 2 * np.pi * tone_hz / 16000)).astype(np.float32)
            for k in range(0, len(wave), 1024):
                frame = av.AudioFrame.from_ndarray(wave[None, k:k + 1024], format="fltp", layout="mono")
                frame.sample_rate, frame.pts = 16000, k
                for packet in audio.encode(frame):
                    container.mux(packet)
            for packet in audio.encode():
                container.mux(packet)
    return path
