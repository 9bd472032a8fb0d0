"""Frame sampling for retrieval: CLIP4Clip's (1 per second, then linspace, never padded) and uniform segments."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mmcomp_eval.errors import UserError
from mmcomp_eval.media import synthetic as S
from mmcomp_eval.media.video import clip4clip_indices, probe, sample_frames, uniform_indices

av = pytest.importorskip("av")


def nearest_frame(image, video_index: int, candidates) -> int:
    """The synthetic frame number (1-based) ``image`` is closest to (decoding is lossy)."""
    a = np.asarray(image, dtype=float)
    return min(candidates, key=lambda n: np.abs(a - np.asarray(S.frame_image(video_index, n), dtype=float)).mean())


def test_clip4clip_indices_by_hand():
    # a 10 s clip at 30 fps: one frame per second, 10 frames, no padding to 12
    assert clip4clip_indices(300, 30, 12) == [0, 30, 60, 90, 120, 150, 180, 210, 240, 270]
    # 10.5 s: the 11th second starts at frame 300 < 315, so it is read too
    assert len(clip4clip_indices(315, 30, 12)) == 11
    # 20 s: 20 per-second frames, 12 kept at floor(k * 19 / 11) = 0 1 3 5 6 8 10 12 13 15 17 19
    assert clip4clip_indices(600, 30, 12) == [30 * s for s in (0, 1, 3, 5, 6, 8, 10, 12, 13, 15, 17, 19)]
    # OpenCV's integer frame rate: 29.97 fps steps by 29 frames
    assert clip4clip_indices(300, Fraction(30000, 1001), 12) == list(range(0, 300, 29))
    # under a second: one frame; a frame rate below 1 takes every frame
    assert clip4clip_indices(5, 30, 12) == [0]
    assert clip4clip_indices(4, Fraction(1, 2), 12) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        clip4clip_indices(10, 30, 0)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("fs")
    return {"long": S.write_video(root, "P01_01", 95, video_index=1, fps=10),   # 9.5 s at 10 fps
            "short": S.write_video(root, "P01_02", 5, video_index=2, fps=10),   # half a second
            "longer": S.write_video(root, "P01_03", 250, video_index=3, fps=10)}  # 25 s


def test_sample_frames_on_synthetic_videos(videos):
    info = probe(videos["long"])
    assert info.n_frames == 95 and info.fps == 10
    frames = sample_frames(videos["long"], 12)  # clip4clip is the default
    assert len(frames) == 10  # 0, 10, ..., 90: one per second, not padded to 12
    assert [nearest_frame(f, 1, range(1, 96)) - 1 for f in frames] == list(range(0, 95, 10))

    short = sample_frames(videos["short"], 12)
    assert len(short) == 1 and nearest_frame(short[0], 2, range(1, 6)) == 1
    uniform_short = sample_frames(videos["short"], 12, "uniform")
    assert len(uniform_short) == 12  # uniform repeats frames of a short video
    assert [nearest_frame(f, 2, range(1, 6)) - 1 for f in uniform_short] == uniform_indices(0, 4, 12)

    longer = sample_frames(videos["longer"], 12)
    expected = [10 * s for s in np.linspace(0, 24, 12, dtype=int)]  # 25 per-second frames -> 12
    assert [nearest_frame(f, 3, range(1, 251)) - 1 for f in longer] == expected
    uniform = sample_frames(videos["longer"], 12, "uniform")
    assert [nearest_frame(f, 3, range(1, 251)) - 1 for f in uniform] == uniform_indices(0, 249, 12)

    with pytest.raises(UserError, match="frame sampling 'tsn' is not one of clip4clip, uniform"):
        sample_frames(videos["long"], 12, "tsn")
