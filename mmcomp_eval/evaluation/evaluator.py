"""Running prepared tasks against a model: the pipeline every sample passes through.

task config -> :func:`~mmcomp_eval.evaluation.prepare.prepare` (documents,
shots, prompts, media folders) -> keyframes -> the task's output type builds requests -> model ->
the output type parses answers -> metrics -> aggregate -> results file.

:func:`plan` does every check a run can make without the model (it needs
only the model's name and declared capabilities); :func:`execute` then asks
the model. Nothing here knows a task, an output type or a metric by name:
those come from their registries.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from mmcomp_eval.api.model import Model
from mmcomp_eval.config.task_config import TaskConfig
from mmcomp_eval.evaluation import bootstrap, gap
from mmcomp_eval.evaluation.aggregate import aggregate
from mmcomp_eval.evaluation.prepare import ModelPlan, PreparedTask, RunOptions, load_media, prepare
from mmcomp_eval.evaluation.results import ResultWriter, RunRecord, sha256_json
from mmcomp_eval.metrics import MetricResources, build_metric
from mmcomp_eval.runtime import parallel
from mmcomp_eval.tasks.index import TaskIndex

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """Every task prepared and every metric built: what a run needs besides the model itself."""

    opts: RunOptions
    prepared: list[PreparedTask]
    metrics: dict[str, list]          # task name -> its metrics, in task-file order
    resources: MetricResources
    gaps: gap.GapTracker


def plan(tasks: Sequence[TaskConfig], model: Model | ModelPlan, opts: RunOptions, index: TaskIndex) -> RunPlan:
    """Prepare every task and build every metric: all checks before any inference (or any model load).

    ``opts.predict_only`` builds no metric (so a scorer that cannot load, such
    as BERTScore's model offline, does not stop the answers being made) and
    tracks no compositional gap.
    """
    opts.validate()
    prepared = [prepare(t, model, opts, index) for t in tasks]
    twins = [] if opts.predict_only else gap.twin_pairs(tasks, {p.config.task: p.shots for p in prepared},
                                                          list(index.tasks))
    resources = MetricResources(opts.data)  # built once, on first use by a metric that declares them
    metrics = {p.config.task: [] if opts.predict_only else
               [build_metric(mc.name, mc.options, resources) for mc in p.config.metrics] for p in prepared}
    for p in prepared:
        log.info("task %s: %d %s documents, %d shots, %s", p.config.task, len(p.docs), p.split, p.shots,
                 "predictions only (no metrics)" if opts.predict_only else
                 "metrics " + ", ".join(m.name for m in metrics[p.config.task]))
    return RunPlan(opts, prepared, metrics, resources, gap.GapTracker(twins))


def run(tasks: Sequence[TaskConfig], model: Model, model_info: dict, opts: RunOptions, index: TaskIndex,
        writer: ResultWriter) -> RunRecord | None:
    """Plan and execute with a model already built (``mmcomp_eval.evaluate`` builds it after planning)."""
    return execute(plan(tasks, model, opts, index), model, model_info, writer)


def execute(run_plan: RunPlan, model: Model, model_info: dict, writer: ResultWriter) -> RunRecord | None:
    """Ask the model, score, record; ``None`` in a data-parallel helper process (process 0 writes the results)."""
    opts = run_plan.opts
    for p in run_plan.prepared:
        load_media(p, opts.progress)
    proc = parallel.current()
    shards = None
    if proc.world_size > 1 and not model.capabilities.reads_documents:
        shards = parallel.answer_shard(model, [p.output.requests(p, s) for p in run_plan.prepared for s in opts.seeds],
                                       proc)
    if not proc.is_main:
        return None
    record = RunRecord(model=model_info, config=_run_config(opts), command=parallel.user_command(),
                       processes=parallel.process_record(proc))
    for p in run_plan.prepared:
        per_seed: dict[str, list[float]] = {}
        details: dict = {}
        seed_runs: list[tuple[list[str], dict]] = []
        for seed in opts.seeds:
            raw, preds = predict(p, model, seed, opts.progress)
            if run_plan.metrics[p.config.task]:
                log.info("task %s seed %d: scoring", p.config.task, seed)
            scored = score(p, preds, run_plan.metrics[p.config.task])
            writer.append_samples(_sample_rows(p, seed, raw, preds, scored))
            seed_runs.append((preds, {name: result for name, (result, _) in scored.items()}))
            for name, (result, describe) in scored.items():
                per_seed.setdefault(name, []).append(result.value)
                details[name] = describe
        if opts.predict_only:
            record.tasks[p.config.task] = _task_record(p, per_seed, details, opts)
        else:
            stats = bootstrap.task_statistics(p.config, p.docs, seed_runs, run_plan.resources)
            record.tasks[p.config.task] = _task_record(p, per_seed, details, opts,
                                                       bootstrap.task_stderr(stats, len(p.docs)))
            record.gaps += run_plan.gaps.add(p.config.task, gap.TaskScores(len(p.docs), per_seed, stats))
        record.cache = parallel.cache_record(model.cache_report(), shards)
        writer.write_results(record)
    return record


def predict(prepared: PreparedTask, model: Model, seed: int, progress: bool) -> tuple[list, list[str]]:
    """(raw answers, parsed predictions) for one seed."""
    task = prepared.config
    if prepared.output is None:  # the model reads documents
        log.info("task %s seed %d: %s reads %d documents", task.task, seed, model.name, len(prepared.docs))
        preds = model.predict_from_documents(prepared.docs, task)
        return preds, preds
    call = prepared.output.requests(prepared, seed)
    log.info("task %s seed %d: %d %s requests", task.task, seed, len(call.requests), call.method)
    bar = tqdm(total=len(call.requests), desc=f"{task.task} seed {seed}", disable=not progress, unit="req")
    try:
        raw = getattr(model, call.method)(call.requests, progress=bar.update, **call.extra)
    finally:
        bar.close()
    return prepared.output.read(raw, model)


def score(prepared: PreparedTask, predictions: Sequence[str], metrics: Sequence) -> dict:
    refs = [str(d[prepared.config.target_field]) for d in prepared.docs]
    return {m.name: (m.compute(predictions, refs, prepared.docs), m.describe()) for m in metrics}


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


def _sample_rows(p: PreparedTask, seed: int, raw: list, preds: list[str], scored: dict) -> list[dict]:
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
            # a metric that does not score this document (NaN: another retrieval direction's) is left out
            "scores": {name: round(res.per_sample[i], 4) for name, (res, _) in scored.items()
                       if not math.isnan(res.per_sample[i])},
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
        # false for --predict-only runs: answers made and stored, no metric built
        "scored": not opts.predict_only,
        # the decoding the answers came from: null unless the task generates and the model is asked
        "generation": None,
        # the model adapter's own defaults this task used: decoding settings, prompt variant
        "model_defaults": p.model_defaults,
        **(p.output.record(p) if p.output else {}),
        **(p.media.record() if p.media else {"n_skipped": 0}),
    }
