"""``mmcomp-eval export lm-eval``: tasks as a folder that lm-evaluation-harness 0.4 runs.

``lm_eval --include_path DIR --tasks compact_nup ...`` then evaluates any
lm-eval model on exactly the prompts mmcomp-eval would send and scores the
answers with mmcomp-eval's metrics. lm-eval has neither a similarity
sampler nor the EK-100 category map, so the export does what lm-eval cannot
and hands over only data and self-contained code:

* ``<task>.jsonl`` -- the evaluated documents with their prompts already
  rendered by mmcomp-eval (the task's template and instruction, its few-shot
  sampler and shared-clip rule, the seed), the target, the shot ids and the
  target classes category accuracy reads;
* ``<task>.yaml`` -- an lm-eval task: those documents as its test split, the
  prompt as ``doc_to_text``, no few-shot examples of its own (they are in
  the prompt), the task's generation settings as ``generation_kwargs``, and
  the metrics through ``!function`` hooks;
* ``utils.py`` -- the hooks (:mod:`mmcomp_eval.export.lm_eval_hooks`) with
  the text normalisation and the category map's rules inlined
  (:mod:`mmcomp_eval.export.standalone`): the same code that scores an
  mmcomp-eval run;
* ``category_map.json`` -- the category map's tables, learned from the
  EK-100 annotations of the export's ``--ek100-dir`` (when a task has
  category accuracy);
* ``mmcomp_export.json`` -- what was exported and how (the metrics with
  their resolved options, read by the hooks; documents and prompts SHA-256,
  as results.json records them) and ``README.md``.

Exported: generated-text tasks without images; metrics ``bleu``,
``exact_match`` and ``category_accuracy`` (``bertscore`` is left out and
listed as such: it needs its model). Only greedy decoding reproduces
mmcomp-eval's answers: sampled decoding in lm-eval uses its own random
stream, not mmcomp-eval's per-request seeds.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mmcomp_eval.api.model import ModelCapabilities
from mmcomp_eval.config.task_config import TaskConfig
from mmcomp_eval.data.category_rules import LEMMATIZERS, TARGET_FIELDS
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.prepare import ModelPlan, PreparedTask, RunOptions, prepare
from mmcomp_eval.evaluation.results import sha256_json
from mmcomp_eval.export.standalone import amalgamate
from mmcomp_eval.metrics import METRICS, MetricResources, build_metric
from mmcomp_eval.metrics.category_accuracy import CATEGORY_MAP
from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.tasks.index import TaskIndex
from mmcomp_eval.tasks.loaders import DataContext
from mmcomp_eval.version import __version__

MANIFEST_FILE = "mmcomp_export.json"
CATEGORY_MAP_FILE = "category_map.json"
UTILS_FILE = "utils.py"
#: what the written utils.py is made of, in order (see mmcomp_eval/export/standalone.py)
STANDALONE_MODULES = ("mmcomp_eval.textnorm", "mmcomp_eval.data.category_rules", "mmcomp_eval.export.lm_eval_hooks")
EXPORTABLE_METRICS = ("bleu", "exact_match", "category_accuracy")
#: what lm-eval needs to run the folder, besides itself and a model backend
REQUIREMENTS = {
    "sacrebleu": "BLEU (a dependency of lm-eval)",
    "datasets": "the documents (a dependency of lm-eval)",
    "spacy + en_core_web_sm": "optional: category accuracy's lemma tier, as in mmcomp-eval",
}
#: the model the export prepares prompts for: text in, text out
_TEXT_MODEL = ModelPlan("lm-eval export (text-only)", ModelCapabilities(generate=True))


@dataclass(frozen=True)
class ExportedTask:
    name: str
    n_documents: int
    shots: int
    #: each exported metric with its resolved options (what the hooks read)
    metrics: list[dict[str, Any]]
    #: the task's metrics that lm-eval cannot compute from the export
    not_exported: list[str] = field(default_factory=list)


def export_lm_eval(tasks: str | Sequence[str], output_dir: str | Path, *, shots: int | None = None, seed: int = 0,
                   limit: int | float | None = None, split: str | None = None, sampler: str | None = None,
                   system_instruction: str | None = None, include_paths: Sequence[str | Path] = (),
                   ek100_dir: str | Path | None = None, offline: bool = False) -> list[ExportedTask]:
    """Write ``tasks`` into ``output_dir`` (see the module docstring); what was exported, per task.

    The options are ``mmcomp-eval run``'s, for one seed; the prompts are the
    ones a run with the same options renders. ``output_dir`` must be new,
    empty or an earlier export (which is replaced as a whole).
    """
    out = Path(output_dir)
    _check_output_dir(out)
    opts = RunOptions(shots=shots, seeds=(seed,), limit=limit, split=split, sampler=sampler,
                      system_instruction=system_instruction, include_paths=tuple(Path(p) for p in include_paths),
                      data=DataContext(ek100_dir=Path(ek100_dir) if ek100_dir else None, offline=offline),
                      progress=False)
    opts.validate()
    index = TaskIndex.build(opts.include_paths)
    names = [n.strip() for n in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    configs = index.resolve([n for n in names if n])
    if not configs:
        raise UserError("--tasks is empty; see `mmcomp-eval ls tasks`")
    for config in configs:
        if config.output_type != "generate":
            raise UserError(f"task {config.task}: output_type '{config.output_type}' cannot be exported; lm-eval "
                            "runs the export's generated-text tasks only (output_type: generate)")
    resources = MetricResources(opts.data)
    exported = [_export_metrics(config, resources) for config in configs]
    prepared = [prepare(config, _TEXT_MODEL, opts, index) for config in configs]
    summaries = [ExportedTask(p.config.task, len(p.docs), p.shots, metrics, skipped)
                 for p, (metrics, skipped) in zip(prepared, exported)]
    needs_map = any(m["name"] == "category_accuracy" for s in summaries for m in s.metrics)
    with atomic_files.replacing_folder(out) as folder:
        for p, summary in zip(prepared, summaries):
            _write_documents(folder / f"{p.config.task}.jsonl", p, seed, summary)
            (folder / f"{p.config.task}.yaml").write_text(task_yaml(p.config, summary), encoding="utf-8")
        if needs_map:
            categories = resources.get(CATEGORY_MAP)
            data = {**categories.rules.to_json(), "lemmatizers": list(LEMMATIZERS),
                    "describe": {k: v for k, v in categories.describe().items() if k != "lemmatizer"}}
            (folder / CATEGORY_MAP_FILE).write_text(json.dumps(data, ensure_ascii=False, sort_keys=True),
                                                    encoding="utf-8")
        (folder / UTILS_FILE).write_text(utils_source(), encoding="utf-8")
        (folder / MANIFEST_FILE).write_text(
            json.dumps(_manifest(prepared, summaries, opts, seed), indent=2, ensure_ascii=False, sort_keys=True)
            + "\n", encoding="utf-8")
        (folder / "README.md").write_text(readme(summaries, out, needs_map), encoding="utf-8")
    return summaries


def utils_source() -> str:
    """The export's utils.py: the hooks with everything they use inlined."""
    header = (f"# utils.py of an mmcomp-eval {__version__} export for lm-evaluation-harness (`mmcomp-eval export "
              "lm-eval`).\n# Generated: the source of the modules below, in order, with the imports between them "
              "dropped.\n# Do not edit; export again. Needs only the standard library, datasets and sacrebleu "
              "(spaCy optional).")
    return amalgamate(STANDALONE_MODULES, header)


def _check_output_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--output-dir {out}: exists and is not a folder; name a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise UserError(f"--output-dir {out}: not empty and not an earlier export (no {MANIFEST_FILE}); an export "
                        "replaces its folder as a whole, so name a new or empty folder")


def _export_metrics(config: TaskConfig, resources: MetricResources) -> tuple[list[dict], list[str]]:
    """The task's metrics lm-eval can compute from the export, built (options checked) and resolved."""
    metrics, skipped = [], []
    for mc in config.metrics:
        name = METRICS.canonical(mc.name)
        if name not in EXPORTABLE_METRICS:
            skipped.append(name)
            continue
        metric = build_metric(mc.name, mc.options, resources)
        if name == "bleu":
            options = {"max_n": metric.max_n, "tokenize": metric.tokenize, "lowercase": metric.lowercase}
        elif name == "category_accuracy":
            options = {"atom": metric.atom}
        else:
            options = {}
        metrics.append({"name": name, "options": options})
    if not metrics:
        raise UserError(f"task {config.task}: none of its metrics ({', '.join(skipped)}) can be exported; the "
                        f"export computes {', '.join(EXPORTABLE_METRICS)}")
    return metrics, skipped


def _write_documents(path: Path, p: PreparedTask, seed: int, summary: ExportedTask) -> None:
    class_fields = sorted({f for m in summary.metrics if m["name"] == "category_accuracy"
                           for f in TARGET_FIELDS[m["options"]["atom"]]})
    with path.open("w", encoding="utf-8") as f:
        for doc, prompt, shot_ids in zip(p.docs, p.prompts[seed], p.shot_ids[seed]):
            row = {"task": p.config.task, "doc_id": doc.id, "prompt": prompt.text,
                   "target": str(doc[p.config.target_field]), "shot_ids": shot_ids}
            for name in class_fields:
                if doc.get(name) is None:
                    raise UserError(f"task {p.config.task}: document {doc.id} has no '{name}', which category "
                                    "accuracy needs")
                row[name] = int(doc[name])
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")


def task_yaml(config: TaskConfig, summary: ExportedTask) -> str:
    """The lm-eval task file; strings are written as JSON, which YAML reads as they are."""
    g = config.generation
    generation = {"until": list(g.stop), "max_gen_toks": g.max_new_tokens, "do_sample": g.do_sample}
    if g.do_sample:
        generation.update(temperature=g.temperature, top_p=g.top_p, top_k=g.top_k)
    for name, neutral in (("num_beams", 1), ("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0)):
        if getattr(g, name) != neutral:
            generation[name] = getattr(g, name)
    lines = [f"# lm-evaluation-harness task written by mmcomp-eval {__version__} (`mmcomp-eval export lm-eval`)",
             f"# from {config.task}: {' '.join(config.description.split())}",
             "# The prompts, few-shot examples included, are in the documents file; see README.md here.",
             f"task: {json.dumps(config.task)}",
             "custom_dataset: !function utils.load_documents",
             "dataset_kwargs:",
             f"  documents: {json.dumps(config.task + '.jsonl')}",
             "test_split: test",
             "output_type: generate_until",
             "doc_to_text: prompt",
             "doc_to_target: target",
             'description: ""',
             "num_fewshot: 0",
             "generation_kwargs:"]
    lines += [f"  {k}: {json.dumps(v)}" for k, v in generation.items()]
    lines.append("process_results: !function utils.process_results")
    lines.append("metric_list:")
    for m in summary.metrics:
        aggregation = "!function utils.corpus_bleu" if m["name"] == "bleu" else "mean"
        lines += [f"  - metric: {m['name']}", f"    aggregation: {aggregation}", "    higher_is_better: true"]
    lines += ["metadata:", "  version: 1.0", f"  mmcomp_eval: {json.dumps(__version__)}"]
    return "\n".join(lines) + "\n"


def _manifest(prepared: list[PreparedTask], summaries: list[ExportedTask], opts: RunOptions, seed: int) -> dict:
    tasks = {}
    for p, s in zip(prepared, summaries):
        tasks[p.config.task] = {
            **asdict(s),
            "split": p.split,
            "documents_sha256": sha256_json([[d.id, dict(d.fields)] for d in p.docs]),
            "prompts_sha256": sha256_json([[x.text, x.images] for x in p.prompts[seed]]),
            "fewshot_exclusion": p.shot_exclusion.as_dict(),
            "generation": {k: v for k, v in asdict(p.config.generation).items() if k != "seed"},
        }
    return {"mmcomp_eval": __version__, "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
            "seed": seed, "shots": opts.shots, "limit": opts.limit, "sampler": opts.sampler,
            "system_instruction": opts.system_instruction, "tasks": tasks, "requires": REQUIREMENTS,
            "utils_py_from": list(STANDALONE_MODULES)}


def readme(summaries: list[ExportedTask], out: Path, needs_map: bool) -> str:
    names = ",".join(s.name for s in summaries)
    rows = "\n".join(f"| {s.name} | {s.n_documents} | {s.shots} | {', '.join(m['name'] for m in s.metrics)} | "
                     f"{', '.join(s.not_exported) or '-'} |" for s in summaries)
    files = ["`<task>.yaml`: the lm-eval task", "`<task>.jsonl`: documents, prompts rendered with their "
             "few-shot examples", "`utils.py`: the hooks (documents, answers, metrics); self-contained",
             f"`{MANIFEST_FILE}`: what was exported, the metric options the hooks read"]
    if needs_map:
        files.append(f"`{CATEGORY_MAP_FILE}`: category accuracy's tables (EK-100 annotations -> classes)")
    return f"""# mmcomp-eval tasks for lm-evaluation-harness

Written by mmcomp-eval {__version__}. Run them with lm-evaluation-harness 0.4:

```bash
lm_eval --model hf --model_args pretrained=MODEL --include_path {shlex.quote(str(out))} --tasks {names} --output_path OUT --log_samples
```

| task | documents | shots in each prompt | metrics (0-100) | not exported |
|---|---|---|---|---|
{rows}

The prompts already hold their few-shot examples, chosen by mmcomp-eval (lm-eval has no
similarity sampler): leave `--num_fewshot` out. Scores are mmcomp-eval's: the answer is the
first line of the continuation, stripped; exact match and category accuracy after
mmcomp-eval's normalisation; BLEU pooled over the documents (`utils.corpus_bleu`). Greedy
decoding gives mmcomp-eval's answers; lm-eval's `--apply_chat_template` would wrap each whole
prompt into one user turn, which mmcomp-eval's `--apply-chat-template` does not do.

Files: {'; '.join(files)}.

Needs, besides lm-eval and a model backend: {'; '.join(f'{k} ({v})' for k, v in REQUIREMENTS.items())}.
mmcomp-eval itself is not needed.
"""
