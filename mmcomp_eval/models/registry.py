"""The model registry: adapters by name, plus named presets.

An adapter (``hf``) is a class; a preset (``llama2-7b``) is an adapter name
plus default arguments, so that common checkpoints need no ``--model-args``.
Presets live in the same registry as adapters so that ``MODELS.get``,
``in`` and the unknown-name error (with its did-you-mean and list of known
names) treat both alike. Arguments given by the user override a preset's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mmcomp_eval.api.model import Model
from mmcomp_eval.errors import UserError
from mmcomp_eval.config.model_args import coerce_kwargs, parse_model_args
from mmcomp_eval.registry import Registry


@dataclass(frozen=True)
class ModelSpec:
    """What a ``--model`` name stands for: an adapter and its default arguments."""

    adapter: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def merged(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.defaults, **args}


class ModelRegistry(Registry[type[Model]]):
    """A :class:`Registry` of adapter classes that also knows presets."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self._presets: dict[str, ModelSpec] = {}

    def add_preset(self, name: str, adapter: str, description: str = "", **defaults: Any) -> None:
        if name in self:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._presets[name] = ModelSpec(adapter, MappingProxyType(dict(defaults)), description)

    def spec(self, name: str) -> ModelSpec:
        """The adapter and defaults behind ``name`` (an adapter, alias or preset)."""
        if name in self._presets:
            return self._presets[name]
        return ModelSpec(super().canonical(name))

    def canonical(self, name: str) -> str:
        if name in self._presets:
            return self._presets[name].adapter
        return super().canonical(name)

    def names(self) -> list[str]:
        return sorted([*super().names(), *self._presets])

    def presets(self) -> dict[str, ModelSpec]:
        return dict(sorted(self._presets.items()))

    def __contains__(self, name: str) -> bool:
        return name in self._presets or super().__contains__(name)

    def resolve(self, name: str, args: str | Mapping[str, Any] | None = None) -> tuple[type[Model], dict[str, Any]]:
        """The adapter class and its checked keyword arguments for ``--model name``."""
        user = parse_model_args(args) if isinstance(args, str) or args is None else dict(args)
        spec = self.spec(name)
        cls = self.get(spec.adapter)
        return cls, coerce_kwargs(cls, spec.merged(user))

    def create(self, name: str, args: str | Mapping[str, Any] | None = None) -> Model:
        cls, kwargs = self.resolve(name, args)
        return cls(**kwargs)


MODELS = ModelRegistry("model")


def create_model(name: str, args: str | Mapping[str, Any] | None = None) -> Model:
    """Build the model for ``--model name --model-args args``."""
    if not name:
        raise UserError("--model is empty; pick one of: " + ", ".join(MODELS.names()))
    return MODELS.create(name, args)
