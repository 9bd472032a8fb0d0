"""The ten ICSVR caption perturbations (paper Table 1, section 3).

Each is ``fn(caption, rng, replacer) -> str``: a pure function of one parsed
caption, a per-caption seeded :class:`random.Random` and the dataset's
:class:`~mmcomp_eval.perturb.vocab.Replacer`. Roles (object, attribute,
action, syntax) are defined in :mod:`mmcomp_eval.perturb.tokens`.

Output text: removals and in-place edits keep the caption's own spacing
(spaCy tokens carry their trailing whitespace), then collapse runs of spaces;
reorderings (``shuf``, ``rev``) join spaCy tokens with single spaces. A
caption the perturbation does not touch (no verb under ``actrem``, one object
under ``objshift``) is returned exactly as given, which is what the
"unchanged" counts measure.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from mmcomp_eval.perturb.tokens import ACTION, ATTRIBUTE, OBJECT, ParsedCaption
from mmcomp_eval.perturb.vocab import Replacer
from mmcomp_eval.registry import Registry

Perturbation = Callable[[ParsedCaption, random.Random, Replacer], str]
PERTURBATIONS: Registry[Perturbation] = Registry("perturbation")
#: in the paper's order (Table 1)
KINDS = ("objattrrem", "objshift", "objrep", "objpartial", "actrem", "actneg", "actrep", "synrem", "shuf", "rev")
#: the kinds that draw words from the replacement vocabulary
USES_VOCABULARY = ("objrep", "actrep")
#: why a caption can come out unchanged, for reports
UNCHANGED_WHEN = {
    "objattrrem": "no object or attribute",
    "objshift": "fewer than two different objects",
    "objrep": "no object, or no allowed replacement",
    "objpartial": "no object",
    "actrem": "no verb",
    "actneg": "no verb",
    "actrep": "no verb, or no allowed replacement",
    "synrem": "no syntax word",
    "shuf": "fewer than two different words",
    "rev": "reads the same reversed (e.g. one word)",
}
_TRIES = 100


def _render(caption: ParsedCaption, texts: Sequence[str | None]) -> str:
    """Tokens with new texts (None: dropped), keeping the caption's spacing."""
    if all(t == tok.text for t, tok in zip(texts, caption.tokens)):
        return caption.text
    out = ""
    for tok, text in zip(caption.tokens, texts):
        if text is None:
            # keep the dropped token's separation: "man's dog" minus "'s" is "man dog", not "mandog"
            if tok.ws and out and not out.endswith(" "):
                out += " "
            continue
        out += text + tok.ws
    return " ".join(out.split())


def _texts(caption: ParsedCaption) -> list[str | None]:
    return [t.text for t in caption.tokens]


def _drop(caption: ParsedCaption, roles: tuple[str, ...]) -> str:
    texts = _texts(caption)
    for i in caption.indices(*roles):
        texts[i] = None
    return _render(caption, texts)


def _permute(items: list[str], rng: random.Random) -> list[str] | None:
    """A seeded reordering that differs from ``items`` (None when every order is the same)."""
    if len(set(items)) < 2:
        return None
    for _ in range(_TRIES):
        perm = items[:]
        rng.shuffle(perm)
        if perm != items:
            return perm
    # astronomically unlikely with two different items; still deterministic
    i = next(j for j in range(1, len(items)) if items[j] != items[0])
    perm = items[:]
    perm[0], perm[i] = perm[i], perm[0]
    return perm


@PERTURBATIONS.register("objattrrem")
def objattrrem(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Remove all objects & attributes: "a wearing a drives a while talking"."""
    return _drop(caption, (OBJECT, ATTRIBUTE))


@PERTURBATIONS.register("objshift")
def objshift(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Shift the objects one place, cyclically; attributes stay put, each object keeps its form.

    Each object takes the slot of the one before it and the first goes to the
    last slot, exactly the paper's Table 1 example: (guy, shirt, car) become
    (shirt, car, guy) in "a shirt wearing a red car drives a guy while
    talking". Deterministic: the seed plays no part. Two objects swap.
    """
    idx = caption.indices(OBJECT)
    texts = _texts(caption)
    moved = [texts[i] for i in idx[1:] + idx[:1]]
    for i, text in zip(idx, moved):
        texts[i] = text
    return _render(caption, texts)


@PERTURBATIONS.register("objrep")
def objrep(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Replace every object with another noun of the vocabulary (same tag, not a synonym/antonym)."""
    return _replace_role(caption, rng, replacer, OBJECT)


@PERTURBATIONS.register("objpartial")
def objpartial(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Keep half of the objects, rounded down (the paper keeps 1 of 3), chosen at random; attributes stay.

    A caption with a single object therefore loses it.
    """
    idx = caption.indices(OBJECT)
    texts = _texts(caption)
    for i in rng.sample(idx, len(idx) - len(idx) // 2):
        texts[i] = None
    return _render(caption, texts)


@PERTURBATIONS.register("actrem")
def actrem(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Remove the actions (verbs; auxiliaries stay): "a guy a red shirt a car while"."""
    return _drop(caption, (ACTION,))


@PERTURBATIONS.register("actneg")
def actneg(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Put "not" before each action, literally (an already negated verb gets a second "not")."""
    texts = _texts(caption)
    for i in caption.indices(ACTION):
        texts[i] = "not " + texts[i]
    return _render(caption, texts)


@PERTURBATIONS.register("actrep")
def actrep(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Replace every action with another verb of the vocabulary (same tag, not a synonym/antonym)."""
    return _replace_role(caption, rng, replacer, ACTION)


def _replace_role(caption: ParsedCaption, rng: random.Random, replacer: Replacer, role) -> str:
    """Each token of ``role`` replaced by the replacer's pick (kept when it has none)."""
    texts = _texts(caption)
    for i in caption.indices(role):
        texts[i] = replacer.replace(caption.tokens[i], rng) or texts[i]
    return _render(caption, texts)


@PERTURBATIONS.register("synrem")
def synrem(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Keep only objects & attributes and actions: "guy wearing red shirt drives car talking"."""
    keep = set(caption.indices(OBJECT, ATTRIBUTE, ACTION))
    return _render(caption, [t.text if i in keep else None for i, t in enumerate(caption.tokens)])


def _words(caption: ParsedCaption) -> list[str]:
    return [t.text for t in caption.tokens if not t.is_space]


@PERTURBATIONS.register("shuf")
def shuf(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Shuffle all words (spaCy tokens, punctuation included) into a different order."""
    perm = _permute(_words(caption), rng)
    return caption.text if perm is None else " ".join(perm)


@PERTURBATIONS.register("rev")
def rev(caption: ParsedCaption, rng: random.Random, replacer: Replacer) -> str:
    """Reverse the word order: "talking while car a drives shirt red a wearing guy a"."""
    words = _words(caption)
    return caption.text if words[::-1] == words else " ".join(reversed(words))
