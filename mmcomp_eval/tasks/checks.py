"""Checks of a task config against what is registered at run time.

A task file names things other packages define: its output type (built in or
from a plugin) and, for ICSVR tasks, a perturbation kind and POS-role mapping.
``config`` only knows the file's own structure; these checks live here, above
the registries, so that ``config`` imports none of them.
"""

from __future__ import annotations

from mmcomp_eval.config.task_config import GroupConfig, TaskConfig, load_task_file, one_of


def check_task(cfg: TaskConfig, where: str | None = None) -> TaskConfig:
    """``cfg`` if every registered name it uses exists; a one-line error naming the key otherwise."""
    from mmcomp_eval.tasks.outputs import OUTPUT_TYPES  # registered types, plugins' included

    where = where or f"{cfg.source or '<task>'} (task {cfg.task})"
    one_of(where, "output_type", cfg.output_type, tuple(OUTPUT_TYPES))
    OUTPUT_TYPES.get(cfg.output_type).check_config(cfg, where)
    if cfg.perturbation is not None:
        from mmcomp_eval.perturb.kinds import KINDS
        from mmcomp_eval.perturb.tokens import POS_ROLES

        one_of(where, "perturbation.kind", cfg.perturbation.kind, KINDS)
        one_of(where, "perturbation.pos_roles", cfg.perturbation.pos_roles, tuple(POS_ROLES))
    return cfg


def load_checked(path) -> TaskConfig | GroupConfig:
    """A task or group file, read and checked (the way the task index and ``validate`` read files)."""
    cfg = load_task_file(path)
    return cfg if isinstance(cfg, GroupConfig) else check_task(cfg)
