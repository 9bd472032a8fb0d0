"""The retrieval models (``clip``, ``fusion``) with tiny random-weight CLIP and CLAP checkpoints saved to disk.

Scores from random weights mean nothing; these tests check the real loading,
frame sampling, pooling, fusion arithmetic and the ``embed`` contract the
retrieval tasks use (tasks themselves: test_retrieval_tasks.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmcomp_eval.api.request import EmbeddingRequest, MediaFile, VideoInputs
from mmcomp_eval.errors import UserError
from mmcomp_eval.media.synthetic import write_clip
from mmcomp_eval.media.video import DECODES, sample_frames, sample_uniform_frames
from mmcomp_eval.models import MODELS, create_model
from mmcomp_eval.retrieval.ranking import score_embeddings
from mmcomp_eval.testing.tiny_models import save_tiny_clap, save_tiny_clip

av = pytest.importorskip("av")

COLOURS = [(220, 30, 30), (30, 200, 40), (40, 60, 230), (230, 220, 40), (200, 40, 200)]
CAPTIONS = ["a red car drives", "a green field of grass", "a blue sea with waves", "a yellow sun rises",
            "a purple flower blooms"]


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="session")
def tiny_clap_dir(tmp_path_factory) -> Path:
    return save_tiny_clap(tmp_path_factory.mktemp("tiny_clap"))


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("videos")
    for i, colour in enumerate(COLOURS):
        write_clip(d / f"video{i}.mp4", colour, tone_hz=None if i == 4 else 300.0 + 200 * i)
    return d


def video(video_id: str, *, path: Path | None = None, features: Path | None = None, transcript: str | None = None,
          n_frames: int = 4, sampling: str = "clip4clip") -> VideoInputs:
    return VideoInputs(video_id, MediaFile.of(path) if path else None, MediaFile.of(features) if features else None,
                       None, transcript, n_frames, sampling)


def _items(video_dir: Path, **kw) -> list[VideoInputs]:
    return [video(f"video{i}", path=video_dir / f"video{i}.mp4", **kw) for i in range(len(COLOURS))]


def embed_videos(model, items: list[VideoInputs]) -> np.ndarray:
    return np.stack(model.embed([EmbeddingRequest(v.video_id, video=v) for v in items]))


def embed_captions(model, texts: list[str], max_tokens: int | None = 32) -> np.ndarray:
    return np.stack(model.embed([EmbeddingRequest(f"t{i}", text=t, max_text_tokens=max_tokens)
                                 for i, t in enumerate(texts)]))


def test_retrieval_models_are_ordinary_models():
    for name in ("clip", "clip-b32", "clip-b16", "clip-l14", "fusion"):
        caps = MODELS.get(MODELS.spec(name).adapter).capabilities
        assert caps.embeddings and not caps.generate and caps.reports_each_result
    assert MODELS.spec("clip-l14").defaults["pretrained"] == "openai/clip-vit-large-patch14"


def _reference_meanp(clip_dir: Path, path: Path, n: int, sampling: str = "clip4clip") -> np.ndarray:
    """meanP written directly against transformers: per-frame normalise, average, normalise."""
    import torch
    from transformers import AutoImageProcessor, CLIPModel

    model = CLIPModel.from_pretrained(clip_dir).eval()
    pixels = AutoImageProcessor.from_pretrained(clip_dir)(images=sample_frames(path, n, sampling),
                                                           return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model.get_image_features(pixel_values=pixels)
    f = getattr(out, "pooler_output", out).numpy()
    f = f / np.linalg.norm(f, axis=1, keepdims=True)
    m = f.mean(0)
    return m / np.linalg.norm(m)


def test_clip_meanp_on_videos(tiny_clip_dir, video_dir):
    model = create_model("clip", {"pretrained": str(tiny_clip_dir), "batch_size": 6})
    fp = model.fingerprint()
    assert (fp["pooling"], fp["dtype"]) == ("meanP", "float32") and fp["checkpoint"]["files"]
    items = _items(video_dir)
    reported = []
    emb = np.stack(model.embed([EmbeddingRequest(v.video_id, video=v) for v in items],
                               on_result=lambda i, v: reported.append(i)))
    assert sorted(reported) == [0, 1, 2, 3, 4]  # every answer reported as it is finished (the store commits it)
    assert emb.shape == (5, 16) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    # the clips are 1.5 s at 8 fps: CLIP4Clip's sampling reads frames 0 and 8 (one per second), not 4
    assert len(sample_frames(items[2].video.path, 4)) == 2
    np.testing.assert_allclose(emb[2], _reference_meanp(tiny_clip_dir, Path(items[2].video.path), 4), atol=1e-5)
    assert model.videos_encoded == 5
    # frame settings travel with the request: uniform sampling gives another embedding from the same model
    uniform = embed_videos(model, [video("v", path=video_dir / "video2.mp4", sampling="uniform")])
    np.testing.assert_allclose(uniform[0], _reference_meanp(tiny_clip_dir, video_dir / "video2.mp4", 4, "uniform"),
                               atol=1e-5)
    assert not np.allclose(uniform[0], emb[2], atol=1e-3)
    bf16 = create_model("clip", {"pretrained": str(tiny_clip_dir), "dtype": "bf16"})
    emb_bf16 = embed_videos(bf16, items[:1])
    assert bf16.fingerprint()["dtype"] == "bfloat16" and emb_bf16.dtype == np.float32
    assert np.allclose(emb_bf16[0], emb[0], atol=0.05)  # close, not equal
    text = embed_captions(model, CAPTIONS)
    assert text.shape == (5, 16)
    metrics = score_embeddings(text, emb, list(range(5))).metrics()
    assert set(metrics) == {"t2v", "v2t"} and metrics["t2v"]["n_queries"] == 5


def test_one_call_mixes_captions_and_videos_in_request_order(tiny_clip_dir, video_dir):
    model = create_model("clip", {"pretrained": str(tiny_clip_dir), "batch_size": 2})
    items = _items(video_dir)
    requests = [EmbeddingRequest("v0", video=items[0]), EmbeddingRequest("c0", text=CAPTIONS[0], max_text_tokens=32),
                EmbeddingRequest("c1", text=CAPTIONS[1], max_text_tokens=8), EmbeddingRequest("v1", video=items[1])]
    mixed = model.embed(requests)
    np.testing.assert_allclose(mixed[0], embed_videos(model, items[:1])[0], atol=1e-6)
    np.testing.assert_allclose(mixed[3], embed_videos(model, items[1:2])[0], atol=1e-6)
    np.testing.assert_allclose(mixed[1], embed_captions(model, CAPTIONS[:1])[0], atol=1e-6)
    np.testing.assert_allclose(mixed[2], embed_captions(model, CAPTIONS[1:2], 8)[0], atol=1e-6)
    with pytest.raises(ValueError, match="exactly one of text and video"):
        EmbeddingRequest("x")


def test_precomputed_features_match_videos(tiny_clip_dir, video_dir, tmp_path):
    model = create_model("clip", {"pretrained": str(tiny_clip_dir)})
    per_frame = model.encoder.frames(sample_uniform_frames(video_dir / "video1.mp4", 4))  # (4, 16), not normalised
    np.save(tmp_path / "video1.npy", per_frame)
    np.savez(tmp_path / "video1b.npz", features=per_frame)
    np.save(tmp_path / "single.npy", per_frame[0])
    from_video = embed_videos(model, [video("video1", path=video_dir / "video1.mp4", sampling="uniform")])
    decoded = DECODES.frames
    from_feats = embed_videos(model, [video("a", features=tmp_path / "video1.npy"),
                                      video("b", features=tmp_path / "video1b.npz", path=video_dir / "video1.mp4"),
                                      video("c", features=tmp_path / "single.npy")])
    assert DECODES.frames == decoded  # a feature file wins over the video file: nothing decoded
    np.testing.assert_allclose(from_feats[0], from_video[0], atol=1e-6)
    np.testing.assert_array_equal(from_feats[0], from_feats[1])
    np.testing.assert_allclose(from_feats[2], per_frame[0] / np.linalg.norm(per_frame[0]), atol=1e-6)
    # meanP normalises each frame before averaging: a long frame vector does not dominate
    uneven = np.zeros((2, 16), np.float32)
    uneven[0, 0], uneven[1, 1] = 30.0, 0.5
    np.save(tmp_path / "uneven.npy", uneven)
    pooled = embed_videos(model, [video("u", features=tmp_path / "uneven.npy")])[0]
    np.testing.assert_allclose(pooled[:2], [2 ** -0.5, 2 ** -0.5], atol=1e-6)
    np.save(tmp_path / "bad.npy", np.ones((3, 7), np.float32))
    with pytest.raises(UserError, match="7-d features but the model's joint space is 16-d"):
        embed_videos(model, [video("x", features=tmp_path / "bad.npy")])
    with pytest.raises(UserError, match="neither a video file nor a feature file"):
        embed_videos(model, [video("y")])


def _feature_items(tmp_path: Path, transcripts: list[str | None]) -> list[VideoInputs]:
    rng = np.random.default_rng(3)
    items = []
    for i, t in enumerate(transcripts):
        np.save(tmp_path / f"v{i}.npy", rng.standard_normal(16).astype(np.float32))
        items.append(video(f"v{i}", features=tmp_path / f"v{i}.npy", transcript=t))
    return items


def _z(cos: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
    """Each row z-scored over the columns in ``present`` (all by default); 0 elsewhere."""
    present = np.ones(cos.shape[1], bool) if present is None else present
    out = np.zeros_like(cos)
    sub = cos[:, present]
    out[:, present] = (sub - sub.mean(axis=1, keepdims=True)) / sub.std(axis=1, keepdims=True)
    return out


def test_fusion_weights_on_hand_built_transcripts(tiny_clip_dir, tmp_path):
    base = {"pretrained": str(tiny_clip_dir)}
    clip = create_model("clip", base)
    own = _feature_items(tmp_path, CAPTIONS)  # video i says caption i
    swapped = _feature_items(tmp_path, CAPTIONS[1:] + CAPTIONS[:1])  # video i says caption i+1
    cv = list(range(5))

    def vectors(model, items):
        return model.score_vectors(embed_captions(model, CAPTIONS), embed_videos(model, items))

    def fused(model, items):
        q, g = vectors(model, items)
        return q @ g.T

    def ranks(model, items):
        return score_embeddings(*vectors(model, items), cv).t2v_ranks

    video_only = create_model("fusion", {**base, "w_transcript": 0})
    np.testing.assert_array_equal(ranks(video_only, own), ranks(clip, own))
    speech_only = create_model("fusion", {**base, "w_video": 0, "w_transcript": 1})
    assert ranks(speech_only, own).tolist() == [1, 1, 1, 1, 1]  # each caption finds the video that says it
    assert all(ranks(speech_only, swapped) > 1)  # ... and never its own video when the transcripts are shifted
    # caption i's best video is now video i-1, the one whose transcript is caption i
    assert fused(speech_only, swapped).argmax(axis=1).tolist() == [4, 0, 1, 2, 3]

    # mixed weights: exactly the weighted sum of each part's cosines z-scored per caption over the gallery
    mixed = create_model("fusion", {**base, "w_video": 0.7, "w_transcript": 2.0})
    c_t = embed_captions(clip, CAPTIONS)
    frames_cos = c_t @ embed_videos(clip, own).T
    transcript_cos = c_t @ clip.encoder.text(CAPTIONS).T
    np.testing.assert_allclose(fused(mixed, own), 0.7 * _z(frames_cos) + 2.0 * _z(transcript_cos), atol=1e-4)
    # a video without a transcript (None or blank) scores the gallery mean of that part: 0 after z-scoring
    partial = _feature_items(tmp_path, [CAPTIONS[0], None, CAPTIONS[2], "", CAPTIONS[4]])
    has = np.array([True, False, True, False, True])
    expected = 0.7 * _z(c_t @ embed_videos(clip, partial).T) + 2.0 * _z(transcript_cos, has)
    np.testing.assert_allclose(fused(mixed, partial), expected, atol=1e-4)
    # normalise=none keeps the raw sum, where a missing transcript scores 0
    raw = create_model("fusion", {**base, "w_video": 0.7, "w_transcript": 2.0, "normalise": "none"})
    np.testing.assert_allclose(fused(raw, partial), 0.7 * c_t @ embed_videos(clip, partial).T
                               + 2.0 * np.where(has, transcript_cos, 0.0), atol=1e-5)
    assert "not SAVE" in mixed.fingerprint()["kind"] and mixed.fingerprint()["normalise"] == "zscore"
    assert mixed.similarity().startswith("score-level fusion baseline (ours, not SAVE): 0.7 x video + 2 x transcript")

    with pytest.raises(UserError, match="w_audio=0.5 needs an audio-text model"):
        create_model("fusion", {**base, "w_audio": 0.5})
    with pytest.raises(UserError, match="not all 0"):
        create_model("fusion", {**base, "w_video": 0, "w_transcript": 0})


def test_fusion_with_clap_audio(tiny_clip_dir, tiny_clap_dir, video_dir):
    args = {"pretrained": str(tiny_clip_dir), "clap": str(tiny_clap_dir), "w_audio": 1.0}
    model = create_model("fusion", args)
    items = _items(video_dir, n_frames=2)
    emb = embed_videos(model, items)
    assert emb.shape == (5, 48)
    audio = emb[:, 32:]
    np.testing.assert_allclose(np.linalg.norm(audio[:4], axis=1), 1.0, atol=1e-5)
    assert not audio[4].any()  # video4 has no audio track: zero audio term
    assert not np.allclose(audio[0], audio[1])  # different tones, different embeddings
    cap = embed_captions(model, CAPTIONS)
    assert cap.shape == (5, 32)  # [CLIP text | CLAP text], unweighted: weights apply when scoring
    np.testing.assert_allclose(np.linalg.norm(cap[:, 16:], axis=1), 1.0, atol=1e-5)
    # the audio part of the fused score: CLAP cosines z-scored over the 4 videos with audio, 0 for video4
    q, g = model.score_vectors(cap, emb)
    np.testing.assert_allclose(q[:, -16:] @ g[:, -16:].T, _z(cap[:, 16:] @ audio.T, np.arange(5) < 4), atol=1e-4)
    # a caption longer than CLAP's text positions (78 here; 512 for laion/clap) is cut, not an index error
    assert model.clap.max_text_tokens == 78
    long = embed_captions(model, ["a red car drives " * 20])
    np.testing.assert_allclose(long[0, 16:], model.clap.text(["a red car drives " * 20])[0], atol=1e-6)
    np.testing.assert_array_equal(embed_videos(create_model("fusion", args), items), emb)  # deterministic


def test_dtype_and_text_length(tiny_clip_dir):
    with pytest.raises(UserError, match="dtype=int8 is not one of float32, float16, bfloat16"):
        create_model("clip", {"pretrained": str(tiny_clip_dir), "dtype": "int8"})
    with pytest.raises(UserError, match="batch_size=auto: retrieval models take a number"):
        create_model("clip", {"pretrained": str(tiny_clip_dir), "batch_size": "auto"})
    model = create_model("clip", {"pretrained": str(tiny_clip_dir)})
    with pytest.raises(UserError, match="max_text_tokens=78 must be between 2 and the checkpoint's context of 77"):
        embed_captions(model, ["a red car"], 78)
    long = "a red car drives " * 4  # 68 characters: more than 32 tokens with the byte-level test vocabulary
    assert len(model.encoder.tokenizer(long)["input_ids"]) > 32
    assert not np.allclose(embed_captions(model, [long], 32), embed_captions(model, [long], 77), atol=1e-3)
    np.testing.assert_allclose(embed_captions(model, ["a red car"], 32), embed_captions(model, ["a red car"], 77),
                               atol=1e-6)
    # 32 tokens: the start token, 30 pieces, the end token, as CLIP4Clip's max_words 32
    ids = model.encoder.tokenizer([long], truncation=True, max_length=32)["input_ids"][0]
    assert len(ids) == 32 and ids[-1] == model.encoder.tokenizer.eos_token_id
    half = create_model("clip", {"pretrained": str(tiny_clip_dir), "dtype": "fp16"})
    emb = embed_captions(half, CAPTIONS)
    assert emb.dtype == np.float32 and half.fingerprint()["dtype"] == "float16"
    np.testing.assert_allclose(emb, embed_captions(model, CAPTIONS), atol=5e-3)


def test_missing_weights_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError) as exc:
        create_model("clip", "pretrained=openai/clip-vit-base-patch32,offline=true")
    msg = str(exc.value)
    assert "\n" not in msg and "cannot load checkpoint 'openai/clip-vit-base-patch32'" in msg
    assert "pretrained=/local/path" in msg
    with pytest.raises(UserError, match="does not exist"):
        create_model("clip", {"pretrained": str(tmp_path / "nope" / "clip")})
    with pytest.raises(UserError, match="unknown model argument 'n_frame'"):
        create_model("clip", {"n_frame": 3})
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="cannot load checkpoint") as exc:
        create_model("fusion", {"pretrained": str(tmp_path / "empty")})
    assert "\n" not in str(exc.value)
