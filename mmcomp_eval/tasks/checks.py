"""Checks of a task config against what is registered at run time.

A task file names things other packages define: its output type (built in or
from a plugin) and, for ICSVR tasks, a perturbation kind and POS-role mapping.
``config`` only knows the file's own structure; these checks live here, above
the registries, so that ``config`` imports none of them.
"""

from __future__ import annotations

from mmcomp_eval.config.task_config import GroupConfig, TaskConfig, load_task_file, one_of
from mmcomp_eval.errors import UserError


def check_task(cfg: TaskConfig, where: str | None = None) -> TaskConfig:
    """``cfg`` if every registered name it uses exists; a one-line error naming the key otherwise."""
    from mmcomp_eval.tasks.outputs import OUTPUT_TYPES  # registered types, plugins' included

    where = where or f"{cfg.source or '<task>'} (task {cfg.task})"
    one_of(where, "output_type", cfg.output_type, tuple(OUTPUT_TYPES))
    output_type = OUTPUT_TYPES.get(cfg.output_type)
    if output_type.prompted and cfg.prompt is None:
        raise UserError(f"{where}: output_type '{cfg.output_type}' renders a prompt; add prompt: {{template: FILE}}")
    if not output_type.prompted and cfg.prompt is not None:
        raise UserError(f"{where}: output_type '{cfg.output_type}' renders no prompt; remove the 'prompt' section")
    if not output_type.prompted and cfg.generation_keys:  # it would be recorded and never used
        raise UserError(f"{where}: output_type '{cfg.output_type}' generates no text; remove the 'generation' "
                        f"section ({', '.join(cfg.generation_keys)})")
    _check_metric_outputs(cfg, where)
    output_type.check_config(cfg, where)
    if cfg.perturbation is not None:
        from mmcomp_eval.perturb.kinds import KINDS
        from mmcomp_eval.perturb.tokens import POS_ROLES

        one_of(where, "perturbation.kind", cfg.perturbation.kind, KINDS)
        one_of(where, "perturbation.pos_roles", cfg.perturbation.pos_roles, tuple(POS_ROLES))
    return cfg


def _check_metric_outputs(cfg: TaskConfig, where: str) -> None:
    """Each metric reads predictions of the kind the task's output type makes (retrieval: ranks, not text)."""
    from mmcomp_eval.metrics import METRICS

    for mc in cfg.metrics:
        if mc.name not in METRICS:
            continue  # an unknown name is reported, with suggestions, when the metric is built
        allowed = METRICS.get(mc.name).output_types
        if allowed is not None and cfg.output_type not in allowed:
            raise UserError(f"{where}: metric '{mc.name}' scores output_type {', '.join(allowed)}, not "
                            f"'{cfg.output_type}'; use it in a task of that output type")


def load_checked(path) -> TaskConfig | GroupConfig:
    """A task or group file, read and checked (the way the task index and ``validate`` read files)."""
    cfg = load_task_file(path)
    return cfg if isinstance(cfg, GroupConfig) else check_task(cfg)
