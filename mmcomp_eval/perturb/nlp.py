"""Loading a spaCy pipeline and parsing captions once, batched.

The pipeline name is configurable because users have ``en_core_web_sm`` while
offline machines may only have a stand-in package. A missing spaCy or
pipeline is a one-line :class:`UserError` that says what to install.

``ner`` is excluded when loading: entity labels are never used and the
component costs about half the parse time. The parser is kept on purpose: the
English attribute ruler reads dependency labels, so without the parser "does"
in "a girl does gymnastics" is tagged AUX instead of VERB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

from mmcomp_eval.errors import UserError
from mmcomp_eval.perturb.tokens import PAPER_ROLES, ParsedCaption, make_tok

DEFAULT_SPACY_MODEL = "en_core_web_sm"
#: components never read by the perturbations
EXCLUDED_COMPONENTS = ("ner",)


@lru_cache(maxsize=4)
def load_spacy(name: str = DEFAULT_SPACY_MODEL):
    """The named pipeline (cached per process), or a one-line install hint."""
    try:
        import spacy
    except ImportError:
        raise UserError("spaCy is not installed (needed for caption perturbations): "
                        "pip install 'spacy>=3.7' or pip install 'mmcomp-eval[text]'") from None
    try:
        nlp = spacy.load(name, exclude=list(EXCLUDED_COMPONENTS))
    except OSError:
        raise UserError(f"spaCy pipeline '{name}' is not installed: python -m spacy download {name} "
                        f"(or pip install the pipeline package), or choose another with --spacy-model "
                        f"/ perturbation.spacy_model / $MMCOMP_SPACY_MODEL") from None
    if not (nlp.has_pipe("tagger") or nlp.has_pipe("morphologizer")):
        raise UserError(f"spaCy pipeline '{name}' has no tagger or morphologizer, so it gives no part-of-speech "
                        f"tags; use an English pipeline such as en_core_web_sm")
    return nlp


def pipeline_name(nlp) -> str:
    """The package name of a loaded pipeline (``en_core_web_sm``), for reports."""
    return f"{nlp.meta.get('lang', '')}_{nlp.meta.get('name', '')}"


def pipeline_identity(nlp) -> str:
    """Name, version and spaCy version: what decides the tags and lemmas, for cache keys."""
    import spacy

    return f"{pipeline_name(nlp)}=={nlp.meta.get('version', '')} spacy=={spacy.__version__} pipes={nlp.pipe_names}"


def parse_captions(nlp, captions: Sequence[str], batch_size: int = 256,
                   roles: Mapping[str, str] = PAPER_ROLES) -> list[ParsedCaption]:
    """One parse per distinct caption text (``nlp.pipe``), shared by every perturbation.

    ``roles`` maps spaCy's coarse POS to object/attribute/action (see
    :mod:`mmcomp_eval.perturb.tokens`); anything it does not list is syntax.
    """
    unique = list(dict.fromkeys(captions))
    parsed = {}
    for text, doc in zip(unique, nlp.pipe(unique, batch_size=batch_size)):
        toks = tuple(make_tok(t.text, t.whitespace_, t.pos_, t.tag_, t.lemma_, roles) for t in doc)
        parsed[text] = ParsedCaption(text, toks)
    return [parsed[c] for c in captions]
