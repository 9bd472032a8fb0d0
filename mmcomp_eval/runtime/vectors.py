"""Embeddings as response-store values: float32 bytes in base64, exact and a third the size of JSON numbers.

The store keeps every answer as JSON text. A 512-d CLIP embedding written as
a JSON list of numbers takes about 10 KB and comes back as float64; written
as the base64 of its float32 bytes it takes 2.7 KB and comes back bit for bit,
so a resumed run ranks with exactly the vectors an uninterrupted one had.
"""

from __future__ import annotations

import base64

import numpy as np

PREFIX = "float32:"


def encode(vector) -> str:
    """A 1-D vector as ``float32:<base64 of its little-endian float32 bytes>``."""
    arr = np.ascontiguousarray(np.asarray(vector, dtype="<f4").reshape(-1))
    return PREFIX + base64.b64encode(arr.tobytes()).decode("ascii")


def decode(text: str) -> np.ndarray:
    """The vector :func:`encode` wrote; anything else is a ValueError (a damaged or foreign store entry)."""
    if not isinstance(text, str) or not text.startswith(PREFIX):
        raise ValueError(f"not an embedding written by mmcomp-eval: {str(text)[:40]!r}")
    raw = base64.b64decode(text[len(PREFIX):], validate=True)
    if len(raw) % 4:
        raise ValueError("embedding bytes are not a whole number of float32 values")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)
