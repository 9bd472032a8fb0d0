"""Parsed captions and the POS -> role mappings every perturbation shares.

ICSVR (section 4.3): "We use spacy to identify parts-of-speech ... We consider
nouns, adverbs and adjectives as objects & attributes, verbs as actions and
the rest of the parts-of-speech as syntax." Read with spaCy's coarse
(Universal Dependencies) tags, that is the ``paper`` mapping, the default:

* ``NOUN`` -> *object*; ``ADJ``, ``ADV`` -> *attribute* (nouns are what
  ``objshift``, ``objrep`` and ``objpartial`` move, replace and halve; the
  paper's Table 1 leaves "red" in place under all three);
* ``VERB`` -> *action*;
* everything else is *syntax*: determiners, pronouns, adpositions,
  conjunctions, particles, punctuation, and also ``PROPN`` (proper nouns),
  ``NUM`` (numerals) and ``AUX`` (auxiliaries), which spaCy tags apart from
  ``NOUN``, ``ADJ`` and ``VERB``. The paper says nothing about auxiliaries
  beyond "verbs as actions"; in its Table 1 example there are none. With
  spaCy's tags "is" in "a man is talking" is ``AUX``, so ``actrem`` gives "a
  man is" and ``actneg`` "a man is not talking": the action is "talking".

The ``extended`` mapping (an option) also counts ``PROPN`` as objects ("obama
gives a speech": a visible person, moved and replaced like other nouns) and
``NUM`` as attributes ("two men": how many objects the video shows, removed
by ``objattrrem`` and kept by ``synrem``; numerals are never moved or
replaced). ``AUX`` is syntax in both. On the MSRVTT 1k-A test captions the
two mappings give different outputs for a sixth of the captions under
``objattrrem`` and ``synrem`` (docs/retrieval.md has the counts per kind).

A caption is parsed once into :class:`ParsedCaption` (plain tuples, not spaCy
objects, so they are cheap to keep for a whole dataset) and the ten
perturbations read that one parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from mmcomp_eval.errors import UserError, did_you_mean

OBJECT, ATTRIBUTE, ACTION, SYNTAX = "object", "attribute", "action", "syntax"

#: spaCy coarse POS -> role as ICSVR section 4.3 states it; anything not listed is syntax.
PAPER_ROLES: Mapping[str, str] = {"NOUN": OBJECT, "ADJ": ATTRIBUTE, "ADV": ATTRIBUTE, "VERB": ACTION}
#: the paper's mapping plus proper nouns as objects and numerals as attributes
EXTENDED_ROLES: Mapping[str, str] = {**PAPER_ROLES, "PROPN": OBJECT, "NUM": ATTRIBUTE}
#: name (``pos_roles`` option) -> mapping
POS_ROLES: Mapping[str, Mapping[str, str]] = {"paper": PAPER_ROLES, "extended": EXTENDED_ROLES}
DEFAULT_POS_ROLES = "paper"


def role_mapping(name: str) -> Mapping[str, str]:
    """The named mapping, or a one-line error listing the names."""
    if name not in POS_ROLES:
        raise UserError(f"pos_roles {name!r} is not one of {', '.join(POS_ROLES)}{did_you_mean(name, POS_ROLES)}")
    return POS_ROLES[name]


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


def make_tok(text: str, ws: str, pos: str, tag: str, lemma: str, roles: Mapping[str, str] = PAPER_ROLES) -> Tok:
    """A token with its role looked up once, at parse time."""
    return Tok(text, ws, pos, tag, lemma, roles.get(pos, SYNTAX))


@dataclass(frozen=True)
class ParsedCaption:
    text: str
    tokens: tuple[Tok, ...]

    def indices(self, *roles: str) -> list[int]:
        return [i for i, t in enumerate(self.tokens) if t.role in roles]
