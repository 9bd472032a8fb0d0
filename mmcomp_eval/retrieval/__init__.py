"""Text-video retrieval arithmetic (ICSVR, SAVE): ranks, the fusion baseline's normalisation, the gallery's files, reports.

Retrieval runs as ordinary tasks (``output_type: retrieval``,
``mmcomp_eval.tasks.outputs.retrieval``) with models registered like any
other (``mmcomp_eval.models.clip``, ``.fusion``) and metrics in the ordinary
registry (``mmcomp_eval.metrics.retrieval``). This package holds what they
share and what needs neither a model nor a task: ``ranking`` (numpy only),
``fusion``, ``gallery`` and ``report`` (ICSVR tables and figures, SAVE's mR1
over result records).
"""
