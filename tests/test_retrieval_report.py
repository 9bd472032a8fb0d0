"""The retrieval report `compare` prints (and `retrieval-report` writes): ICSVR drops, SAVE's SumR and mR1, figures.

Built on hand-written run records (the ``results.json`` fields the report
reads), so every expected cell is known in advance. The same report on real
runs is exercised in tests/test_retrieval_tasks.py.
"""

from __future__ import annotations

import pytest

from mmcomp_eval.errors import UserError
from mmcomp_eval.retrieval.report import caption_sets, figures, report, sumr_table

SETTINGS = {"v2t": "best_caption", "frame_sampling": "clip4clip", "n_frames": 12, "max_text_tokens": 32}


def task(dataset: str, r1: float, kind: str | None = None, v2t_r1: float | None = None, **settings) -> dict:
    metrics = {f"t2v_{k}": {"mean": v} for k, v in (("r1", r1), ("r5", r1 + 20), ("r10", r1 + 30),
                                                     ("sumr", 3 * r1 + 50))}
    metrics["v2t_r1"] = {"mean": r1 if v2t_r1 is None else v2t_r1}
    return {"config": {"output_type": "retrieval", "dataset": {"name": dataset},
                       "perturbation": None if kind is None else {"kind": kind}},
            "split": "test", "documents_sha256": dataset, "metrics": metrics,
            "retrieval": {"settings": {**SETTINGS, **settings}, "gallery": {"n_videos": 1000, "limited": None}}}


def run(tasks: dict[str, dict], dtype: str = "float16") -> dict:
    return {"tasks": tasks, "model": {"fingerprint": {"name": "clip", "dtype": dtype}}}


def test_mr1_only_over_every_dataset_of_the_comparison():
    sets = caption_sets("A", run({"m": task("msrvtt", 40.0), "v": task("vatex", 50.0), "c": task("charades", 15.0)})) \
        + caption_sets("B", run({"m": task("msrvtt", 44.0), "v": task("vatex", 60.0)}))
    table = sumr_table(sets).splitlines()
    assert table[0] == ("| run | msrvtt/test R1 | msrvtt/test R5 | msrvtt/test R10 | msrvtt/test SumR | vatex/test R1 | "
                        "vatex/test R5 | vatex/test R10 | vatex/test SumR | charades/test R1 | charades/test R5 | "
                        "charades/test R10 | charades/test SumR | mR1 (3 datasets) |")
    assert table[2] == "| A | 40.0 | 60.0 | 70.0 | 170.0 | 50.0 | 70.0 | 80.0 | 200.0 | 15.0 | 35.0 | 45.0 | 95.0 | 35.0 |"
    # B has no charades result: its mean over 2 datasets (52.0) would look comparable to A's, so none is given
    assert table[3].endswith("| - | - | - | - | none: 2 of 3 datasets |") and "52.0" not in "\n".join(table)


def test_drops_per_caption_set_in_icsvr_order_and_settings_that_differ():
    a = run({"msrvtt_1ka_retrieval": task("msrvtt", 40.0, v2t_r1=42.0),
             "icsvr_msrvtt_shuf": task("msrvtt", 30.0, "shuf", v2t_r1=33.0),
             "icsvr_msrvtt_objrep": task("msrvtt", 35.5, "objrep", v2t_r1=41.0)})
    b = run({"msrvtt_1ka_retrieval": task("msrvtt", 44.0, frame_sampling="uniform"),
             "icsvr_msrvtt_shuf": task("msrvtt", 43.0, "shuf", frame_sampling="uniform")}, dtype="float32")
    md = report([("A", a), ("B", b)]).splitlines()
    assert "msrvtt/test: **not like for like**: the runs differ in frame_sampling, dtype" in md
    t2v = md.index("text-to-video R@1:")
    # columns follow ICSVR's Table 1 (objrep before shuf) whatever the runs' order; B ran no objrep
    assert md[t2v + 2:t2v + 6] == ["| run | Q | Q_objrep | Q_shuf |", "|---|---|---|---|",
                                   "| A | 40.0 | 35.5 (-4.5) | 30.0 (-10.0) |", "| B | 44.0 | - | 43.0 (-1.0) |"]
    v2t = md.index("video-to-text R@1:")
    assert md[v2t + 4] == "| A | 42.0 | 41.0 (-1.0) | 33.0 (-9.0) |"
    same = report([("A", a), ("A2", a)])
    assert "not like for like" not in same and report([("gen", {"tasks": {"t": {"config": {}}}})]) == ""


def test_limited_galleries_are_another_dataset():
    small = task("msrvtt", 70.0)
    small["retrieval"]["gallery"] = {"n_videos": 6, "limited": "the first 6 of 1000 videos (--limit): not comparable"}
    small["documents_sha256"] = "msrvtt-first-6"
    md = report([("full", run({"m": task("msrvtt", 40.0)})), ("smoke", run({"m": small}))])
    assert "msrvtt/test:" in md and "msrvtt/test (first 6 videos):" in md
    assert "| full | 40.0 | 60.0 | 70.0 | 170.0 | - | - | - | - | none: 1 of 2 datasets |" in md


def test_two_tasks_for_one_caption_set_are_refused():
    twice = run({"a": task("msrvtt", 30.0, "shuf"), "b": task("msrvtt", 31.0, "shuf"), "o": task("msrvtt", 40.0)})
    with pytest.raises(UserError, match="run 'A' has tasks a and b for the same caption set Q_shuf of msrvtt/test"):
        report([("A", twice)])


def test_figures_only_for_the_ablations_that_were_run(tmp_path):
    a = run({"o": task("msrvtt", 40.0), "s": task("msrvtt", 30.0, "shuf"), "r": task("msrvtt", 32.0, "rev"),
             "x": task("msrvtt", 35.0, "objrep")})
    written = figures([("A", a), ("B", a)], tmp_path, "v2t")
    assert [p.name for p in written] == ["fig1_objects_msrvtt_test.png", "fig3_word_order_msrvtt_test.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    assert figures([("A", run({"o": task("msrvtt", 40.0)}))], tmp_path / "none") == []
