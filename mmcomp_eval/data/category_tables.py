"""What the EK-100 annotations teach the category map, and its cache.

Each annotated clip contributes its narration text with its (verb class,
noun class) pair, its ``verb`` cell, the words before its first noun, and
its ``noun``/``all_nouns`` cells together with the span each noun occupies
in the narration. Every text or phrase keeps its majority class; ties go to
the lower class id, so the tables never depend on file order. The tables are
a pure function of the EK-100 files and are cached as JSON, keyed by their
SHA-256 and :data:`MAP_VERSION`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mmcomp_eval.data import ek100
from mmcomp_eval.data.category_rules import plain_verb, singular_forms
from mmcomp_eval.data.vocab import CategoryIndex
from mmcomp_eval.textnorm import category_key

#: Bump when the learned tables change for the same input files.
MAP_VERSION = 1
#: a narration's words before its first noun are learned as a verb phrase only
#: up to this length ("still continue to wash" is the longest that helps)
MAX_PREFIX_TOKENS = 4


@dataclass(frozen=True)
class LearnedTables:
    """What the annotations teach; every phrase is in :func:`category_key` form, mapped to its majority class."""

    narrations: dict[str, tuple[int, int]] = field(default_factory=dict)  # narration -> (verb, noun)
    verbs: dict[str, int] = field(default_factory=dict)          # ``verb`` column: "put into"
    verb_prefixes: dict[str, int] = field(default_factory=dict)  # words before the first noun: "still washing"
    nouns: dict[str, int] = field(default_factory=dict)          # ``noun``/``all_nouns`` and their spans in the text
    stats: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"narrations": {t: list(p) for t, p in self.narrations.items()}, "verbs": self.verbs,
                "verb_prefixes": self.verb_prefixes, "nouns": self.nouns, "stats": self.stats}

    @classmethod
    def from_json(cls, data: dict) -> LearnedTables:
        return cls({t: (int(p[0]), int(p[1])) for t, p in data["narrations"].items()}, data["verbs"],
                   data["verb_prefixes"], data["nouns"], data["stats"])


def learn_tables(clips: Iterable[ek100.Clip], index: CategoryIndex) -> LearnedTables:
    """Tiers 1-3's tables from annotated clips: each text or phrase with its majority class(es)."""
    pairs: dict[str, Counter] = defaultdict(Counter)
    verbs: dict[str, Counter] = defaultdict(Counter)
    prefixes: dict[str, Counter] = defaultdict(Counter)
    nouns: dict[str, Counter] = defaultdict(Counter)
    for clip in clips:
        if clip.narration is None:
            continue
        key = category_key(clip.narration)
        tokens = key.split()
        pairs[key][(clip.verb_class, clip.noun_class)] += 1
        if clip.verb:
            verbs[category_key(plain_verb(clip.verb))][clip.verb_class] += 1
        first_noun = len(tokens)
        for raw, cls in _annotated_nouns(clip, index):
            for form in _noun_forms(raw):
                nouns[" ".join(form)][cls] += 1
            span = _locate(tokens, raw)
            if span is not None:
                nouns[" ".join(tokens[span[0]:span[1]])][cls] += 1
                first_noun = min(first_noun, span[0])
        if 0 < first_noun <= MAX_PREFIX_TOKENS and first_noun < len(tokens):
            prefixes[" ".join(tokens[:first_noun])][clip.verb_class] += 1
    stats = {
        "narration_texts": len(pairs),
        "narration_texts_with_several_pairs": sum(len(c) > 1 for c in pairs.values()),
        "verb_phrases": len(verbs),
        "verb_prefixes": len(prefixes),
        "noun_phrases": len(nouns),
        "tie_break": "most frequent; ties to the lower verb class, then the lower noun class",
    }
    return LearnedTables({t: _majority(c) for t, c in pairs.items()}, _majorities(verbs), _majorities(prefixes),
                         _majorities(nouns), stats)


def _majorities(counts: dict[str, Counter]) -> dict[str, int]:
    return {phrase: _majority(c) for phrase, c in counts.items()}


def _majority(counts: Counter):
    return max(counts.items(), key=lambda kv: (kv[1], _negated(kv[0])))[0]


def _negated(label):
    return tuple(-x for x in label) if isinstance(label, tuple) else -label


def _annotated_nouns(clip: ek100.Clip, index: CategoryIndex) -> list[tuple[str, int]]:
    """The clip's nouns with their classes: ``noun`` has ``noun_class``; other ``all_nouns`` their table class."""
    out = []
    if clip.noun:
        out.append((clip.noun, clip.noun_class))
    for raw in clip.all_nouns:
        if raw != clip.noun:
            cls = index.noun_class(raw)
            if cls is not None:
                out.append((raw, cls))
    return out


def _noun_forms(raw: str) -> list[list[str]]:
    """Word orders in which ``head:modifier...`` appears in narrations.

    ``board:chopping`` -> "chopping board"; ``liquid:washing:up`` -> "washing
    up liquid" (modifiers keep their order); ``top:counter`` -> "top of counter".
    """
    parts = [p.replace("-", " ").split() for p in raw.lower().split(":") if p.strip()]
    if not parts:
        return []
    head, mods = parts[0], [w for p in parts[1:] for w in p]
    forms = [[w for p in reversed(parts) for w in p], [*mods, *head]]
    if mods:
        forms.append([*head, "of", *mods])
    unique: list[list[str]] = []
    for f in forms:
        if f not in unique:
            unique.append(f)
    return unique


def _same_word(token: str, word: str) -> bool:
    """``token`` is ``word`` or a plural of it."""
    return word in singular_forms(token)


def _locate(tokens: list[str], raw: str) -> tuple[int, int] | None:
    """Where the annotated noun occupies the narration's words (first match), if it does."""
    for form in _noun_forms(raw):
        n = len(form)
        for i in range(len(tokens) - n + 1):
            if all(_same_word(t, w) for t, w in zip(tokens[i:i + n], form)):
                return i, i + n
    return None


def cache_key(files: ek100.EK100Files) -> str:
    h = hashlib.sha256(f"category-map={MAP_VERSION}".encode())
    for f in files.all():
        h.update(f.name.encode())
        h.update(ek100.file_sha256(f).encode())
    return h.hexdigest()[:20]


def read_cache(path: Path) -> LearnedTables | None:
    try:
        return LearnedTables.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None  # absent or damaged: learn again


def write_cache(path: Path, tables: LearnedTables) -> None:
    """Atomically (temp file + rename); a read-only cache only costs relearning next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(tables.to_json(), f, ensure_ascii=False, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
