"""Where the candidate answers of ``rank_choices`` tasks come from.

A task names a source (``choices: ek100_verb_classes``); a source is a
function ``(task, data context) -> candidate answers`` registered here, so a
new candidate list (another dataset's classes, a file next to the task) is a
registration, not a change to the evaluator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from mmcomp_eval.registry import Registry

if TYPE_CHECKING:
    from mmcomp_eval.config.task_config import TaskConfig
    from mmcomp_eval.tasks.loaders import DataContext

ChoiceSource = Callable[["TaskConfig", "DataContext"], "tuple[str, ...]"]
CHOICE_SOURCES: Registry[ChoiceSource] = Registry("choice source")


def _ek100_classes(ctx: DataContext):
    from mmcomp_eval.data import ek100
    from mmcomp_eval.data.vocab import CategoryIndex

    files = ek100.locate(ctx.ek100_dir, offline=ctx.offline)
    return CategoryIndex.from_csv(files.verb_classes, files.noun_classes)


@CHOICE_SOURCES.register("ek100_verb_classes")
def ek100_verb_classes(task: TaskConfig, ctx: DataContext) -> tuple[str, ...]:
    """The 97 EK-100 verb classes in the order of the class table, spelt as narrations spell them (``pick up``)."""
    from mmcomp_eval.data.vocab import plain_verb

    return tuple(plain_verb(c.key) for c in _ek100_classes(ctx).verbs.values())


@CHOICE_SOURCES.register("ek100_noun_classes")
def ek100_noun_classes(task: TaskConfig, ctx: DataContext) -> tuple[str, ...]:
    """The 300 EK-100 noun classes in the order of the class table, modifiers first (``chopping board``)."""
    from mmcomp_eval.data.vocab import plain_noun

    return tuple(plain_noun(c.key) for c in _ek100_classes(ctx).nouns.values())
