"""Text-video retrieval: metrics, models, runner and reports (ICSVR, SAVE).

``metrics`` is numpy-only and cheap to import; ``models`` imports torch and
transformers only when a model is built, so ``--help`` and report building
stay instant.
"""
