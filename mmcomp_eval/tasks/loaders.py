"""Dataset loaders: a task's ``dataset`` section -> documents per split.

``compact`` builds (or reuses from the cache) the CompAct splits from the
EK-100 annotations; ``jsonl`` reads a user's own files, one JSON object per
line, named per split relative to the task file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from mmcomp_eval.api.document import Document
from mmcomp_eval.data.captions import register_task_loaders
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.registry import Registry
from mmcomp_eval.config.task_config import TaskConfig
from mmcomp_eval.textfiles import json_error, read_text


@dataclass(frozen=True)
class DataContext:
    """Run-level settings loaders may need."""

    ek100_dir: Path | None = None
    offline: bool = False


Loader = Callable[[TaskConfig, str, DataContext], list[dict]]
LOADERS: Registry[Loader] = Registry("dataset")


def load_documents(task: TaskConfig, split: str, ctx: DataContext) -> list[Document]:
    rows = LOADERS.get(task.dataset.name)(task, split, ctx)
    docs = []
    seen = set()
    for i, row in enumerate(rows):
        if task.id_field not in row:
            raise UserError(f"task {task.task}: document {i} of split '{split}' has no id field '{task.id_field}'")
        doc_id = str(row[task.id_field])
        if doc_id in seen:
            raise UserError(f"task {task.task}: split '{split}' has two documents with id '{doc_id}'")
        seen.add(doc_id)
        if task.target_field not in row:
            raise UserError(f"task {task.task}: document {doc_id} has no target field '{task.target_field}'"
                            f"{did_you_mean(task.target_field, row)}")
        docs.append(Document(doc_id, row))
    if task.perturbation is not None and (split == task.eval_split or split != task.fewshot_split):
        from mmcomp_eval.perturb.documents import perturb_documents

        docs = perturb_documents(task, docs)
    return docs


def _options(task: TaskConfig, allowed: dict) -> dict:
    opts = dict(task.dataset.options)
    for key in opts:
        if key not in allowed:
            raise UserError(f"{task.source}: dataset '{task.dataset.name}' has no option '{key}'"
                            f"{did_you_mean(key, allowed)}")
    return {**allowed, **opts}


@LOADERS.register("compact")
def load_compact(task: TaskConfig, split: str, ctx: DataContext) -> list[dict]:
    from mmcomp_eval.data.compact_build import SPLIT_KINDS, SPLITS, BuildParams, build_compact, load_split

    defaults = {"split_kind": "compositional", **{f.name: getattr(BuildParams(), f.name) for f in fields(BuildParams)}}
    opts = _options(task, defaults)
    kind = opts.pop("split_kind")
    if kind not in SPLIT_KINDS:
        raise UserError(f"{task.source}: dataset option split_kind {kind!r} is not one of {', '.join(SPLIT_KINDS)}")
    if split not in SPLITS:
        raise UserError(f"task {task.task}: split '{split}' is not one of {', '.join(SPLITS)}{did_you_mean(split, SPLITS)}")
    for key, value in opts.items():
        default = getattr(BuildParams(), key)
        expected = (int, float) if isinstance(default, float) or default is None else type(default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, expected)):
            raise UserError(f"{task.source}: dataset option {key}={value!r} must be a "
                            f"{type(default).__name__ if default is not None else 'number'}")
    result = build_compact(ctx.ek100_dir, BuildParams(**opts), offline=ctx.offline)
    return load_split(result.directory, kind, split)


@LOADERS.register("jsonl")
def load_jsonl(task: TaskConfig, split: str, ctx: DataContext) -> list[dict]:
    opts = _options(task, {"files": {}})
    files = opts["files"]
    if not isinstance(files, dict):
        raise UserError(f"{task.source}: dataset.options.files is {files!r}; it must map each split to its file, "
                        "e.g. files: {test: test.jsonl, train: train.jsonl}")
    if split not in files:
        raise UserError(f"{task.source}: dataset.options.files has no '{split}' file; add one or use --split")
    if not isinstance(files[split], str) or not files[split]:
        raise UserError(f"{task.source}: dataset.options.files.{split} is {files[split]!r}; expected a file name")
    path = Path(files[split])
    if not path.is_absolute() and task.source:
        path = Path(task.source).parent / path
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found (dataset of task {task.task}, split {split})") from None
    rows = []
    for line_no, line in enumerate(text.split("\n"), start=1):  # not splitlines(): JSON strings may hold U+2028
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise json_error(path, exc, line_no) from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{line_no}: expected a JSON object per line, got {type(row).__name__}")
            rows.append(row)
    return rows


register_task_loaders(LOADERS)  # msrvtt, msvd, didemo, vatex, charades, lsmdc (mmcomp_eval.data.captions)
