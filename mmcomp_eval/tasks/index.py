"""Finding tasks: the built-in ``tasks/`` folder plus folders users name.

The built-in folders are the repository's top-level ``tasks/`` and
``prompts/``, or their copies inside an installed wheel
(:func:`mmcomp_eval.paths.builtin_dir`).

Files whose name starts with ``_`` are bases meant for ``include:`` and are
not tasks themselves. A user folder may shadow a built-in task of the same
name; two files defining one name in the same folder is an error.
"""

from __future__ import annotations

import fnmatch

from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval import plugins
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.paths import builtin_dir
from mmcomp_eval.config.task_config import GroupConfig, TaskConfig
from mmcomp_eval.tasks.checks import load_checked

BUILTIN_TASKS = builtin_dir("tasks")
BUILTIN_PROMPTS = builtin_dir("prompts")


@dataclass
class TaskIndex:
    tasks: dict[str, TaskConfig]
    groups: dict[str, GroupConfig]
    search_dirs: tuple[Path, ...]

    @classmethod
    def build(cls, include_paths: tuple[Path, ...] = ()) -> TaskIndex:
        if not BUILTIN_TASKS.is_dir():
            raise UserError(f"built-in tasks folder {BUILTIN_TASKS} is missing: this copy of mmcomp-eval is "
                            "incomplete; reinstall it from a wheel or run it from a source checkout")
        tasks: dict[str, TaskConfig] = {}
        groups: dict[str, GroupConfig] = {}
        user = tuple(Path(p) for p in include_paths)
        for d in user:
            if not d.is_dir():
                raise UserError(f"--include-path {d}: not a folder of task YAML files")
        plugin = dict(plugins.task_dirs())  # folder -> which plugin; may not shadow earlier names
        dirs = (BUILTIN_TASKS, *plugin, *user)
        for d in dirs:
            seen_here: dict[str, Path] = {}
            for path in sorted(d.rglob("*.yaml")):
                if path.name.startswith("_"):
                    continue
                cfg = load_checked(path)
                name = cfg.group if isinstance(cfg, GroupConfig) else cfg.task
                if name in seen_here:
                    raise UserError(f"{path}: task '{name}' is also defined in {seen_here[name]}; rename one")
                seen_here[name] = path
                if d in plugin and (name in tasks or name in groups):
                    raise UserError(f"{path}: {plugin[d]} defines task '{name}', which already exists; rename it")
                (groups if isinstance(cfg, GroupConfig) else tasks)[name] = cfg
        return cls(tasks, groups, dirs)

    def resolve(self, names: list[str]) -> list[TaskConfig]:
        """Task names, group names and glob patterns (``compact_*``) -> task configs, in order, without repeats.

        A pattern matches task names only (as lm-eval's), in sorted order; one
        that matches nothing is refused like an unknown name.
        """
        out: dict[str, TaskConfig] = {}
        for name in names:
            for task_name in self._expand_pattern(name):
                out.setdefault(task_name, self.tasks[task_name])
        return list(out.values())

    def _expand_pattern(self, name: str) -> list[str]:
        if not any(c in name for c in "*?[") or name in self.tasks or name in self.groups:
            return self._expand(name, ())
        matched = sorted(fnmatch.filter(self.tasks, name))
        if not matched:
            raise UserError(f"task pattern '{name}' matches no task; see `mmcomp-eval ls tasks`, or add a folder "
                            "with --include-path")
        return matched

    def _expand(self, name: str, stack: tuple[str, ...]) -> list[str]:
        if name in self.tasks:
            return [name]
        if name in self.groups:
            if name in stack:
                raise UserError(f"group '{name}' contains itself ({' -> '.join((*stack, name))})")
            return [t for member in self.groups[name].tasks for t in self._expand(member, (*stack, name))]
        known = [*self.tasks, *self.groups]
        raise UserError(f"unknown task '{name}'{did_you_mean(name, known)}; "
                        "see `mmcomp-eval ls tasks`, or add a folder with --include-path")


def find_template(task: TaskConfig, extra_dirs: tuple[Path, ...] = ()) -> Path:
    """The task's template: next to its file, then in include paths, then built-in."""
    name = task.prompt.template
    candidates = []
    if task.source:
        candidates.append(Path(task.source).parent / name)
    candidates += [Path(d) / name for d in extra_dirs]
    candidates.append(BUILTIN_PROMPTS / name)
    for c in candidates:
        if c.is_file():
            return c
    raise UserError(f"{task.source}: prompt.template '{name}' not found next to the task file or in "
                    f"{BUILTIN_PROMPTS}")
