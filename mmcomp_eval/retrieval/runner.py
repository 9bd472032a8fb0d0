"""One retrieval run: a model, a caption dataset, its perturbed caption sets, both directions.

Videos are embedded once and reused for the original captions and every
perturbation (only the caption side changes), so a full ICSVR sweep costs one
pass over the videos plus eleven cheap text passes. The record written to
``retrieval_<dataset>_<split>.json`` holds every metric of every caption set
in both directions; ``retrieval_<dataset>_<split>_ranks.jsonl`` holds each
query's rank so that any other statistic can be computed later.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.data.captions import CaptionDataset
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.results import git_commit, package_versions
from mmcomp_eval.retrieval.metrics import (
    DEFAULT_BLOCK_ELEMENTS,
    DEFAULT_V2T,
    TIE_RULE,
    TIE_RULE_DESCRIPTION,
    V2T_CONVENTIONS,
    RetrievalScores,
    check_v2t_convention,
    score_embeddings,
)
from mmcomp_eval.retrieval.models import RetrievalModel, VideoItem
from mmcomp_eval.textfiles import read_text

#: 2: v2t convention (best_caption by default), frame sampling, dtype and text length recorded
RETRIEVAL_SCHEMA_VERSION = 2
RECORD_KIND = "retrieval"
ORIGINAL = "original"
VIDEO_EXTS = (".mp4", ".avi", ".webm", ".mkv", ".mov", ".m4v", ".mpg", ".mpeg")
FEATURE_EXTS = (".npy", ".npz")
AUDIO_EXTS = (".wav", ".flac", ".mp3", ".m4a", ".aac", ".ogg", ".opus")


def _index_dir(directory: Path, exts: tuple[str, ...], what: str) -> dict[str, Path]:
    """video id (file stem) -> file, for files with one of ``exts`` (listed once, not probed per video)."""
    if not directory.is_dir():
        raise UserError(f"{what} {directory} is not a folder")
    out: dict[str, Path] = {}
    for p in sorted(directory.iterdir()):
        if p.suffix.lower() in exts and p.is_file():
            out.setdefault(p.stem, p)  # the first extension in sorted order wins on a clash
    return out


def read_transcripts(path: Path) -> dict[str, str]:
    """A JSON object ``{video_id: transcript}``, or JSONL lines ``{"video_id": ..., "transcript": ...}``."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise UserError(f"--transcripts {path}: cannot read ({exc.strerror})") from None
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
            raise UserError(f"--transcripts {path}:{n}{at}: expected a JSON object {{video_id: text}} or JSONL rows "
                            '{"video_id": ..., "transcript": ...}') from None
    return out


def gallery_items(videos: Sequence[str], *, videos_dir: Path | None = None, features_dir: Path | None = None,
                  audio_dir: Path | None = None, transcripts: Mapping[str, str] | None = None) -> list[VideoItem]:
    """Where each gallery video's inputs are: a feature file when there is one, else a video file.

    A video found in neither folder is an error naming how many are missing
    and the first one, since silently shrinking the gallery changes every metric.
    """
    if videos_dir is None and features_dir is None:
        raise UserError("give --videos-dir (video files) or --features-dir (precomputed .npy/.npz per video)")
    vids = _index_dir(videos_dir, VIDEO_EXTS, "--videos-dir") if videos_dir else {}
    feats = _index_dir(features_dir, FEATURE_EXTS, "--features-dir") if features_dir else {}
    audio = _index_dir(audio_dir, AUDIO_EXTS, "--audio-dir") if audio_dir else {}
    transcripts = transcripts or {}
    missing = [v for v in videos if v not in feats and v not in vids]
    if missing:
        where = " or ".join(str(d) for d in (features_dir, videos_dir) if d)
        exts = (FEATURE_EXTS if features_dir else ()) + (VIDEO_EXTS if videos_dir else ())
        raise UserError(f"{len(missing)} of {len(videos)} videos have no file in {where} (first: "
                        f"{missing[0]}, looked for {missing[0]}{'|'.join(exts)}); add the files, or use --limit "
                        "for a smoke run on the first videos")
    return [VideoItem(v, video_path=vids.get(v), features_path=feats.get(v), audio_path=audio.get(v),
                      transcript=transcripts.get(v)) for v in videos]


def limit_dataset(ds: CaptionDataset, n_videos: int | None) -> CaptionDataset:
    """The first ``n_videos`` videos and their captions (a smaller gallery: metrics are not comparable)."""
    if n_videos is None or n_videos >= len(ds.videos):
        return ds
    if n_videos < 1:
        raise UserError(f"--limit {n_videos}: give at least 1 video")
    keep = [i for i, j in enumerate(ds.caption_video) if j < n_videos]
    return CaptionDataset(ds.name, ds.split, ds.videos[:n_videos], tuple(ds.captions[i] for i in keep),
                          tuple(ds.caption_ids[i] for i in keep), tuple(ds.caption_video[i] for i in keep),
                          ds.sources, (*ds.notes, f"limited to the first {n_videos} of {len(ds.videos)} videos"))


@dataclass
class CaptionSet:
    """One version of the dataset's captions: the original or a perturbation's output."""

    name: str
    captions: tuple[str, ...]
    n_unchanged: int | None = None
    n_empty: int = 0


def caption_sets(ds: CaptionDataset, kinds: Sequence[str], *, seed: int = 0, spacy_model: str | None = None,
                 lexicon: str = "auto", pos_roles: str = "paper",
                 data_dir: Path | str | None = None) -> tuple[list[CaptionSet], dict[str, Any]]:
    """The original captions and one set per perturbation kind (one spaCy parse for all).

    Replacement words come from every caption in the dataset's folder
    (``data_dir``), so ``--limit`` does not change a caption's perturbation.
    """
    sets = [CaptionSet(ORIGINAL, tuple(ds.captions), None, sum(1 for c in ds.captions if not c.strip()))]
    if not kinds:
        return sets, {}
    from mmcomp_eval.perturb import DEFAULT_SPACY_MODEL, dataset_vocabulary, perturb_captions

    run = perturb_captions(ds.captions, kinds, seed=seed, keys=ds.caption_ids,
                           spacy_model=spacy_model or DEFAULT_SPACY_MODEL, lexicon=lexicon, pos_roles=pos_roles,
                           vocabulary=dataset_vocabulary(ds.name, data_dir))
    for kind, res in run.results.items():
        sets.append(CaptionSet(kind, tuple(res.captions), res.n_unchanged, len(res.empty)))
    return sets, run.settings()


@dataclass
class RetrievalRun:
    """What a run produced: the record (results JSON) and per-query rank rows."""

    record: dict[str, Any]
    rank_rows: list[dict[str, Any]] = field(default_factory=list)


def run_retrieval(model: RetrievalModel, ds: CaptionDataset, items: Sequence[VideoItem], sets: Sequence[CaptionSet],
                  *, model_info: Mapping[str, Any], config: Mapping[str, Any] | None = None,
                  block_elements: int = DEFAULT_BLOCK_ELEMENTS, v2t: str = DEFAULT_V2T) -> RetrievalRun:
    """Embed the videos once, then score every caption set in both directions (``v2t``: a v2t convention)."""
    if [it.video_id for it in items] != list(ds.videos):
        raise ValueError("items must list the dataset's videos in gallery order")
    check_v2t_convention(v2t)
    t0 = time.perf_counter()
    video_emb = model.embed_videos(items)
    timing = {"embed_videos_s": round(time.perf_counter() - t0, 3), "caption_sets_s": {}}
    results: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for cs in sets:
        t1 = time.perf_counter()
        query, gallery = model.score_vectors(model.embed_captions(cs.captions), video_emb)
        scores = score_embeddings(query, gallery, ds.caption_video, block_elements=block_elements, v2t=v2t)
        timing["caption_sets_s"][cs.name] = round(time.perf_counter() - t1, 3)
        results[cs.name] = {**scores.metrics(), "n_unchanged": cs.n_unchanged, "n_empty": cs.n_empty}
        rows += _rank_rows(cs, ds, scores)
    record = {
        "kind": RECORD_KIND,
        "schema_version": RETRIEVAL_SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "git_commit": git_commit(),
        "versions": package_versions(),
        "model": {**model_info, "fingerprint": model.fingerprint()},
        "dataset": {"name": ds.name, "split": ds.split, "n_videos": len(ds.videos), "n_captions": len(ds.captions),
                    "sources": list(ds.sources), "notes": list(ds.notes)},
        "config": {"tie_rule": TIE_RULE, "tie_rule_description": TIE_RULE_DESCRIPTION,
                   "v2t_convention": v2t, "v2t_convention_description": V2T_CONVENTIONS[v2t],
                   "captions_per_video_max": max(len(c) for c in ds.video_captions),
                   "similarity": model.scoring(), **(config or {})},
        "caption_sets": results,
        "timing": timing,
    }
    return RetrievalRun(record, rows)


def _rank_rows(cs: CaptionSet, ds: CaptionDataset, scores: RetrievalScores) -> list[dict[str, Any]]:
    rows = [{"caption_set": cs.name, "direction": "t2v", "caption_id": cid, "video_id": ds.videos[j],
             "caption": text, "rank": int(r)}
            for cid, text, j, r in zip(ds.caption_ids, cs.captions, ds.caption_video, scores.t2v_ranks)]
    rows += [{"caption_set": cs.name, "direction": "v2t", "video_id": ds.videos[int(v)], "rank": int(r)}
             for v, r in zip(scores.v2t_videos, scores.v2t_ranks)]
    return rows


def result_stem(record: Mapping[str, Any]) -> str:
    return f"retrieval_{record['dataset']['name']}_{record['dataset']['split']}"


def write_run(run: RetrievalRun, directory: Path) -> Path:
    """Write the results JSON and the ranks JSONL (atomically); returns the JSON's path."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = result_stem(run.record)
    target = directory / f"{stem}.json"
    atomic_files.write_text(target, json.dumps(run.record, indent=2, sort_keys=True, ensure_ascii=False,
                                               default=str) + "\n")
    atomic_files.write_text(directory / f"{stem}_ranks.jsonl",
                            "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in run.rank_rows))
    return target


def summary_table(record: Mapping[str, Any]) -> str:
    """Markdown: one row per caption set, both directions."""
    d = record["dataset"]
    cfg = record["config"]
    head = (f"{record['model'].get('label') or record['model']['name']} on {d['name']}/{d['split']} "
            f"({d['n_videos']} videos, {d['n_captions']} captions; ties ranked {cfg['tie_rule']}; "
            f"v2t {cfg['v2t_convention']})")
    cols = ("R1", "R5", "R10", "MdR", "MnR", "SumR")
    lines = [head, "", "| caption set | " + " | ".join(f"t2v {c}" for c in cols) + " | "
             + " | ".join(f"v2t {c}" for c in cols) + " | unchanged |",
             "|---" * (2 + 2 * len(cols)) + "|"]
    for name, res in record["caption_sets"].items():
        cells = [f"{res[dr][c]:.1f}" for dr in ("t2v", "v2t") for c in cols]
        unchanged = "-" if res.get("n_unchanged") is None else str(res["n_unchanged"])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {unchanged} |")
    return "\n".join(lines)
