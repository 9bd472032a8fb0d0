"""Perturbing a set of captions: one parse, one vocabulary, ten perturbations.

The expensive step is the spaCy parse, so it runs once per distinct caption
(batched ``nlp.pipe``) and every perturbation reads the same
:class:`ParsedCaption`. Randomness is per caption: each (seed, kind, caption
key) gets its own :class:`random.Random` seeded from that string (Python
hashes string seeds with SHA-512, independent of ``PYTHONHASHSEED``), so a
caption's perturbation does not depend on which other kinds were asked for,
on batch sizes, or on the other captions beyond the shared vocabulary. The
same captions, keys and seed always give the same output.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mmcomp_eval.errors import UserError
from mmcomp_eval.perturb.kinds import KINDS, PERTURBATIONS
from mmcomp_eval.perturb.lexicon import Lexicon, load_lexicon
from mmcomp_eval.perturb.nlp import DEFAULT_SPACY_MODEL, load_spacy, parse_captions
from mmcomp_eval.perturb.tokens import ParsedCaption
from mmcomp_eval.perturb.vocab import Replacer, Vocabulary


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
    results: dict[str, PerturbationResult] = field(default_factory=dict)

    def __getitem__(self, kind: str) -> PerturbationResult:
        return self.results[PERTURBATIONS.canonical(kind)]


class CaptionPerturber:
    """Parsed captions plus their replacement vocabulary; applies any kind with any seed."""

    def __init__(self, parsed: Sequence[ParsedCaption], lexicon: Lexicon):
        self.parsed = list(parsed)
        self.lexicon = lexicon
        self.replacer = Replacer(Vocabulary(self.parsed, lexicon))

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
                     lexicon: str | Lexicon = "auto", batch_size: int = 256) -> PerturbationRun:
    """Apply perturbation ``kinds`` to ``captions``.

    ``keys`` name the captions for seeding (default: their positions); give
    stable ids (``CaptionDataset.caption_ids``) so that reordering a dataset
    does not change how each caption is perturbed. ``nlp`` overrides
    ``spacy_model`` with an already loaded pipeline. ``lexicon``: ``auto``
    (WordNet when available), ``wordnet``, ``none``, or a :class:`Lexicon`.
    """
    kinds = resolve_kinds(kinds)
    # Runs of whitespace become one space first: spaCy makes them SPACE tokens, which disturb the tagger
    # ("A woman   walks" tags "walks" as a noun). Outputs and "unchanged" refer to this normalised text.
    captions = [" ".join(str(c).split()) for c in captions]
    keys = [str(i) for i in range(len(captions))] if keys is None else [str(k) for k in keys]
    if len(keys) != len(captions):
        raise ValueError(f"{len(keys)} keys for {len(captions)} captions")
    if len(set(keys)) != len(keys):
        raise UserError("caption keys must be unique: two captions share a key, so they would get one seed")
    lex = load_lexicon(lexicon) if isinstance(lexicon, str) else lexicon
    if nlp is None:
        nlp = load_spacy(spacy_model)
    else:
        spacy_model = f"{nlp.meta.get('lang', '')}_{nlp.meta.get('name', '')}"
    perturber = CaptionPerturber(parse_captions(nlp, captions, batch_size=batch_size), lex)
    run = PerturbationRun(tuple(captions), tuple(keys), seed, spacy_model, lex.name)
    for kind in kinds:
        run.results[kind] = perturber.apply(kind, seed, keys)
    return run
