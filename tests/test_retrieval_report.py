"""Retrieval reports on hand-written result records: mR1 only over a common set of datasets, settings shown."""

from __future__ import annotations

import json
from pathlib import Path

from mmcomp_eval.retrieval.report import build_report, settings, sumr_table
from mmcomp_eval.retrieval.runner import RETRIEVAL_SCHEMA_VERSION


def record(model: str, dataset: str, r1: float, *, v2t: str = "best_caption", schema: int = RETRIEVAL_SCHEMA_VERSION,
           frame_sampling: str = "clip4clip") -> dict:
    metrics = {"R1": r1, "R5": r1 + 20, "R10": r1 + 30, "SumR": 3 * r1 + 50, "MdR": 3.0, "MnR": 9.0, "n_queries": 10}
    return {"kind": "retrieval", "schema_version": schema,
            "model": {"name": "clip", "label": model,
                      "fingerprint": {"frame_sampling": frame_sampling, "max_text_tokens": 32, "dtype": "float16"}},
            "dataset": {"name": dataset, "split": "test", "n_videos": 10, "n_captions": 10},
            "config": {"tie_rule": "pessimistic", "v2t_convention": v2t},
            "caption_sets": {"original": {"t2v": metrics, "v2t": metrics, "n_unchanged": None, "n_empty": 0}}}


def test_mr1_only_over_every_dataset_of_the_report():
    recs = [record("A", "msrvtt", 40.0), record("A", "vatex", 50.0), record("A", "charades", 15.0),
            record("B", "msrvtt", 44.0), record("B", "vatex", 60.0)]
    table = sumr_table(recs)
    assert "mR1 (3 datasets) |" in table.splitlines()[0]
    assert table.splitlines()[2].endswith("| 35.0 |")  # A: (40 + 50 + 15) / 3
    # B has no charades result: its mean over 2 datasets (52.0) would look comparable to A's, so none is given
    assert table.splitlines()[3].endswith("| none: 2 of 3 datasets |") and "52.0" not in table


def test_settings_and_mixed_conventions_are_marked(tmp_path: Path):
    old = record("old", "msvd", 30.0, v2t="ignored", schema=1)  # schema 1 ranked every caption, uniform frames
    assert settings(old) == {"v2t": "all_captions", "frame_sampling": "uniform", "max_text_tokens": 77,
                             "dtype": "float32"}
    new = record("new", "msvd", 31.0)
    fusion = record("fused", "msvd", 33.0)
    fusion["model"]["fingerprint"] = {"name": "fusion", "video": fusion["model"].pop("fingerprint")}
    assert settings(fusion)["frame_sampling"] == "clip4clip"  # read from the nested CLIP part
    files = []
    for r in (old, new, fusion):
        f = tmp_path / f"{r['model']['label']}.json"
        f.write_text(json.dumps(r))
        files.append(f)
    build_report(files, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| old | msvd/test | all_captions | uniform | 77 | float32 |" in md
    assert "| new | msvd/test | best_caption | clip4clip | 32 | float16 |" in md
    assert "**Not like for like:** the models here differ in v2t, frame_sampling, max_text_tokens, dtype" in md
    build_report(files[1:], tmp_path / "rep2")
    assert "Not like for like" not in (tmp_path / "rep2" / "report.md").read_text()
