"""Flamingo's prompt conventions, shared by the adapter (rendering, stop token) and the loaders (special tokens).

The template's ``<image>`` is Flamingo's media token; each finished few-shot
example (a prompt line holding images, other than the last) ends with
``<|endofchunk|>`` instead of a newline, as in OpenFlamingo's few-shot
evaluation, and generation stops at ``<|endofchunk|>``.
"""

from __future__ import annotations

from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

END_OF_CHUNK = "<|endofchunk|>"
#: Otter's marker before an answer (``User: ... GPT:<answer> ...``), a special token of its tokenizer
ANSWER = "<answer>"


def chunked(prompt: str) -> str:
    """End every finished example (a line with an image, not the last line) with ``<|endofchunk|>``."""
    lines = prompt.split("\n")
    out = []
    for k, line in enumerate(lines):
        last = k == len(lines) - 1
        out.append(line + ("" if last else END_OF_CHUNK if IMAGE_PLACEHOLDER in line else "\n"))
    return "".join(out)
