"""Perturbing a set of captions: one parse, one fixed vocabulary, ten perturbations.

The expensive step is the spaCy parse, so it runs once per distinct caption
(batched ``nlp.pipe``) and every perturbation reads the same
:class:`ParsedCaption`. Randomness is per caption: each (seed, kind, caption
key) gets its own :class:`random.Random` seeded from that string (Python
hashes string seeds with SHA-512, independent of ``PYTHONHASHSEED``). A
caption's key is its id where the caller gives ids (datasets, task
documents), else its own text. Replacement words come from a vocabulary fixed
before the call (:mod:`~mmcomp_eval.perturb.vocab_source`). So a caption's
output depends only on (caption key, caption, seed, kind, vocabulary, role
mapping, spaCy pipeline, lexicon): not on which other kinds were asked for,
not on batch sizes, not on which other captions are perturbed with it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmcomp_eval.errors import UserError
from mmcomp_eval.perturb.kinds import KINDS, PERTURBATIONS, USES_VOCABULARY
from mmcomp_eval.perturb.lexicon import Lexicon, load_lexicon
from mmcomp_eval.perturb.nlp import DEFAULT_SPACY_MODEL, load_spacy, parse_captions, pipeline_name
from mmcomp_eval.perturb.tokens import DEFAULT_POS_ROLES, ParsedCaption, role_mapping
from mmcomp_eval.perturb.vocab import FormCounts, Replacer, Vocabulary
from mmcomp_eval.perturb.vocab_source import VocabularySource, build_counts


def resolve_kinds(kinds: str | Iterable[str]) -> tuple[str, ...]:
    """Canonical kind names in the given order; ``all`` means the ten in the paper's order."""
    names = [kinds] if isinstance(kinds, str) else list(kinds)
    out: list[str] = []
    for name in names:
        for k in (KINDS if name == "all" else (PERTURBATIONS.canonical(name),)):
            if k not in out:
                out.append(k)
    if not out:
        raise UserError(f"no perturbation kind given; choose from all, {', '.join(KINDS)}")
    return tuple(out)


def caption_rng(seed: int, kind: str, key: str) -> random.Random:
    return random.Random(f"{seed}:{kind}:{key}")


@dataclass(frozen=True)
class PerturbationResult:
    kind: str
    #: perturbed captions, aligned with the input captions
    captions: tuple[str, ...]
    #: positions whose caption came out exactly as it went in
    unchanged: tuple[int, ...]
    #: positions whose caption came out empty (e.g. "cars" under objattrrem)
    empty: tuple[int, ...]

    @property
    def n_unchanged(self) -> int:
        return len(self.unchanged)


@dataclass(frozen=True)
class PerturbationRun:
    originals: tuple[str, ...]
    keys: tuple[str, ...]
    seed: int
    #: what tagged the captions and what filtered replacements, for reports
    spacy_model: str
    lexicon: str
    #: the POS -> role mapping (``paper`` or ``extended``, see :mod:`~mmcomp_eval.perturb.tokens`)
    pos_roles: str
    #: where ``objrep`` / ``actrep`` words came from: source, sizes, cache key
    vocabulary: dict[str, Any]
    results: dict[str, PerturbationResult] = field(default_factory=dict)

    def __getitem__(self, kind: str) -> PerturbationResult:
        return self.results[PERTURBATIONS.canonical(kind)]

    def settings(self) -> dict[str, Any]:
        """What decides the outputs besides the captions and kinds: for results files."""
        return {"seed": self.seed, "spacy_model": self.spacy_model, "lexicon": self.lexicon,
                "pos_roles": self.pos_roles, "vocabulary": self.vocabulary}


class CaptionPerturber:
    """Parsed captions plus a replacement vocabulary; applies any kind with any seed."""

    def __init__(self, parsed: Sequence[ParsedCaption], vocabulary: Vocabulary):
        self.parsed = list(parsed)
        self.replacer = Replacer(vocabulary)

    def apply(self, kind: str, seed: int, keys: Sequence[str]) -> PerturbationResult:
        fn = PERTURBATIONS.get(kind)
        kind = PERTURBATIONS.canonical(kind)
        out, unchanged, empty = [], [], []
        for i, (caption, key) in enumerate(zip(self.parsed, keys, strict=True)):
            text = fn(caption, caption_rng(seed, kind, key), self.replacer)
            out.append(text)
            if text == caption.text:
                unchanged.append(i)
            if not text.strip():
                empty.append(i)
        return PerturbationResult(kind, tuple(out), tuple(unchanged), tuple(empty))


def perturb_captions(captions: Sequence[str], kinds: str | Iterable[str] = "all", *, seed: int = 0,
                     keys: Sequence[str] | None = None, spacy_model: str = DEFAULT_SPACY_MODEL, nlp=None,
                     lexicon: str | Lexicon = "auto", pos_roles: str = DEFAULT_POS_ROLES,
                     vocabulary: VocabularySource | Sequence[str] | None = None,
                     batch_size: int = 256) -> PerturbationRun:
    """Apply perturbation ``kinds`` to ``captions``.

    ``keys`` name the captions for seeding; give stable ids
    (``CaptionDataset.caption_ids``) so that two captions with the same text
    can differ. Without ``keys`` a caption's text is its key (the same text is
    perturbed the same way wherever it appears). ``nlp`` overrides
    ``spacy_model`` with an already loaded pipeline. ``lexicon``: ``auto``
    (WordNet when available), ``wordnet``, ``none``, or a :class:`Lexicon`.
    ``pos_roles``: ``paper`` (ICSVR 4.3) or ``extended`` (proper nouns and
    numerals also objects/attributes). ``vocabulary``: where ``objrep`` and
    ``actrep`` draw words from: a :class:`VocabularySource` (e.g.
    :func:`~mmcomp_eval.perturb.vocab_source.dataset_vocabulary`), any texts,
    or None for ``captions`` themselves, which makes a caption's replacement
    depend on the other captions of the call.
    """
    kinds = resolve_kinds(kinds)
    roles = role_mapping(pos_roles)
    # Runs of whitespace become one space first: spaCy makes them SPACE tokens, which disturb the tagger
    # ("A woman   walks" tags "walks" as a noun). Outputs and "unchanged" refer to this normalised text.
    captions = [" ".join(str(c).split()) for c in captions]
    if keys is None:
        keys = captions
    else:
        keys = [str(k) for k in keys]
        if len(keys) != len(captions):
            raise ValueError(f"{len(keys)} keys for {len(captions)} captions")
        if len(set(keys)) != len(keys):
            raise UserError("caption keys must be unique: two captions share a key, so they would get one seed")
    lex = load_lexicon(lexicon) if isinstance(lexicon, str) else lexicon
    if nlp is None:
        nlp = load_spacy(spacy_model)
    else:
        spacy_model = pipeline_name(nlp)
    parsed = parse_captions(nlp, captions, batch_size=batch_size, roles=roles)
    if set(kinds) & set(USES_VOCABULARY):
        counts, vocab_info = _vocabulary_counts(vocabulary, parsed, nlp, batch_size)
        vocab = Vocabulary(counts, lex)
        vocab_info.update(noun_lemmas=len(vocab.lemmas("noun")), verb_lemmas=len(vocab.lemmas("verb")))
    else:  # no parse of a whole dataset for perturbations that replace nothing
        vocab, vocab_info = Vocabulary(FormCounts({}), lex), {"source": "not used (no objrep or actrep)"}
    perturber = CaptionPerturber(parsed, vocab)
    run = PerturbationRun(tuple(captions), tuple(keys), seed, spacy_model, lex.name, pos_roles, vocab_info)
    for kind in kinds:
        run.results[kind] = perturber.apply(kind, seed, keys)
    return run


def _vocabulary_counts(vocabulary: VocabularySource | Sequence[str] | None, parsed: Sequence[ParsedCaption], nlp,
                       batch_size: int) -> tuple[FormCounts, dict[str, Any]]:
    if vocabulary is None:
        counts = FormCounts.from_parsed(parsed)
        n = len({p.text for p in parsed})
        return counts, {"source": f"the {n} distinct captions perturbed together (no fixed vocabulary given)",
                        "n_texts": n}
    if not isinstance(vocabulary, VocabularySource):
        if isinstance(vocabulary, str):
            raise TypeError("vocabulary must be a VocabularySource or a sequence of texts, not one string")
        texts = tuple(vocabulary)
        vocabulary = VocabularySource(texts, f"{len(texts)} texts given by the caller")
    built = build_counts(vocabulary, nlp, batch_size=batch_size)
    return built.counts, {"source": vocabulary.description, "n_texts": built.n_texts, "cache_key": built.key,
                          "build_seconds": built.build_seconds}
