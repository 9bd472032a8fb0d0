"""mmcomp-eval: an evaluation harness for compositional generalisation in
multimodal models (CompAct next-utterance prediction and atom classification,
ICSVR caption perturbations, SAVE-style retrieval scoring)."""

__version__ = "0.1.0"
