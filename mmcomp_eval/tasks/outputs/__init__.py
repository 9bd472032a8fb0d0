"""Output types: how a task asks the model and reads its answers.

Importing this package registers the built-in types (``generate``,
``rank_choices``, ``retrieval``) and those of installed plugins in :data:`OUTPUT_TYPES`;
``output_type:`` in a task file is checked against it when the file is read.
"""

from __future__ import annotations

from mmcomp_eval.plugins import register_output_types
from mmcomp_eval.tasks.outputs import generate, rank_choices, retrieval  # noqa: F401  (register)
from mmcomp_eval.tasks.outputs.registry import OUTPUT_TYPES

register_output_types(OUTPUT_TYPES)  # entry points "mmcomp_eval.output_types" of installed packages

__all__ = ["OUTPUT_TYPES"]
