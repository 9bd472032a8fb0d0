"""One generic name -> object registry used for models, metrics, samplers.

A single implementation keeps lookup errors uniform: an unknown name always
gets the same one-line error with a suggestion and the list of known names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from mmcomp_eval.errors import UserError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            self.add(name, obj, aliases=aliases)
            return obj

        return decorator

    def add(self, name: str, obj: T, *, aliases: tuple[str, ...] = ()) -> None:
        if name in self._items or name in self._aliases:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._items[name] = obj
        for alias in aliases:
            self._aliases[alias] = name

    def canonical(self, name: str) -> str:
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        known = sorted(self.names())
        raise UserError(
            f"unknown {self.kind} '{name}'{did_you_mean(name, known)}; known: {', '.join(known)}"
        )

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def names(self) -> list[str]:
        return sorted([*self._items, *self._aliases])

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
