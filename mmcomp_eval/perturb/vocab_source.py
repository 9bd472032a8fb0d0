"""Where ``objrep`` / ``actrep`` replacement words come from, and the disk cache of their counts.

A caption's replacement must be a function of the caption, the seed and a
vocabulary fixed in advance, never of the other captions perturbed in the
same call. So the vocabulary is a :class:`VocabularySource` chosen once:

* a dataset (``mmcomp-eval perturb``, ``mmcomp-eval retrieval``, tasks on a
  caption dataset): every caption of every split in its data folder
  (:func:`dataset_vocabulary`, :mod:`mmcomp_eval.data.caption_texts`), the
  same whichever split, ``--limit`` or subset is perturbed;
* any other texts the caller names (``vocabulary=[...]`` in the Python API; a
  user task file: the perturbed field over the whole evaluation split).

Building it takes one spaCy parse of every distinct text (MSVD: 62k captions,
about a minute on two cores), so the form counts are cached under
``<cache>/perturb_vocab/<key>.json``, the key hashing the texts themselves
(so the same captions in another file or folder hit the cache and an edited
file misses it), the spaCy pipeline's name and version and the spaCy
version, the POS tags that feed the vocabulary and the format version. The
role mapping (``pos_roles``) is not part of the key: the vocabulary is read
from ``NOUN`` and ``VERB`` tags, which every mapping treats the same. Nor is
the lexicon: its filter is applied when the cached counts are loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval import paths
from mmcomp_eval.perturb.nlp import parse_captions, pipeline_identity
from mmcomp_eval.perturb.vocab import VOCAB_POS, FormCounts

#: bump when the cached content or its meaning changes
CACHE_FORMAT = 1


@dataclass(frozen=True)
class VocabularySource:
    """Texts whose nouns and verbs are the replacement vocabulary, and what they are, for reports."""

    texts: tuple[str, ...]
    #: e.g. "msrvtt: 1000 distinct captions of MSRVTT_JSFUSION_test.csv"
    description: str


@dataclass(frozen=True)
class BuiltCounts:
    counts: FormCounts
    #: cache file name stem: identifies the texts and the pipeline
    key: str
    n_texts: int
    #: how long the parse took when the counts were built (cached counts keep that number)
    build_seconds: float
    #: whether this call read them from the cache
    cached: bool


def dataset_vocabulary(name: str, data_dir: Path | str | None = None) -> VocabularySource:
    """Every caption of dataset ``name`` in its data folder, all splits together."""
    from mmcomp_eval.data.caption_texts import load_dataset_texts

    found = load_dataset_texts(name, data_dir)
    files = ", ".join(Path(s).name for s in found.sources)
    return VocabularySource(found.texts, f"{name}: all {len(found.texts)} distinct captions of {files} "
                                         f"in {Path(found.sources[0]).parent}")


def _normalise(texts: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(t for t in (" ".join(str(x).split()) for x in texts) if t))


def cache_key(texts: Sequence[str], nlp) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "pipeline": pipeline_identity(nlp),
                         "pos": sorted(VOCAB_POS)}, sort_keys=True).encode())
    for text in texts:
        h.update(text.encode("utf-8") + b"\n")  # normalised texts hold no newline
    return h.hexdigest()[:24]


def build_counts(source: VocabularySource, nlp, *, batch_size: int = 256, cache_root: Path | None = None,
                 use_cache: bool = True) -> BuiltCounts:
    """The source's form counts: from the cache, else one parse of its distinct texts (then cached)."""
    texts = _normalise(source.texts)
    key = cache_key(texts, nlp)
    path = (cache_root or paths.cache_dir() / "perturb_vocab") / f"{key}.json"
    if use_cache and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return BuiltCounts(FormCounts.from_rows(data["counts"]), key, data["n_texts"], data["build_seconds"],
                               cached=True)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache file is rebuilt and replaced
    started = time.perf_counter()
    counts = FormCounts.from_parsed(parse_captions(nlp, texts, batch_size=batch_size))
    seconds = round(time.perf_counter() - started, 3)
    if use_cache:
        _write_atomically(path, {"format": CACHE_FORMAT, "pipeline": pipeline_identity(nlp),
                                 "description": source.description, "n_texts": len(texts),
                                 "build_seconds": seconds, "counts": counts.to_rows()})
    return BuiltCounts(counts, key, len(texts), seconds, cached=False)


def _write_atomically(path: Path, data: dict) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    except OSError:
        return  # a read-only cache only costs a rebuild next time
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
