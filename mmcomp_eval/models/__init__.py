"""Model adapters.

Importing this package registers every adapter and preset in
:data:`MODELS`; build one with :func:`create_model` (``--model`` name plus
``--model-args``). Adapters import their heavy libraries lazily, so this
import is cheap.
"""

from mmcomp_eval.models import hf  # noqa: F401  (registers "hf" and its presets)
from mmcomp_eval.models import idefics  # noqa: F401  (registers "idefics" and its presets)
from mmcomp_eval.models import image_text  # noqa: F401  (registers "hf_vlm" and its presets)
from mmcomp_eval.models import flamingo  # noqa: F401  (registers "open_flamingo", "otter" and presets)
from mmcomp_eval.models import mrh  # noqa: F401  (registers the "mrh" baseline)
from mmcomp_eval.models import gold  # noqa: F401  (registers "gold", the metrics' sanity check)
from mmcomp_eval.models import openai_api  # noqa: F401  (registers "openai-chat", "openai-completions")
from mmcomp_eval.models import vllm_backend  # noqa: F401  (registers "vllm", "vllm-vlm"; vLLM itself loads lazily)
from mmcomp_eval.models import clip, fusion  # noqa: F401  (registers the retrieval models "clip", "fusion" and presets)
from mmcomp_eval.models.registry import MODELS, ModelRegistry, ModelSpec, create_model
from mmcomp_eval.plugins import register_models

register_models(MODELS)  # entry points "mmcomp_eval.models" of installed packages

__all__ = ["MODELS", "ModelRegistry", "ModelSpec", "create_model"]
