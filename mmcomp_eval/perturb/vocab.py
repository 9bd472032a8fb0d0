"""Replacement words for ``objrep`` and ``actrep``, from a fixed vocabulary.

ICSVR replaces objects and actions with other objects and actions; taking
them from the dataset's captions keeps replacements in the dataset's domain
("surf", "channel" in MSRVTT) rather than rare dictionary words.

* Where the words come from is the caller's choice (a
  :class:`~mmcomp_eval.perturb.vocab_source.VocabularySource`): for a
  dataset, every caption of every split in its data folder, so a caption's
  replacement never depends on which other captions are perturbed with it
  (``--limit``, a subset, one caption alone).
* The vocabulary is the set of lemmas of tokens tagged ``NOUN`` (objects'
  replacements; proper nouns, objects under the ``extended`` roles, are
  replaced but never used as replacements) and ``VERB`` (actions'
  replacements), restricted to plain lower-case words and, when a lexicon is
  available, to words it knows for that part of speech (this drops typos and
  mis-tagged tokens). It depends on the POS tags only, not on the role
  mapping, which treats ``NOUN`` and ``VERB`` alike in every mapping.
* A replacement is written in the surface form the source texts use most for
  that lemma with the original token's Penn tag ("drives" VBZ -> "removes",
  "guys" NNS -> "cars"), so no inflection rules are needed; forms are counted
  once per distinct caption text. Only lemmas seen with the tag are
  candidates; a tag the texts never show falls back to singular/base forms.
* Never the same lemma or surface word as the original, never a synonym or
  antonym of it (see :mod:`mmcomp_eval.perturb.lexicon`).
* Uniform over the allowed lemmas (types, not tokens), drawn from the
  caller's seeded RNG over a sorted list, so the same seed gives the same word.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from mmcomp_eval.perturb.lexicon import Lexicon, NoLexicon
from mmcomp_eval.perturb.tokens import ParsedCaption, Tok

#: spaCy POS -> vocabulary it feeds
VOCAB_POS = {"NOUN": "noun", "VERB": "verb"}
#: which vocabulary replaces a token with this POS
REPLACE_FROM = {"NOUN": "noun", "PROPN": "noun", "VERB": "verb"}
#: a tag the dataset never shows for the vocabulary -> the tag whose forms to use instead
TAG_FALLBACK = {"NNP": "NN", "NNPS": "NNS"}
_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")
_REJECTION_TRIES = 32

#: (kind, Penn tag) -> lemma -> surface form -> count
Counts = dict[tuple[str, str], dict[str, Counter]]


@dataclass(frozen=True)
class FormCounts:
    """How often each surface form of each noun and verb lemma appears, per Penn tag.

    What a :class:`Vocabulary` is built from, and what the on-disk cache
    stores: it depends only on the texts and the spaCy pipeline, not on the
    lexicon, so one parse serves every ``--lexicon``.
    """

    counts: Counts

    @classmethod
    def from_parsed(cls, parsed: Iterable[ParsedCaption]) -> FormCounts:
        counts: Counts = defaultdict(lambda: defaultdict(Counter))
        seen: set[str] = set()
        for caption in parsed:
            if caption.text in seen:
                continue
            seen.add(caption.text)
            for tok in caption.tokens:
                kind = VOCAB_POS.get(tok.pos)
                lemma, form = tok.lemma.lower(), tok.text.lower()
                if kind and _WORD.fullmatch(lemma) and _WORD.fullmatch(form) and len(lemma) > 1:
                    counts[(kind, tok.tag)][lemma][form] += 1
        return cls({key: dict(lemmas) for key, lemmas in counts.items()})

    def to_rows(self) -> list[list]:
        """``[kind, tag, lemma, form, count]`` rows in sorted order (JSON-friendly, byte-stable)."""
        return sorted([kind, tag, lemma, form, n] for (kind, tag), lemmas in self.counts.items()
                      for lemma, forms in lemmas.items() for form, n in forms.items())

    @classmethod
    def from_rows(cls, rows: Iterable[list]) -> FormCounts:
        counts: Counts = defaultdict(lambda: defaultdict(Counter))
        for kind, tag, lemma, form, n in rows:
            counts[(kind, tag)][lemma][form] += n
        return cls({key: dict(lemmas) for key, lemmas in counts.items()})


class Vocabulary:
    """Lemma -> most frequent surface form per Penn tag, for nouns and verbs."""

    def __init__(self, counts: FormCounts, lexicon: Lexicon | None = None):
        self.lexicon = lexicon or NoLexicon()
        known: dict[tuple[str, str], bool] = {}
        #: (kind, tag) -> {lemma: form}, only lemmas the lexicon knows
        self.forms: dict[tuple[str, str], dict[str, str]] = {}
        for key, lemmas in counts.counts.items():
            kept = {}
            for lemma, forms in lemmas.items():
                ok = known.get((key[0], lemma))
                if ok is None:
                    ok = known[(key[0], lemma)] = self.lexicon.knows(lemma, key[0])
                if ok:
                    # most frequent form; ties broken alphabetically for determinism
                    kept[lemma] = min(forms.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            if kept:
                self.forms[key] = kept
        self._candidates: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}

    def lemmas(self, kind: str) -> set[str]:
        return {lemma for (k, _), forms in self.forms.items() if k == kind for lemma in forms}

    def candidates(self, kind: str, tag: str) -> tuple[tuple[str, str], ...]:
        """Sorted (lemma, form) pairs that can stand in a slot with this tag."""
        key = (kind, tag)
        if key not in self._candidates:
            forms = self.forms.get(key) or self.forms.get((kind, TAG_FALLBACK.get(tag, ""))) or {
                lemma: lemma for lemma in self.lemmas(kind)}
            self._candidates[key] = tuple(sorted(forms.items()))
        return self._candidates[key]


class Replacer:
    """Draws a replacement word for one token (or None when nothing is allowed)."""

    def __init__(self, vocabulary: Vocabulary):
        self.vocabulary = vocabulary
        self.lexicon = vocabulary.lexicon

    def replace(self, tok: Tok, rng: random.Random) -> str | None:
        kind = REPLACE_FROM[tok.pos]
        pool = self.vocabulary.candidates(kind, tok.tag)
        if not pool:
            return None
        banned = self.lexicon.related(tok.lemma.lower(), kind)
        original = tok.text.lower()

        def allowed(pair: tuple[str, str]) -> bool:
            return pair[0] not in banned and pair[1] != original

        # Rejection sampling is uniform over the allowed set and avoids filtering the whole pool per token.
        for _ in range(_REJECTION_TRIES):
            pair = pool[rng.randrange(len(pool))]
            if allowed(pair):
                return _match_case(pair[1], tok.text)
        rest = [p for p in pool if allowed(p)]
        return _match_case(rng.choice(rest)[1], tok.text) if rest else None


def _match_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word
