"""CompAct instances: windowing, de-duplication, the noun filter, normalisation, errors."""

from __future__ import annotations

import json
import os
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import annotation_row, write_annotations, write_synthetic_ek100
from mmcomp_eval.data import ek100
from mmcomp_eval.data.compact_build import BuildParams, build_compact, load_split
from mmcomp_eval.data.compact_windows import (
    DROP_MISSING_TEXT, DROP_NOUN_NOT_IN_CONTEXT, WindowStats, _join_phrases, build_windows, order_and_deduplicate)
from mmcomp_eval.data.vocab import CategoryIndex
from mmcomp_eval.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _instances(d):
    index = CategoryIndex.from_dir(d)
    files = ek100.locate(d)
    clips = (ek100.read_clips(files.train, set(index.verbs), set(index.nouns))
             + ek100.read_clips(files.validation, set(index.verbs), set(index.nouns)))
    stats = WindowStats()
    return build_windows(order_and_deduplicate(clips, stats), index, stats), stats


def test_windows_dedup_noun_filter_and_missing_text(tiny_ek100):
    rows, stats = _instances(tiny_ek100)
    # P01_01 keeps 5 clips after dropping the repeated "wash knife": 2 windows.
    #   [pick up knife, wash knife, pick up chopping board, cut onion]  target noun onion not in context -> dropped
    #   [wash knife, pick up chopping board, cut onion, put down knife] target noun knife in context -> kept
    # P02_01 has 4 clips, one without text: its only window is dropped.
    assert stats.duplicate_clips_dropped == 1
    assert stats.windows_considered == 3
    assert stats.dropped == {DROP_NOUN_NOT_IN_CONTEXT: 1, DROP_MISSING_TEXT: 1}
    assert [r["id"] for r in rows] == ["P01_01_1-3-4-5"]
    r = rows[0]
    assert r["src"] == "wash knife . pick_up chopping_board . cut onion"
    assert (r["src1"], r["src2"], r["src3"]) == ("wash knife", "pick_up chopping_board", "cut onion")
    assert r["trg"] == "put_down knife"
    assert r["trg_narration"] == "put down knife"
    assert r["verbs"] == ["wash", "pick_up", "cut", "put_down"]
    assert r["nouns"] == ["knife", "chopping_board", "onion", "knife"]
    assert r["verbs_raw"][1] == "pick-up" and r["nouns_raw"][1] == "board:chopping"
    assert (r["trg_verb"], r["trg_noun"], r["trg_verb_class"], r["trg_noun_class"]) == ("put_down", "knife", 1, 1)
    assert r["narration_ids"] == ["P01_01_1", "P01_01_3", "P01_01_4", "P01_01_5"]
    assert r["start_frames"] == [100, 300, 400, 500]


def test_clips_are_ordered_by_time_not_file_order(tmp_path):
    from conftest import write_classes
    d = tmp_path / "ek"
    d.mkdir()
    write_classes(d)
    rows = [annotation_row("P03_01", i, n, v, vc, no, nc, start=s) for i, (n, v, vc, no, nc, s) in enumerate([
        ("put down knife", "put-down", 1, "knife", 1, 900),   # last in time
        ("take knife", "take", 0, "knife", 1, 100),
        ("cut onion", "cut", 5, "onion", 4, 300),
        ("wash knife", "wash", 2, "knife", 1, 500),
    ])]
    write_annotations(d / "EPIC_100_train.csv", rows)
    write_annotations(d / "EPIC_100_validation.csv", [])
    out, _ = _instances(d)
    assert [r["trg_narration"] for r in out] == ["put down knife"]
    assert out[0]["src"] == "take knife . cut onion . wash knife"


def test_normalisation_without_verb_and_noun_columns(tmp_path):
    """Reconstructed rows lack verb/noun text: the class tables find the phrases."""
    from conftest import write_classes
    d = tmp_path / "ek"
    d.mkdir()
    write_classes(d)
    write_annotations(d / "EPIC_100_train.csv", [
        annotation_row("P04_01", 0, "pick up chopping board", None, 0, None, 2),
        annotation_row("P04_01", 1, "pour olive oil", None, 1, None, 5),
        annotation_row("P04_01", 2, "wash boards", None, 2, None, 2),
        annotation_row("P04_01", 3, "put down chopping boards", None, 1, None, 2),
    ])
    write_annotations(d / "EPIC_100_validation.csv", [])
    (r,), _ = _instances(d)
    assert r["src1"] == "pick_up chopping_board"
    assert r["src2"] == "pour olive_oil"
    assert r["trg"] == "put_down chopping_boards"
    assert r["verbs"][0] == "pick_up" and r["nouns"][0] == "chopping_board"


def test_extra_columns_and_reconstructed_train_name_are_accepted(tiny_ek100):
    src = tiny_ek100 / "EPIC_100_train.csv"
    text = src.read_text().splitlines()
    text = [text[0] + ",id_source,text_source"] + [line + ",x," for line in text[1:]]
    (tiny_ek100 / "EPIC_100_train_reconstructed.csv").write_text("\n".join(text) + "\n")
    src.unlink()
    rows, _ = _instances(tiny_ek100)
    assert [r["id"] for r in rows] == ["P01_01_1-3-4-5"]


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("verb_class", "verb_klass"), "missing column(s) verb_class"),
    (lambda t: t.replace(",2,knife,1,", ",two,knife,1,", 1), "column 'verb_class' is 'two'"),
    (lambda t: t.replace(",5,onion,4,", ",5,onion,99,", 1), "column 'noun_class' is 99"),
])
def test_bad_annotation_file_names_file_row_and_column(tiny_ek100, mutate, message):
    f = tiny_ek100 / "EPIC_100_train.csv"
    f.write_text(mutate(f.read_text()))
    with pytest.raises(UserError) as err:
        build_compact(tiny_ek100, BuildParams(target_size=3))
    assert message in str(err.value)
    assert str(f) in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_and_offline_download_errors(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="no EPIC_100_train.csv"):
        ek100.locate(tmp_path)
    monkeypatch.delenv("MMCOMP_DATA_DIR", raising=False)
    with pytest.raises(UserError, match="--ek100-dir"):
        ek100.locate(None, offline=True)


def test_build_is_deterministic_disjoint_cached(tmp_path):
    d = write_synthetic_ek100(tmp_path / "ek")
    params = BuildParams(seed=3, target_size=300, min_compound_divergence=0.0, max_atom_divergence=0.1)
    a = build_compact(d, params, cache_root=tmp_path / "c1")
    b = build_compact(d, params, cache_root=tmp_path / "c2")
    assert not a.cached and not b.cached
    for kind in ("compositional", "random"):
        ids = {s: [r["id"] for r in load_split(a.directory, kind, s)] for s in ("train", "validation", "test")}
        assert ids == {s: [r["id"] for r in load_split(b.directory, kind, s)] for s in ids}
        all_ids = [i for s in ids.values() for i in s]
        assert len(all_ids) == len(set(all_ids)) == 300
        assert abs(len(ids["validation"]) - len(ids["test"])) <= 1
    assert {r["id"] for s in ("train", "validation", "test") for r in load_split(a.directory, "random", s)} == \
        {r["id"] for s in ("train", "validation", "test") for r in load_split(a.directory, "compositional", s)}
    again = build_compact(d, params, cache_root=tmp_path / "c1")
    assert again.cached and again.directory == a.directory
    other = build_compact(d, BuildParams(seed=4, target_size=300, min_compound_divergence=0.0,
                                         max_atom_divergence=0.1), cache_root=tmp_path / "c1")
    assert other.directory != a.directory
    assert [r["id"] for r in load_split(other.directory, "compositional", "train")] != \
        [r["id"] for r in load_split(a.directory, "compositional", "train")]
    stats = json.loads((a.directory / "stats.json").read_text())
    assert stats["compositional"]["sizes"]["train"] == len(load_split(a.directory, "compositional", "train"))
    _assert_pair_stats_match_the_files(a.directory, stats)


def _assert_pair_stats_match_the_files(directory, stats):
    """stats.json's D_A / D_C per pair, recomputed from the split files, and the verdicts from them."""
    from mmcomp_eval.data.mcd import atom_divergence, compound_divergence

    def atoms_of(r):
        return [*r["verb_classes"], *(1000 + n for n in r["noun_classes"])]

    def compounds_of(r):
        return [v * 1000 + n for v, n in zip(r["verb_classes"], r["noun_classes"])]

    for kind in ("compositional", "random"):
        rows = {s: load_split(directory, kind, s) for s in ("train", "validation", "test")}
        rows["heldout"] = rows["validation"] + rows["test"]
        for side in ("validation", "test", "heldout"):
            got = stats[kind][f"train_vs_{side}"]
            for name, of, fn in (("atom_divergence", atoms_of, atom_divergence),
                                 ("compound_divergence", compounds_of, compound_divergence)):
                u, w = (Counter(x for r in rows[s] for x in of(r)) for s in ("train", side))
                keys = sorted(set(u) | set(w))
                assert got[name] == pytest.approx(fn([u[k] for k in keys], [w[k] for k in keys]), abs=1e-6)
            assert got["meets_paper_targets"] == (got["atom_divergence"] < 0.02 and got["compound_divergence"] > 0.6)
        assert stats[kind]["meets_paper_targets"] == all(
            stats[kind][p]["meets_paper_targets"] for p in ("train_vs_validation", "train_vs_test"))


def test_overlapping_phrases_keep_the_annotation_order():
    """Equal-length phrases are joined in the order given (verb, then nouns, main noun first)."""
    words = "wipe top of clip top jar".split()
    assert _join_phrases(words, ["wipe", "clip top", "top jar"]) == "wipe top of clip_top jar"
    assert _join_phrases(words, ["wipe", "top jar", "clip top"]) == "wipe top of clip top_jar"
    assert _join_phrases(words, ["top jar", "clip top jar"]) == "wipe top of clip_top_jar"  # longest first


def test_build_is_byte_identical_under_any_hash_seed(tmp_path):
    """Two processes with different PYTHONHASHSEED build the same files (set order once decided a `trg`)."""
    d = write_synthetic_ek100(tmp_path / "ek", n_videos=12, overlapping_phrases=True)
    outputs = []
    for hash_seed in ("1", "2"):  # these two order {"clip top", "top jar"} differently
        out = tmp_path / f"out{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "MMCOMP_CACHE_DIR": str(tmp_path / f"cache{hash_seed}"),
               "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "mmcomp_eval", "data", "build", "compact", "--ek100-dir", str(d),
                               "--target-size", "200", "--max-atom-divergence", "0.1", "--output-dir", str(out)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "| D_A train-val / train-test | D_C train-val / train-test |" in proc.stdout
        outputs.append(out)
    files = sorted(p.relative_to(outputs[0]) for p in outputs[0].rglob("*.jsonl"))
    assert len(files) == 6
    for f in files:
        assert (outputs[0] / f).read_bytes() == (outputs[1] / f).read_bytes(), f
    trg = [json.loads(line)["trg"] for line in (outputs[0] / "compositional" / "train.jsonl").open()]
    assert trg and all(t.endswith("clip_top jar") for t in trg)
    stats = [json.loads((o / "stats.json").read_text()) for o in outputs]
    for s in stats:
        del s["build_seconds"]
    assert stats[0] == stats[1]


def test_reference_windows_identical_under_any_hash_seed(reference_ek100):
    """Every window's text (the splits' content; the split itself is numpy arithmetic) under two hash seeds."""
    script = ("import hashlib, json, sys; from tests.test_compact_data import _instances; "
              "rows, _ = _instances(__import__('pathlib').Path(sys.argv[1])); "
              "print(len(rows), hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest())")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(reference_ek100)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"})
             for seed in ("1", "2")]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and outs[0].startswith("30283 ")


def test_heldout_split_choice(tmp_path):
    """`random` halves the held-out side afterwards (the paper); `greedy` (default) is another greedy run."""
    d = write_synthetic_ek100(tmp_path / "ek")
    base = {"seed": 3, "target_size": 300, "max_atom_divergence": 0.1}
    greedy = build_compact(d, BuildParams(**base), cache_root=tmp_path / "c")
    halved = build_compact(d, BuildParams(**base, heldout_split="random"), cache_root=tmp_path / "c")
    assert greedy.stats["params"]["heldout_split"] == "greedy" and halved.stats["params"]["heldout_split"] == "random"
    ids = {r.directory: [r_["id"] for r_ in load_split(r.directory, "compositional", "test")] for r in (greedy, halved)}
    assert ids[greedy.directory] != ids[halved.directory]
    sizes = greedy.stats["compositional"]["sizes"]
    assert sum(sizes.values()) == 300 and abs(sizes["validation"] - sizes["test"]) <= 1
    _assert_pair_stats_match_the_files(halved.directory, halved.stats)
    with pytest.raises(UserError, match="--heldout-split 'halves': expected 'greedy' or 'random'"):
        build_compact(d, BuildParams(heldout_split="halves"), cache_root=tmp_path / "c")


def test_failed_build_leaves_no_cache_entry(tmp_path):
    d = write_synthetic_ek100(tmp_path / "ek", n_videos=2, clips=10)
    with pytest.raises(UserError, match="--target-size"):
        build_compact(d, BuildParams(target_size=10_000), cache_root=tmp_path / "c")
    assert list((tmp_path / "c").glob("*")) == [] if (tmp_path / "c").exists() else True


def test_reference_build_sizes_divergences_and_premise(reference_ek100):
    """The full build over the reference EK-100 annotations (cached for the session)."""
    result = build_compact(reference_ek100)
    s = result.stats
    assert s["windows"]["windows_considered"] == 71658
    assert s["windows"]["windows_kept"] == s["pool_size"] > 25_000
    comp, rnd = s["compositional"], s["random"]
    assert sum(comp["sizes"].values()) == sum(rnd["sizes"].values()) == 8766  # the paper's size
    assert comp["sizes"] == rnd["sizes"]
    assert abs(comp["sizes"]["validation"] - comp["sizes"]["test"]) <= 1
    assert 4000 < comp["sizes"]["train"] < 4800  # random side choice: about half (paper: 4,407)
    # The paper's criteria hold for each evaluation split on its own, not only for their union
    # (builder 2 halved the held-out set at random afterwards: train vs test had D_A 0.0236).
    assert s["paper_targets"]["checked_pairs"] == ["train_vs_validation", "train_vs_test"]
    assert comp["meets_paper_targets"]
    for pair in ("train_vs_validation", "train_vs_test", "train_vs_heldout"):
        assert comp[pair]["meets_paper_targets"], pair
        assert comp[pair]["atom_divergence"] <= 0.02 and comp[pair]["compound_divergence"] > 0.6, pair
        assert rnd[pair]["compound_divergence"] < 0.2 and not rnd[pair]["meets_paper_targets"]
    # the compositional split holds far fewer test targets seen as train targets than the random one
    seen_comp = comp["test_target_compounds"]["seen_as_train_target_pct"]
    seen_rnd = rnd["test_target_compounds"]["seen_as_train_target_pct"]
    assert seen_comp < 25 and seen_rnd > 70
    assert comp["test_target_compounds"]["both_atoms_seen_in_train_pct"] > 99
