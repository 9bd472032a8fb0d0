"""Where output types register (see :mod:`mmcomp_eval.api.task`)."""

from __future__ import annotations

from mmcomp_eval.api.task import OutputType
from mmcomp_eval.registry import Registry

OUTPUT_TYPES = Registry[type[OutputType]]("output type")
