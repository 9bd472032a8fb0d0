"""Every caption a dataset folder holds, over all its splits.

The ICSVR replacement perturbations (``objrep``, ``actrep``) draw words from
a fixed vocabulary, so that a caption's replacement does not depend on which
other captions are perturbed with it. For a dataset that vocabulary is this:
every caption text of every split whose file is in the data folder (MSRVTT:
the full ``MSRVTT_data.json`` with train, val and test captions, and the 1k-A
test file; MSVD: all 1,970 videos; DiDeMo, VATEX, Charades, LSMDC: whichever
of the train, val and test files are present). The split loaders are in
:mod:`mmcomp_eval.data.captions`; the file formats are read by the same helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval.data.captions import (LSMDC_FILES, dataset_dir, didemo_descriptions, lsmdc_pairs, msrvtt_sentences,
                                       read_csv)
from mmcomp_eval.textfiles import read_json
from mmcomp_eval.errors import UserError, did_you_mean


@dataclass(frozen=True)
class DatasetTexts:
    """Every caption text a dataset folder holds, over all its splits (the perturbation vocabulary's source)."""

    name: str
    #: distinct whitespace-normalised texts, in file order
    texts: tuple[str, ...]
    #: files read
    sources: tuple[str, ...]


def _first(d: Path, name: str, *candidates: str) -> list[Path]:
    """The first of ``candidates`` present in ``d`` or ``d/<name>``, as a 0- or 1-item list."""
    return [base / c for c in candidates for base in (d, d / name) if (base / c).is_file()][:1]


def _msrvtt_texts(d: Path) -> tuple[list[str], list[Path]]:
    """``MSRVTT_data.json`` (train, val and test captions of all videos) and the 1k-A test file, as present."""
    data, test = _first(d, "msrvtt", "MSRVTT_data.json"), _first(d, "msrvtt", "MSRVTT_JSFUSION_test.csv")
    texts = [c for path in data for _, c in msrvtt_sentences(path)]
    texts += [r["sentence"] for path in test for r in read_csv(path, ("video_id", "sentence"))]
    return texts, data + test


def _msvd_texts(d: Path) -> tuple[list[str], list[Path]]:
    """``captions_msvd.json``: the captions of all 1,970 videos, whichever split lists them."""
    paths = _first(d, "msvd", "captions_msvd.json")
    texts = []
    for path in paths:
        captions = read_json(path)
        if not isinstance(captions, dict):
            raise UserError(f"{path}: expected an object mapping video id -> list of captions")
        texts += [str(c) for caps in captions.values() for c in caps]
    return texts, paths


def _didemo_texts(d: Path) -> tuple[list[str], list[Path]]:
    """Each description (not the joined paragraphs) of the train, val and test files present."""
    paths = [p for split in ("train", "val", "test") for p in _first(d, "didemo", f"{split}_data.json")]
    return [text for p in paths for _, text in didemo_descriptions(p)], paths


def _vatex_texts(d: Path) -> tuple[list[str], list[Path]]:
    paths = [p for part in ("train", "val", "test") for p in _first(d, "vatex", f"{part}.en")]
    return [line for p in paths for line in p.read_text(encoding="utf-8").splitlines()], paths


def _charades_texts(d: Path) -> tuple[list[str], list[Path]]:
    paths = [p for split in ("train", "test") for p in _first(d, "charades", f"Charades_v1_{split}.csv")]
    return [t for p in paths for r in read_csv(p, ("id", "descriptions")) for t in r["descriptions"].split(";")], paths


def _lsmdc_texts(d: Path) -> tuple[list[str], list[Path]]:
    paths = [p for stem in LSMDC_FILES.values() for p in _first(d, "lsmdc", f"{stem}.csv", f"{stem}.tsv")]
    return [text for p in paths for _, text in lsmdc_pairs(p)], paths


#: dataset -> (reader of every caption in its folder, the files it looks for)
ALL_TEXTS: dict[str, tuple[Callable[[Path], tuple[list[str], list[Path]]], str]] = {
    "msrvtt": (_msrvtt_texts, "MSRVTT_data.json or MSRVTT_JSFUSION_test.csv"),
    "msvd": (_msvd_texts, "captions_msvd.json"),
    "didemo": (_didemo_texts, "train_data.json, val_data.json or test_data.json"),
    "vatex": (_vatex_texts, "train.en, val.en or test.en"),
    "charades": (_charades_texts, "Charades_v1_train.csv or Charades_v1_test.csv"),
    "lsmdc": (_lsmdc_texts, "the LSMDC16 .csv/.tsv files"),
}


def load_dataset_texts(name: str, data_dir: Path | str | None = None) -> DatasetTexts:
    """Every caption of dataset ``name`` found in its folder, all splits together (see :data:`ALL_TEXTS`)."""
    if name not in ALL_TEXTS:
        raise UserError(f"unknown caption dataset '{name}'{did_you_mean(name, ALL_TEXTS)}; "
                        f"known: {', '.join(sorted(ALL_TEXTS))}")
    d = dataset_dir(name, data_dir)
    read, expected = ALL_TEXTS[name]
    texts, paths = read(d)
    texts = list(dict.fromkeys(t for t in (" ".join(str(x).split()) for x in texts) if t))
    if not texts:
        raise UserError(f"{d}: no {name} captions found (looked for {expected}); put the files there or pass "
                        f"another data_dir")
    return DatasetTexts(name, tuple(texts), tuple(str(p) for p in paths))
