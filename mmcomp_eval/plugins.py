"""Plugins: models, metrics, output types and task folders from other installed packages.

A package declares entry points in its ``pyproject.toml``::

    [project.entry-points."mmcomp_eval.models"]
    my-model = "my_pkg.model:MyModel"          # a Model subclass
    [project.entry-points."mmcomp_eval.metrics"]
    my_metric = "my_pkg.metric:MyMetric"       # a Metric subclass
    [project.entry-points."mmcomp_eval.output_types"]
    my_output = "my_pkg.output:MyOutput"       # an OutputType subclass (``output_type: my_output``)
    [project.entry-points."mmcomp_eval.tasks"]
    my_pkg = "my_pkg:TASKS_DIR"                # a folder of task YAML and templates

The entry point's name is the name users type (``--model my-model``); task
names come from the YAML files. Task folders hold YAML and Jinja only:
nothing in them is imported or executed, so installing a package is the one
way to add code, and the user chose to do that. A plugin may not take a
name that is already taken (a built-in or another plugin's): that is an
error naming both, rather than a silent shadowing that changes results.
Entry points are read once per process.
"""

from __future__ import annotations

import functools
import types
from importlib import metadata
from pathlib import Path
from typing import Any

from mmcomp_eval.errors import UserError

MODELS_GROUP = "mmcomp_eval.models"
METRICS_GROUP = "mmcomp_eval.metrics"
OUTPUT_TYPES_GROUP = "mmcomp_eval.output_types"
TASKS_GROUP = "mmcomp_eval.tasks"


@functools.cache
def entry_points(group: str) -> tuple[metadata.EntryPoint, ...]:
    return tuple(sorted(metadata.entry_points(group=group), key=lambda ep: (ep.name, ep.value)))


def _origin(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"plugin '{dist.name if dist else ep.value.split(':')[0]}' (entry point {ep.group}: {ep.name} = {ep.value})"


def _load(ep: metadata.EntryPoint) -> Any:
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - any failure of third-party code becomes one line
        raise UserError(f"{_origin(ep)} failed to load: {type(exc).__name__}: {exc}") from None


def _register(registry, group: str, base: type) -> None:
    for ep in entry_points(group):
        obj = _load(ep)
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise UserError(f"{_origin(ep)} is {obj!r}, not a {base.__name__} subclass")
        if ep.name in registry:
            if registry.get(ep.name) is obj:  # the module registered itself on import
                continue
            raise UserError(f"{_origin(ep)}: {registry.kind} '{ep.name}' already exists; rename it")
        registry.add(ep.name, obj)


def register_models(registry) -> None:
    from mmcomp_eval.api.model import Model

    _register(registry, MODELS_GROUP, Model)


def register_metrics(registry) -> None:
    from mmcomp_eval.api.metric import Metric

    _register(registry, METRICS_GROUP, Metric)


def register_output_types(registry) -> None:
    from mmcomp_eval.api.task import OutputType

    _register(registry, OUTPUT_TYPES_GROUP, OutputType)


@functools.cache
def task_dirs() -> tuple[tuple[Path, str], ...]:
    """(folder, origin) of every plugin task folder."""
    out = []
    for ep in entry_points(TASKS_GROUP):
        obj = _load(ep)
        if callable(obj) and not isinstance(obj, (str, Path, types.ModuleType)):
            obj = obj()
        if isinstance(obj, types.ModuleType):
            obj = Path(obj.__file__).parent if obj.__file__ else None
        path = Path(obj) if isinstance(obj, (str, Path)) else None
        if path is None or not path.is_dir():
            raise UserError(f"{_origin(ep)} should name a folder of task YAML files; got {obj!r}")
        out.append((path, _origin(ep)))
    return tuple(out)
