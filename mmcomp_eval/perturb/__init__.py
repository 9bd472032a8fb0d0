"""ICSVR caption perturbations: objects & attributes, actions and syntax.

``perturb_captions(captions, kinds, seed=..., vocabulary=...)`` is the entry
point; see :mod:`~mmcomp_eval.perturb.tokens` for which parts of speech count
as objects, attributes and actions (``pos_roles``: ``paper`` or
``extended``), :mod:`~mmcomp_eval.perturb.kinds` for the ten perturbations,
:mod:`~mmcomp_eval.perturb.vocab_source` for the fixed replacement
vocabulary, :mod:`~mmcomp_eval.perturb.vocab` and
:mod:`~mmcomp_eval.perturb.lexicon` for replacement words. Importing this
package does not import spaCy; parsing does.
"""

from mmcomp_eval.perturb.kinds import KINDS, PERTURBATIONS, UNCHANGED_WHEN
from mmcomp_eval.perturb.lexicon import Lexicon, NoLexicon, WordNetLexicon, load_lexicon
from mmcomp_eval.perturb.nlp import DEFAULT_SPACY_MODEL, load_spacy, parse_captions
from mmcomp_eval.perturb.suite import (CaptionPerturber, PerturbationResult, PerturbationRun, perturb_captions,
                                       resolve_kinds)
from mmcomp_eval.perturb.tokens import (DEFAULT_POS_ROLES, EXTENDED_ROLES, PAPER_ROLES, POS_ROLES, ParsedCaption, Tok,
                                        make_tok, role_mapping)
from mmcomp_eval.perturb.vocab_source import VocabularySource, dataset_vocabulary

__all__ = ["KINDS", "PERTURBATIONS", "UNCHANGED_WHEN", "Lexicon", "NoLexicon", "WordNetLexicon", "load_lexicon",
           "DEFAULT_SPACY_MODEL", "load_spacy", "parse_captions", "CaptionPerturber", "PerturbationResult",
           "PerturbationRun", "perturb_captions", "resolve_kinds", "DEFAULT_POS_ROLES", "EXTENDED_ROLES",
           "PAPER_ROLES", "POS_ROLES", "ParsedCaption", "Tok", "make_tok", "role_mapping", "VocabularySource",
           "dataset_vocabulary"]
