"""The media layer on synthetic frames and videos: decoding, layouts, keyframes, cache, per-document errors."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.media import synthetic as S
from mmcomp_eval.media.cache import KeyframeCache, load_image
from mmcomp_eval.media.keyframes import SCORERS, build_strategy, tile
from mmcomp_eval.media.resolver import KeyframeResolver, TaskMedia
from mmcomp_eval.media.sources import FolderFrames, TarFrames, VideoFrames, locate
from mmcomp_eval.media.video import (
    DECODES,
    MediaError,
    count_frames,
    read_frames,
    sample_uniform_frames,
    uniform_indices,
)
from mmcomp_eval.tasks.prompting import ImageRef, RenderedPrompt
from mmcomp_eval.config.task_config import MediaConfig, TaskConfig, parse_task


def nearest_frame(image, video_index: int, candidates) -> int:
    """The synthetic frame number ``image`` is closest to (decoding is lossy, so compare, don't equate)."""
    a = np.asarray(image, dtype=float)
    return min(candidates, key=lambda n: np.abs(a - np.asarray(S.frame_image(video_index, n), dtype=float)).mean())


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    S.write_video(root, "P01_01", 300, video_index=1, gop=12)   # long enough to exercise seeking
    S.write_frames(root, "P02_01", 40, video_index=2)
    return root


def test_video_frames_are_frame_accurate_in_any_order(media):
    path = media / "P01" / "videos" / "P01_01.MP4"
    assert count_frames(path) == 300
    wanted = [299, 3, 150, 3, 0, 151, 12]  # unordered, repeated, far apart (seek) and adjacent (decode on)
    frames = read_frames(path, wanted)
    assert [nearest_frame(f, 1, range(max(1, i - 2), min(301, i + 4))) - 1 for f, i in zip(frames, wanted)] == wanted
    assert frames[1].tobytes() == frames[3].tobytes()
    uniform = sample_uniform_frames(path, 4)
    assert uniform_indices(0, 299, 4) == [37, 112, 187, 262]
    assert [nearest_frame(f, 1, range(i - 1, i + 4)) - 1 for f, i in zip(uniform, [37, 112, 187, 262])] == \
        [37, 112, 187, 262]
    assert uniform_indices(10, 19, 1) == [14] and uniform_indices(5, 5, 3) == [5, 5, 5]


@pytest.mark.parametrize("content, fragment", [
    (None, "does not exist"),
    (b"", "is empty (0 bytes)"),
    (b"not a video at all" * 50, "cannot be opened"),
])
def test_unreadable_videos_are_one_line_media_errors(tmp_path, content, fragment):
    path = tmp_path / "bad.MP4"
    if content is not None:
        path.write_bytes(content)
    for call in (lambda: count_frames(path), lambda: read_frames(path, [0]), lambda: sample_uniform_frames(path, 2)):
        with pytest.raises(MediaError) as err:
            call()
        assert isinstance(err.value, UserError) and str(path) in str(err.value) and fragment in str(err.value)
        assert "\n" not in str(err.value)


def test_truncated_video_and_out_of_range_frame(media, tmp_path):
    good = media / "P01" / "videos" / "P01_01.MP4"
    with pytest.raises(MediaError, match="has 300 frames; frame 300 was asked for"):
        read_frames(good, [300])
    cut = tmp_path / "cut.MP4"
    data = good.read_bytes()
    cut.write_bytes(data[: len(data) // 3])  # the index (moov) of an MP4 is at the end: unreadable
    with pytest.raises(MediaError, match="cut.MP4"):
        read_frames(cut, [250])


def test_ek100_layouts_are_found(media, tmp_path):
    assert isinstance(locate("P01_01", "P01", None, media), VideoFrames)
    assert isinstance(locate("P02_01", None, media, media), FolderFrames)   # frames win over videos
    # EK-100's download script leaves frames as P01/rgb_frames/P01_01.tar under EPIC-KITCHENS/
    archive = tmp_path / "EPIC-KITCHENS" / "P02" / "rgb_frames" / "P02_01.tar"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w") as tar:
        for f in sorted((media / "P02" / "rgb_frames" / "P02_01").iterdir()):
            tar.add(f, arcname=f"./{f.name}")
    src = locate("P02_01", "P02", tmp_path, None)
    assert isinstance(src, TarFrames)
    from_tar = src.read([7, 1])
    from_folder = FolderFrames(media / "P02" / "rgb_frames" / "P02_01").read([7, 1])
    assert [a.tobytes() for a in from_tar] == [b.tobytes() for b in from_folder]
    assert nearest_frame(from_tar[0], 2, range(1, 41)) == 7
    with pytest.raises(MediaError, match=r"no frames for video P09_01 under .* \(expected P09/rgb_frames/P09_01/"):
        locate("P09_01", None, tmp_path, None)


def test_missing_and_corrupt_frames(media, tmp_path):
    src = FolderFrames(media / "P02" / "rgb_frames" / "P02_01")
    with pytest.raises(MediaError, match=r"frame_0000000041.jpg does not exist \(the folder's frames run "
                                         r"frame_0000000001.jpg .. frame_0000000040.jpg\)"):
        src.identity([41])
    folder = tmp_path / "P03" / "rgb_frames" / "P03_01"
    folder.mkdir(parents=True)
    (folder / "frame_0000000001.jpg").write_bytes(b"")
    (folder / "frame_0000000002.jpg").write_bytes(b"\xff\xd8 broken jpeg")
    with pytest.raises(MediaError, match="is empty"):
        FolderFrames(folder).read([1])
    with pytest.raises(MediaError, match="not a readable image"):
        FolderFrames(folder).read([2])


def test_keyframe_strategies():
    frames = [S.frame_image(0, n) for n in range(1, 5)]
    assert build_strategy("middle").frames(11, 20) == [15]
    uniform = build_strategy("uniform", {"n": 4})
    assert uniform.frames(1, 40) == [5, 15, 25, 35]
    grid = uniform.combine(frames)
    assert grid.size == (128, 96)  # 2 x 2 tiles of 64 x 48, in reading order
    assert grid.crop((64, 0, 128, 48)).tobytes() == frames[1].tobytes()
    assert tile(frames[:3]).size == (128, 96)
    # sharpness: a flat frame loses against a detailed one
    flat = S.frame_image(0, 1).point(lambda _: 90)
    informative = build_strategy("informative", {"n": 2})
    assert informative.combine([flat, frames[2]]) is frames[2]

    @SCORERS.register("test_brightest")
    def brightest():
        return lambda images: [float(np.asarray(im).mean()) for im in images]

    hooked = build_strategy("informative", {"n": 3, "scorer": "test_brightest"})
    assert hooked.combine([flat, frames[0], flat.point(lambda _: 200)]).getpixel((0, 0)) == (200, 200, 200)
    assert hooked.describe() == {"name": "informative", "n": 3, "scorer": "test_brightest", "scorer_options": {}}
    with pytest.raises(UserError, match="unknown keyframe strategy 'midle' \\(did you mean 'middle'\\?\\)"):
        build_strategy("midle")
    with pytest.raises(UserError, match="has no option 'k'"):
        build_strategy("uniform", {"k": 2})
    with pytest.raises(UserError, match="unknown keyframe scorer 'yolo'"):
        build_strategy("informative", {"scorer": "yolo"})
    with pytest.raises(UserError, match="needs scorer_options: {model:"):
        build_strategy("informative", {"scorer": "detector"})


def _doc(doc_id, video, starts, length=10):
    return Document(doc_id, {"id": doc_id, "video_id": video, "participant_id": video.split("_")[0],
                             "start_frames": starts, "stop_frames": [s + length - 1 for s in starts]})


def test_keyframe_cache_decodes_once_and_notices_changes(tmp_path):
    root = tmp_path / "m"
    S.write_video(root, "P01_01", 60, video_index=1)
    doc = _doc("a", "P01_01", [1, 21, 41])
    cache = KeyframeCache(tmp_path / "cache")
    resolver = KeyframeResolver(MediaConfig(videos_root=str(root), resize=32), cache=cache)
    before = DECODES.frames
    first = [resolver.keyframe(doc, c) for c in range(3)]
    decoded = DECODES.frames - before
    assert decoded > 0 and cache.misses == 3 and cache.hits == 0
    assert nearest_frame(load_image(first[1]).resize((64, 48)), 1, range(20, 32)) == 25  # middle of 21..30
    assert load_image(first[0]).size == (43, 32)  # shorter side resized to 32
    again = KeyframeResolver(MediaConfig(videos_root=str(root), resize=32), cache=cache)
    assert [again.keyframe(doc, c) for c in range(3)] == first
    assert DECODES.frames - before == decoded and cache.hits == 3  # nothing decoded the second time
    other = KeyframeResolver(MediaConfig(videos_root=str(root), resize=32, keyframe="uniform",
                                         keyframe_options={"n": 4}), cache=cache)
    assert other.keyframe(doc, 0) not in first  # the strategy is part of the key
    S.write_video(root, "P01_01", 61, video_index=3)  # the file is replaced: new identity, new keyframes
    assert KeyframeResolver(MediaConfig(videos_root=str(root), resize=32), cache=cache).keyframe(doc, 0) != first[0]


def _task(media_cfg: MediaConfig | None) -> TaskConfig:
    return parse_task({"task": "t", "dataset": {"name": "jsonl"}, "target_field": "id",
                       "prompt": {"template": "x.jinja"}, "metrics": ["exact_match"],
                       **({"media": {k: v for k, v in vars(media_cfg).items()}} if media_cfg else {})}, "")


def test_task_media_policies(tmp_path, monkeypatch):
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "m"
    S.write_frames(root, "P01_01", 40, video_index=1)
    good, shot, broken = _doc("good", "P01_01", [1, 11, 21]), _doc("shot", "P01_01", [5, 6, 7]), \
        _doc("broken", "P05_01", [1, 11, 21])
    uses_broken_shot = _doc("victim", "P01_01", [2, 3, 4])

    def prompt(doc, shots):
        return RenderedPrompt("", None, tuple(ImageRef(d.id, c) for d in (*shots, doc) for c in range(3)))

    docs = [good, broken, uses_broken_shot]
    prompts = {0: [prompt(good, [shot]), prompt(broken, [shot]), prompt(uses_broken_shot, [broken])]}
    skip = TaskMedia.materialise(_task(MediaConfig(frames_root=str(root), on_error="skip")), docs, [shot, broken],
                                 prompts)
    assert list(skip.skipped) == ["broken", "victim"]
    assert skip.skipped["broken"].startswith("no frames for video P05_01")
    assert skip.skipped["victim"].startswith("few-shot example broken: no frames for video P05_01")
    assert set(skip.keyframes) == {f"{d}#{c}" for d in ("good", "shot", "victim") for c in range(3)}
    record = skip.record()
    assert record["n_skipped"] == 2 and record["skipped"][0]["doc_id"] == "broken"
    with pytest.raises(UserError, match=r"^task t, document broken: no frames for video P05_01 .*on_error: skip"):
        TaskMedia.materialise(_task(MediaConfig(frames_root=str(root))), docs, [shot, broken], prompts)
    with pytest.raises(UserError, match="has no 'media' section"):
        TaskMedia.materialise(_task(None), docs, [shot], prompts)
    monkeypatch.delenv("MMCOMP_MEDIA_DIR", raising=False)
    with pytest.raises(UserError, match="names no frames_root or videos_root"):
        TaskMedia.materialise(_task(MediaConfig()), docs, [shot], prompts)
    monkeypatch.setenv("MMCOMP_MEDIA_DIR", str(root))  # the fallback root for both
    assert "good" not in TaskMedia.materialise(_task(MediaConfig(on_error="skip")), docs, [shot, broken],
                                               prompts).skipped


def test_media_section_is_validated():
    with pytest.raises(UserError, match="unknown key 'media.frame_root' \\(did you mean 'frames_root'\\?\\)"):
        parse_task({"task": "t", "dataset": {"name": "jsonl"}, "target_field": "id", "prompt": {"template": "x"},
                    "metrics": ["bleu"], "media": {"frame_root": "x"}}, "t.yaml")
    with pytest.raises(UserError, match="media.on_error 'ignore' is not one of stop, skip"):
        parse_task({"task": "t", "dataset": {"name": "jsonl"}, "target_field": "id", "prompt": {"template": "x"},
                    "metrics": ["bleu"], "media": {"on_error": "ignore"}}, "t.yaml")


def test_shipped_idefics_task_has_a_media_section():
    from mmcomp_eval.paths import REPO_ROOT
    from mmcomp_eval.config.task_config import load_task_file

    task = load_task_file(REPO_ROOT / "tasks" / "compact_nup_idefics.yaml")
    assert task.requires_images and task.prompt.template == "compact_idefics.jinja" and task.fewshot.k == 5
    assert task.media == MediaConfig(keyframe="middle", resize=256, on_error="stop")


def test_detector_scorer_counts_detections(tmp_path):
    """The paper's "most object proposals" keyframe, with a tiny random YOLOS standing in for a real detector."""
    import torch
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(0)
    YolosForObjectDetection(YolosConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, image_size=[64, 64], patch_size=16,
                                        num_detection_tokens=10, num_labels=3)).save_pretrained(tmp_path / "det")
    YolosImageProcessor(size={"shortest_edge": 64, "longest_edge": 96}).save_pretrained(tmp_path / "det")
    frames = [S.frame_image(1, n) for n in (1, 20, 40)]

    def scores(threshold):
        strategy = build_strategy("informative", {"n": 3, "scorer": "detector", "scorer_options": {
            "model": str(tmp_path / "det"), "threshold": threshold, "local_files_only": True}})
        return strategy, strategy._scorer(frames)

    assert scores(0.0)[1] == [10.0, 10.0, 10.0]  # every detection token counts
    assert scores(1.01)[1] == [0.0, 0.0, 0.0]
    strategy, counts = scores(0.34)
    assert strategy.combine(frames) is frames[max(range(3), key=lambda i: (counts[i], -i))]
    with pytest.raises(UserError, match="keyframe detector '.*nowhere' cannot be loaded"):
        build_strategy("informative", {"scorer": "detector", "scorer_options": {
            "model": str(tmp_path / "nowhere"), "local_files_only": True}})
