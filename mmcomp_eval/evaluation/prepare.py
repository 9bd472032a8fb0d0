"""Preparing a task for a model: everything a run does before the first request.

task config -> documents -> few-shot selection -> prompt rendering -> media
folders -> the output type's answer space. Preparation needs only what the
model *is* (its name and declared capabilities), never the model itself, so a
run prepares every task before the model loads: a bad split, sampler,
template, media folder or choice list costs seconds, not a model load. The
keyframes themselves are decoded by :func:`load_media`, after the model is
built and before it is asked anything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.model import Model, ModelCapabilities, ModelDefaults
from mmcomp_eval.api.request import DEFAULT_SETTINGS, SAMPLING_FIELDS
from mmcomp_eval.api.task import OutputType, limited
from mmcomp_eval.config.task_config import TaskConfig, parse_generation_overrides
from mmcomp_eval.errors import UserError
from mmcomp_eval.media.resolver import TaskMedia
from mmcomp_eval.tasks.fewshot import SAMPLERS, ShotExclusion, build_sampler, sampler_options
from mmcomp_eval.tasks.index import TaskIndex, find_template
from mmcomp_eval.tasks.loaders import DataContext, load_documents
from mmcomp_eval.tasks.outputs import OUTPUT_TYPES
from mmcomp_eval.tasks.prompting import PromptTemplate, RenderedPrompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """One run's options.

    A seed (``seeds``) changes two things and nothing else: the few-shot
    draws (tie-breaks of ``similar``, the picks of ``random``) and, when the
    generation settings sample, the sampling seed of every request. With
    greedy decoding and the ``first`` sampler, every seed gives the same answers.
    """

    shots: int | None = None          # None: the task's fewshot.k
    seeds: tuple[int, ...] = (0,)
    #: ``--gen-kwargs``: GenerationSettings fields that override every task's ``generation:``
    gen_kwargs: dict[str, Any] = field(default_factory=dict)
    #: the first N documents of each task; a fraction below 1 takes that share of them, rounded up (lm-eval's rule)
    limit: int | float | None = None
    split: str | None = None          # None: the task's eval_split
    sampler: str | None = None        # None: the task's fewshot.sampler
    apply_chat_template: bool = False
    #: ``--system-instruction``: put before every task's instruction (lm-eval's system instruction)
    system_instruction: str | None = None
    #: generate and store answers, build no metric and score nothing
    predict_only: bool = False
    include_paths: tuple[Path, ...] = ()
    data: DataContext = field(default_factory=DataContext)
    progress: bool = True

    def validate(self) -> None:
        limit = self.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0
                                  or (limit >= 1 and limit != int(limit))):
            raise UserError(f"--limit {limit}: expected a positive number of documents, or a fraction below 1")
        if self.system_instruction is not None and not isinstance(self.system_instruction, str):
            raise UserError(f"--system-instruction {self.system_instruction!r}: expected text")
        if self.shots is not None and (isinstance(self.shots, bool) or not isinstance(self.shots, int)
                                       or self.shots < 0):
            raise UserError(f"--shots {self.shots!r}: expected a whole number, 0 or more")
        if not self.seeds:
            raise UserError("--seeds must be at least 1")
        bad = [s for s in self.seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
        if bad:  # numpy's generators take non-negative seeds only
            raise UserError(f"--seed {bad[0]!r}: expected a whole number, 0 or more")
        if self.sampler is not None:
            SAMPLERS.get(self.sampler)  # an unknown name is an error even for tasks that draw no shots
        parse_generation_overrides(self.gen_kwargs)  # keys and types; combinations are checked per task


@dataclass(frozen=True)
class ModelPlan:
    """What a run knows of its model before building it: enough to prepare every task."""

    name: str
    capabilities: ModelCapabilities
    defaults: ModelDefaults = field(default_factory=ModelDefaults)


@dataclass
class PreparedTask:
    """A task with its documents and per-seed prompts, ready for the model."""

    config: TaskConfig
    split: str
    docs: list[Document]
    shots: int
    template: PromptTemplate | None
    prompts: dict[int, list[RenderedPrompt]]   # seed -> one prompt per doc
    shot_ids: dict[int, list[list[str]]]       # seed -> shot ids per doc
    #: builds the requests and reads the answers; None for models that read documents
    output: OutputType | None = None
    media: TaskMedia | None = None             # keyframes of image prompts, skipped documents
    shot_exclusion: ShotExclusion = ShotExclusion("no_shots")  # what the shared-clip rule removed
    #: the few-shot pool, whose keyframes :func:`load_media` makes too
    pool: list[Document] = field(default_factory=list)
    #: the prompts hold images the model looks at: :func:`load_media` must run before it is asked
    needs_media: bool = False
    #: what of the model's own defaults this task used (results.json ``model_defaults``)
    model_defaults: dict[str, Any] = field(default_factory=dict)


def with_generation_overrides(task: TaskConfig, overrides: dict[str, Any],
                              model_defaults: Mapping[str, Any] | None = None) -> TaskConfig:
    """``task`` with ``--gen-kwargs`` applied to its ``generation:``, checked as a whole.

    ``do_sample=false`` also turns off the task's own sampling settings
    (temperature, top_p, top_k), which would otherwise be an error. The
    model's decoding defaults (``model_defaults``, applied next) count in
    the check: ``length_penalty`` alone is fine for a model that decodes
    with beams unless told otherwise.
    """
    if not overrides:
        return task
    base = task.generation
    if overrides.get("temperature") == 0 and not overrides.get("do_sample"):
        # lm-eval's spelling of greedy decoding (its HF model samples only when temperature > 0)
        overrides = {**{k: v for k, v in overrides.items() if k != "temperature"}, "do_sample": False}
    if overrides.get("do_sample") is False:
        base = replace(base, **{f: getattr(DEFAULT_SETTINGS, f) for f in SAMPLING_FIELDS})
    settings = replace(base, **overrides)
    problem = settings.problem()
    if problem and model_defaults:
        unset = {k: v for k, v in model_defaults.items() if k not in overrides and k not in task.generation_keys}
        if replace(settings, **unset).problem() is None:
            problem = None  # the model's defaults complete it (checked again once they are applied)
    if problem:
        given = ",".join(f"{k}={json.dumps(v)}" for k, v in overrides.items())
        raise UserError(f"task {task.task}: generation {problem} (--gen-kwargs {given} over {task.source})")
    return replace(task, generation=settings)


def with_model_generation_defaults(task: TaskConfig, defaults: Mapping[str, Any],
                                   overridden: Collection[str]) -> tuple[TaskConfig, dict[str, Any]]:
    """``task`` with a model's decoding defaults where neither its file nor ``--gen-kwargs`` (``overridden``) set them.

    A field counts as set by the task when its file names it or, for a
    TaskConfig built in Python, when it differs from the built-in default.
    A default that would contradict what was chosen (a beam width when the
    task samples, a length penalty without beams) is left out; the
    defaults are tried in the model's order. Returns the task and the
    defaults applied.
    """
    current = task.generation
    given = {*overridden, *task.generation_keys,
             *(f.name for f in fields(current) if getattr(current, f.name) != getattr(DEFAULT_SETTINGS, f.name))}
    applied: dict[str, Any] = {}
    for name, value in defaults.items():
        candidate = replace(current, **{name: value})
        if name not in given and candidate.problem() is None:
            current, applied[name] = candidate, value
    return (replace(task, generation=current) if applied else task), applied


def with_system_instruction(task: TaskConfig, system_instruction: str | None) -> TaskConfig:
    """``task`` whose instruction starts with ``--system-instruction``, joined as lm-eval joins it to a description."""
    if not system_instruction or task.prompt is None:  # retrieval tasks have no prompt to instruct
        return task
    instruction = f"{system_instruction}\n\n{task.prompt.instruction}" if task.prompt.instruction else system_instruction
    return replace(task, prompt=replace(task.prompt, instruction=instruction))


def prepare(task: TaskConfig, model: Model | ModelPlan, opts: RunOptions, index: TaskIndex) -> PreparedTask:
    """Documents, shots, prompts, media and answer space of ``task`` for ``model``; asks the model nothing."""
    task = with_generation_overrides(task, opts.gen_kwargs, model.defaults.generation)
    task = with_system_instruction(task, opts.system_instruction)
    task, applied = with_model_generation_defaults(task, model.defaults.generation, opts.gen_kwargs)
    problem = task.generation.problem()
    if problem:
        raise UserError(f"task {task.task}: generation {problem} (with model '{model.name}''s defaults "
                        f"{json.dumps(applied)})")
    variants = task.prompt.variants if task.prompt is not None else {}  # retrieval tasks render no prompt
    variant = model.defaults.prompt_variant if model.defaults.prompt_variant in variants else None
    task = task.with_prompt_variant(variant)
    model_defaults = {"generation": applied, "prompt_variant": variant}
    split = opts.split or task.eval_split
    output_type = OUTPUT_TYPES.get(task.output_type)
    if not output_type.prompted:
        return _prepare_unprompted(task, split, output_type, model, opts)
    docs = load_documents(task, split, opts.data)
    docs = docs[: limited(len(docs), opts.limit)]
    if not docs:
        raise UserError(f"task {task.task}: split '{split}' has no documents")
    k = task.fewshot.k if opts.shots is None else opts.shots
    caps = model.capabilities
    if caps.reads_documents:
        return PreparedTask(task, split, docs, 0, None, {}, {s: [[] for _ in docs] for s in opts.seeds})
    _check_model(task, output_type, model)
    template = PromptTemplate(find_template(task, index.search_dirs), max_chars=task.prompt.max_chars)
    sampler_name = opts.sampler or task.fewshot.sampler
    sampler = build_sampler(sampler_name, sampler_options(sampler_name, task.fewshot.sampler, task.fewshot.options))
    pool = load_documents(task, task.fewshot_split, opts.data) if k > 0 else []
    prompts, shot_ids = {}, {}
    exclusion = ShotExclusion("no_shots")
    for seed in opts.seeds:
        try:
            selection = sampler.choose(docs, pool, k, seed)
        except UserError as exc:
            raise UserError(f"task {task.task}: {exc}") from None
        picks, exclusion = selection.picks, selection.exclusion  # the exclusion does not depend on the seed
        shot_ids[seed] = [[pool[i].id for i in row] for row in picks]
        prompts[seed] = [template.render(d, [pool[i] for i in row], task.prompt.instruction,
                                         chat=opts.apply_chat_template) for d, row in zip(docs, picks)]
    n_images = max(len(p.images) for ps in prompts.values() for p in ps)
    if n_images and not caps.images:
        raise UserError(f"task {task.task} puts {n_images} images in its prompts but model '{model.name}' is "
                        "text-only; use a vision-language model or a text-only template")
    if n_images and caps.max_images is not None and n_images > caps.max_images:
        raise UserError(f"task {task.task}: prompts hold up to {n_images} images but model '{model.name}' "
                        f"takes at most {caps.max_images}; use fewer shots")
    needs_media = bool(n_images and caps.reads_images)  # a VLM run text-only (images=false) needs no frames
    if needs_media:
        TaskMedia.resolver(task)  # the media section and its folders; decoding waits for load_media
    return PreparedTask(task, split, docs, k, template, prompts, shot_ids, output_type(task, opts.data),
                        shot_exclusion=exclusion, pool=pool, needs_media=needs_media, model_defaults=model_defaults)


def _check_model(task: TaskConfig, output_type: type[OutputType], model: Model | ModelPlan) -> None:
    problem = output_type.model_problem(model.capabilities)
    if problem:
        raise UserError(f"task {task.task} has output_type '{task.output_type}' but model '{model.name}' {problem}; "
                        "pick a model that can, or a task of another output type")


def _prepare_unprompted(task: TaskConfig, split: str, output_type: type[OutputType], model: Model | ModelPlan,
                        opts: RunOptions) -> PreparedTask:
    """A task whose output type asks about the documents themselves: it loads them and says what each stands for.

    No template, shots or keyframes; ``--shots`` and ``--sampler`` do not
    apply. Even a model that reads documents must be able to answer it.
    """
    _check_model(task, output_type, model)
    output = output_type(task, opts.data)
    try:
        docs = output.documents(split, opts.limit)
    except UserError as exc:  # a dataset's own words ("msrvtt has no split 'x'"): say which task asked
        if f"task {task.task}" in str(exc):
            raise
        raise UserError(f"task {task.task}: {exc}") from None
    if not docs:
        raise UserError(f"task {task.task}: split '{split}' has no documents")
    return PreparedTask(task, split, docs, 0, None, {s: output.inputs(docs, s) for s in opts.seeds},
                        {s: [[] for _ in docs] for s in opts.seeds}, output)


def load_media(prepared: PreparedTask, progress: bool) -> None:
    """Make the keyframes of every prompt image and drop documents whose media was skipped.

    Separate from :func:`prepare` because it decodes video: a run checks
    every task (folders included) first, builds the model, then decodes,
    so a model that cannot load fails before minutes of decoding, and a
    broken video still fails before the model is asked anything.
    """
    if not prepared.needs_media or prepared.media is not None:
        return
    p = prepared
    log.info("task %s: keyframes of %d documents and %d few-shot documents", p.config.task, len(p.docs), len(p.pool))
    media = TaskMedia.materialise(p.config, p.docs, p.pool, p.prompts, progress=progress)
    keep = [i for i, d in enumerate(p.docs) if d.id not in media.skipped]
    if not keep:
        raise UserError(f"task {p.config.task}: every document was skipped for unreadable media; "
                        f"first reason: {next(iter(media.skipped.values()))}")
    p.media = media
    p.docs = [p.docs[i] for i in keep]
    p.prompts = {s: [ps[i] for i in keep] for s, ps in p.prompts.items()}
    p.shot_ids = {s: [ids[i] for i in keep] for s, ids in p.shot_ids.items()}
