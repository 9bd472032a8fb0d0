"""Running tasks against a model: the pipeline every sample passes through.

task config -> documents -> few-shot selection -> prompt rendering ->
model request -> response -> metric -> aggregate -> results file.
Everything the run needs is checked before the model is asked anything
(templates render, images vs model, shots vs pool), so that a mistake costs
seconds, not a GPU hour.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mmcomp_eval.evaluation import bootstrap

from mmcomp_eval.evaluation import gap

from mmcomp_eval.runtime import parallel
from mmcomp_eval.evaluation.aggregate import aggregate
from mmcomp_eval.api.document import Document
from mmcomp_eval.api.model import Model
from mmcomp_eval.api.request import DEFAULT_SETTINGS, SAMPLING_FIELDS, GenerationRequest, LoglikelihoodRequest
from mmcomp_eval.tasks.loaders import DataContext, load_documents
from mmcomp_eval.errors import UserError
from mmcomp_eval.tasks.fewshot import ShotExclusion, build_sampler, sampler_options
from mmcomp_eval.media.resolver import TaskMedia
from mmcomp_eval.tasks.prompting import PromptTemplate, RenderedPrompt
from mmcomp_eval.tasks.responses import parse_generation, parse_ranking
from mmcomp_eval.evaluation.results import ResultWriter, RunRecord, sha256_json
from mmcomp_eval.config.task_config import TaskConfig, parse_generation_overrides
from mmcomp_eval.tasks.index import TaskIndex, find_template


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
    limit: int | None = None
    split: str | None = None          # None: the task's eval_split
    sampler: str | None = None        # None: the task's fewshot.sampler
    apply_chat_template: bool = False
    include_paths: tuple[Path, ...] = ()
    data: DataContext = field(default_factory=DataContext)
    progress: bool = True

    def validate(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise UserError(f"--limit {self.limit}: expected a positive number of documents")
        if self.shots is not None and self.shots < 0:
            raise UserError(f"--shots {self.shots}: expected 0 or more")
        if not self.seeds:
            raise UserError("--seeds must be at least 1")
        parse_generation_overrides(self.gen_kwargs)  # keys and types; combinations are checked per task


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
    choices: tuple[str, ...] = ()
    media: TaskMedia | None = None             # keyframes of image prompts, skipped documents
    shot_exclusion: ShotExclusion = ShotExclusion("no_shots")  # what the shared-clip rule removed


def with_generation_overrides(task: TaskConfig, overrides: dict[str, Any]) -> TaskConfig:
    """``task`` with ``--gen-kwargs`` applied to its ``generation:``, checked as a whole.

    ``do_sample=false`` also turns off the task's own sampling settings
    (temperature, top_p, top_k), which would otherwise be an error.
    """
    if not overrides:
        return task
    base = task.generation
    if overrides.get("do_sample") is False:
        base = replace(base, **{f: getattr(DEFAULT_SETTINGS, f) for f in SAMPLING_FIELDS})
    settings = replace(base, **overrides)
    problem = settings.problem()
    if problem:
        given = ",".join(f"{k}={json.dumps(v)}" for k, v in overrides.items())
        raise UserError(f"task {task.task}: generation {problem} (--gen-kwargs {given} over {task.source})")
    return replace(task, generation=settings)


def prepare(task: TaskConfig, model: Model, opts: RunOptions, index: TaskIndex) -> PreparedTask:
    task = with_generation_overrides(task, opts.gen_kwargs)
    split = opts.split or task.eval_split
    docs = load_documents(task, split, opts.data)
    if opts.limit is not None:
        docs = docs[: opts.limit]
    if not docs:
        raise UserError(f"task {task.task}: split '{split}' has no documents")
    k = task.fewshot.k if opts.shots is None else opts.shots
    if model.capabilities.reads_documents:
        return PreparedTask(task, split, docs, 0, None, {}, {s: [[] for _ in docs] for s in opts.seeds})
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
    if n_images and not model.capabilities.images:
        raise UserError(f"task {task.task} puts {n_images} images in its prompts but model '{model.name}' is "
                        "text-only; use a vision-language model or a text-only template")
    max_images = model.capabilities.max_images
    if n_images and max_images is not None and n_images > max_images:
        raise UserError(f"task {task.task}: prompts hold up to {n_images} images but model '{model.name}' "
                        f"takes at most {max_images}; use fewer shots")
    media = None
    if n_images and model.capabilities.reads_images:  # a VLM run text-only (images=false) needs no frames
        media = TaskMedia.materialise(task, docs, pool, prompts, progress=opts.progress)
        keep = [i for i, d in enumerate(docs) if d.id not in media.skipped]
        if not keep:
            raise UserError(f"task {task.task}: every document was skipped for unreadable media; "
                            f"first reason: {next(iter(media.skipped.values()))}")
        docs = [docs[i] for i in keep]
        prompts = {s: [ps[i] for i in keep] for s, ps in prompts.items()}
        shot_ids = {s: [ids[i] for i in keep] for s, ids in shot_ids.items()}
    choices = _choices(task, opts) if task.output_type == "rank_choices" else ()
    return PreparedTask(task, split, docs, k, template, prompts, shot_ids, choices, media, exclusion)


def _choices(task: TaskConfig, opts: RunOptions) -> tuple[str, ...]:
    from mmcomp_eval.data import ek100
    from mmcomp_eval.data.vocab import CategoryIndex, plain_noun, plain_verb

    files = ek100.locate(opts.data.ek100_dir, offline=opts.data.offline)
    index = CategoryIndex.from_csv(files.verb_classes, files.noun_classes)
    if task.choices == "ek100_verb_classes":
        return tuple(plain_verb(c.key) for c in index.verbs.values())
    return tuple(plain_noun(c.key) for c in index.nouns.values())


def requests_for(prepared: PreparedTask, seed: int) -> tuple[str, list, dict]:
    """(kind, requests, extra keyword arguments) one seed of a task sends to the model.

    Separate from :func:`predict` so that data-parallel processes can answer
    slices of exactly the requests the single-process run will ask.
    """
    task = prepared.config
    prompts = prepared.prompts[seed]
    if task.output_type == "rank_choices":
        reqs = [LoglikelihoodRequest(d.id, p.text, tuple(" " + c for c in prepared.choices), p.messages)
                for d, p in zip(prepared.docs, prompts)]
        return "loglikelihood", reqs, {}
    settings = task.generation.for_seed(seed)
    reqs = [GenerationRequest(d.id, p.text, settings, p.messages, tuple(f"{i.doc_id}#{i.clip}" for i in p.images))
            for d, p in zip(prepared.docs, prompts)]
    images = {"images": prepared.media.images_for(reqs)} if prepared.media else {}
    return "generate", reqs, images


def predict(prepared: PreparedTask, model: Model, seed: int, progress: bool) -> tuple[list[str], list[str]]:
    """(raw outputs, parsed predictions) for one seed."""
    task = prepared.config
    if model.capabilities.reads_documents:
        preds = model.predict_from_documents(prepared.docs, task)
        return preds, preds
    kind, reqs, extra = requests_for(prepared, seed)
    bar = tqdm(total=len(reqs), desc=f"{task.task} seed {seed}", disable=not progress, unit="req")
    try:
        if kind == "loglikelihood":
            scores = model.loglikelihood(reqs, progress=bar.update, **extra)
            preds = [parse_ranking(prepared.choices, s) for s in scores]
            return preds, preds
        raw = model.generate(reqs, progress=bar.update, **extra)
    finally:
        bar.close()
    return raw, [parse_generation(r) for r in raw]


def build_metrics(task: TaskConfig, resources) -> list:
    """The task's metrics, built before inference so a bad option or a missing scoring model fails early."""
    from mmcomp_eval.metrics import build_metric

    return [build_metric(mc.name, mc.options, resources) for mc in task.metrics]


def score(prepared: PreparedTask, predictions: Sequence[str], metrics: Sequence) -> dict:
    refs = [str(d[prepared.config.target_field]) for d in prepared.docs]
    return {m.name: (m.compute(predictions, refs, prepared.docs), m.describe()) for m in metrics}


def metric_resources(tasks: Sequence[TaskConfig], opts: RunOptions):
    from mmcomp_eval.metrics.registry import MetricResources

    from mmcomp_eval.metrics import METRICS

    needs_map = any(METRICS.canonical(m.name) == "category_accuracy" for t in tasks for m in t.metrics)
    categories = None
    if needs_map:
        from mmcomp_eval.data import ek100
        from mmcomp_eval.data.category_map import CategoryMap

        categories = CategoryMap.load(ek100.locate(opts.data.ek100_dir, offline=opts.data.offline))
    return MetricResources(category_map=categories, offline=opts.data.offline)


def run(tasks: Sequence[TaskConfig], model: Model, model_info: dict, opts: RunOptions, index: TaskIndex,
        writer: ResultWriter) -> RunRecord | None:
    """Evaluate; ``None`` in a data-parallel helper process (process 0 writes the results)."""
    opts.validate()
    prepared = [prepare(t, model, opts, index) for t in tasks]  # all checks before any inference
    gaps = gap.GapTracker(gap.twin_pairs(tasks, {p.config.task: p.shots for p in prepared}, list(index.tasks)))
    resources = metric_resources(tasks, opts)
    metrics = {t.task: build_metrics(t, resources) for t in tasks}
    proc = parallel.current()
    if proc.world_size > 1 and not model.capabilities.reads_documents:
        parallel.answer_shard(model, [requests_for(p, s) for p in prepared for s in opts.seeds], proc)
    if not proc.is_main:
        return None
    record = RunRecord(model=model_info, config=_run_config(opts))
    for p in prepared:
        per_seed: dict[str, list[float]] = {}
        details: dict = {}
        seed_runs: list[tuple[list[str], dict]] = []
        for seed in opts.seeds:
            raw, preds = predict(p, model, seed, opts.progress)
            scored = score(p, preds, metrics[p.config.task])
            writer.append_samples(_sample_rows(p, seed, raw, preds, scored))
            seed_runs.append((preds, {name: result for name, (result, _) in scored.items()}))
            for name, (result, describe) in scored.items():
                per_seed.setdefault(name, []).append(result.value)
                details[name] = describe
        stats = bootstrap.task_statistics(p.config, p.docs, seed_runs, resources)
        record.tasks[p.config.task] = _task_record(p, per_seed, details, opts, bootstrap.task_stderr(stats, len(p.docs)))
        record.gaps += gaps.add(p.config.task, gap.TaskScores(len(p.docs), per_seed, stats))
        record.cache = model.cache_report()
        writer.write_results(record)
    return record


#: run options that change how a run looks, not what it computes: left out of results.json so that two
#: runs that computed the same things write the same record
_PRESENTATION_OPTIONS = ("progress",)


def _run_config(opts: RunOptions) -> dict:
    d = asdict(opts)
    for name in _PRESENTATION_OPTIONS:
        d.pop(name, None)
    d["include_paths"] = [str(p) for p in opts.include_paths]
    d["data"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in d["data"].items()}
    return d


def _sample_rows(p: PreparedTask, seed: int, raw: list[str], preds: list[str], scored: dict) -> list[dict]:
    rows = []
    for i, d in enumerate(p.docs):
        prompt = p.prompts[seed][i] if p.prompts else None
        rows.append({
            "task": p.config.task, "seed": seed, "doc_id": d.id,
            "prompt": prompt.text if prompt else None,
            "messages": [asdict(m) for m in prompt.messages] if prompt and prompt.messages else None,
            "images": [f"{im.doc_id}#{im.clip}" for im in prompt.images] if prompt else [],
            "shot_ids": p.shot_ids[seed][i],
            "raw_output": raw[i], "prediction": preds[i],
            "target": str(d[p.config.target_field]),
            "scores": {name: round(res.per_sample[i], 4) for name, (res, _) in scored.items()},
        })
    return rows


def _task_record(p: PreparedTask, per_seed: dict, details: dict, opts: RunOptions, stderr: dict | None = None) -> dict:
    metrics = {name: {**aggregate(name, values).as_dict(), **(stderr or {}).get(name, {})}
               for name, values in per_seed.items()}
    return {
        "config": asdict(p.config),
        "split": p.split,
        "n_documents": len(p.docs),
        "shots": p.shots,
        "fewshot_exclusion": p.shot_exclusion.as_dict(),
        "seeds": list(opts.seeds),
        "documents_sha256": sha256_json([[d.id, dict(d.fields)] for d in p.docs]),
        "template_sha256": sha256_json(p.template.source) if p.template else None,
        "prompts_sha256": {str(s): sha256_json([[x.text, x.images] for x in ps]) for s, ps in p.prompts.items()},
        "metrics": metrics,
        "metric_details": details,
        "generation": _generation_record(p),
        **(p.media.record() if p.media else {"n_skipped": 0}),
    }


def _generation_record(p: PreparedTask) -> dict | None:
    """The decoding the task's answers came from (null when the task does not generate)."""
    if p.config.output_type != "generate" or p.template is None:
        return None
    settings = asdict(p.config.generation)
    del settings["seed"]
    sampling = ("per request: a hash of the seed and the request's prompt, messages and images"
                if p.config.generation.do_sample else "none (deterministic decoding: the seed only changes the shots)")
    return {**settings, "sampling_seed": sampling}
