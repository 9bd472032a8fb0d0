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
from pathlib import Path

from mmcomp_eval import paths
from mmcomp_eval.data import ek100
from mmcomp_eval.data.category_rules import LEMMATIZERS, SOURCES, CategoryRules, Mapped, SpacyLemmas
from mmcomp_eval.data.category_tables import LearnedTables, cache_key, learn_tables, read_cache, write_cache
from mmcomp_eval.data.vocab import CategoryIndex

__all__ = ["CategoryMap", "Mapped", "LEMMATIZERS"]


class CategoryMap:
    """Maps prediction texts to EK-100 classes; see the module docstring for the tiers.

    The tiers themselves are :class:`~mmcomp_eval.data.category_rules.CategoryRules`
    (kept free of the rest of the package, so the lm-eval export can ship them);
    this class learns, caches and describes their tables.
    """

    def __init__(self, index: CategoryIndex, tables: LearnedTables | None = None, *,
                 cache_key: str | None = None, lemmatizers: tuple[str, ...] = LEMMATIZERS):
        self.index = index
        self.tables = tables or LearnedTables()
        self.cache_key = cache_key
        self.lemmas = SpacyLemmas(lemmatizers)
        self.rules = CategoryRules(narrations=self.tables.narrations, verbs=self.tables.verbs,
                                   verb_prefixes=self.tables.verb_prefixes, nouns=self.tables.nouns,
                                   verb_table=index.verb_table, noun_table=index.noun_table, lemmas=self.lemmas)

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
        return self.rules.action(text)

    def verb(self, text: str) -> Mapped:
        return self.rules.verb(text)

    def noun(self, text: str) -> Mapped:
        return self.rules.noun(text)

    def describe(self) -> dict:
        info = {"tiers": list(SOURCES), "annotations": self.tables.stats or None}
        if self.cache_key:
            info["cache_key"] = self.cache_key
        info["lemmatizer"] = self.lemmas.describe()
        return info
