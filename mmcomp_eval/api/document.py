"""A document is one evaluation instance as a task sees it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    """One instance: a stable id plus the raw fields read from the dataset.

    ``fields`` is what templates see as ``doc``; it is kept as read (JSON
    types) so the same document hashes identically across runs.
    """

    id: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)
