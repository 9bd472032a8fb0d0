"""Parsed captions and the POS -> role mapping every perturbation shares.

ICSVR (section 4.3): "nouns, adverbs and adjectives as objects & attributes,
verbs as actions and the rest of the parts-of-speech as syntax". The
decisions the paper leaves open, made here once for all ten perturbations:

* **Proper nouns** (spaCy ``PROPN``) are *objects*, like common nouns: in
  captions they name things that are visible ("a boy plays minecraft",
  "obama gives a speech"), and Penn's noun tags (NN, NNS, NNP, NNPS) all count
  as nouns. They are moved, replaced and halved like other objects.
* **Numerals** (``NUM``: "two men", "5") are *attributes*: they describe how
  many objects the video shows, so they go with the objects under
  ``objattrrem`` and stay under ``synrem``. They are not objects: ``objshift``,
  ``objrep`` and ``objpartial`` leave them in place.
* **Auxiliaries** (``AUX``: "is" in "is talking", "does", copular "is") are
  *syntax*, not actions: the action is "talking"; "is" only carries tense and
  aspect. So ``actrem`` turns "a man is talking" into "a man is" and
  ``actneg`` into "a man is not talking". A main-verb "has"/"does" is tagged
  ``VERB`` by spaCy and is an action.
* Everything else (determiners, pronouns, adpositions, conjunctions,
  particles, punctuation) is *syntax*.

A caption is parsed once into :class:`ParsedCaption` (plain tuples, not spaCy
objects, so they are cheap to keep for a whole dataset) and the ten
perturbations and the replacement vocabulary all read that one parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

OBJECT, ATTRIBUTE, ACTION, SYNTAX = "object", "attribute", "action", "syntax"

#: spaCy coarse POS (Universal Dependencies) -> role; anything not listed is syntax.
ROLE_OF_POS = {
    "NOUN": OBJECT, "PROPN": OBJECT,
    "ADJ": ATTRIBUTE, "ADV": ATTRIBUTE, "NUM": ATTRIBUTE,
    "VERB": ACTION,
}


class Tok(NamedTuple):
    text: str
    #: whitespace after the token in the original caption ("" or " ")
    ws: str
    #: coarse POS (``NOUN``), fine Penn tag (``NNS``), lemma as spaCy gives it
    pos: str
    tag: str
    lemma: str
    #: object, attribute, action or syntax (from ``pos``; see :func:`make_tok`)
    role: str = SYNTAX

    @property
    def is_space(self) -> bool:
        return not self.text.strip()


def make_tok(text: str, ws: str, pos: str, tag: str, lemma: str) -> Tok:
    """A token with its role looked up once, at parse time."""
    return Tok(text, ws, pos, tag, lemma, ROLE_OF_POS.get(pos, SYNTAX))


@dataclass(frozen=True)
class ParsedCaption:
    text: str
    tokens: tuple[Tok, ...]

    def indices(self, *roles: str) -> list[int]:
        return [i for i, t in enumerate(self.tokens) if t.role in roles]
