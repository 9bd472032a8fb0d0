"""The task-level ``perturbation:`` option: perturb one text field of each document.

Any task (retrieval or generation) can be run on perturbed inputs by adding
``perturbation: {kind: actrem, field: caption}`` to its YAML. Documents are
seeded by their id, so the same task file gives the same perturbed documents
every run. ``objrep`` / ``actrep`` words come from a vocabulary fixed by the
task, never by ``--limit`` (applied after perturbing) or the split alone:

* a caption dataset (``dataset: {name: msrvtt}`` etc.): every caption of every
  split in its data folder, as ``mmcomp-eval perturb`` uses;
* any other loader (a user's ``jsonl`` files): the field's text over the whole
  evaluation split file, i.e. every document that is perturbed.

The original text stays available to templates and metrics as
``<field>_original``.
"""

from __future__ import annotations

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.perturb.suite import perturb_captions
from mmcomp_eval.perturb.vocab_source import VocabularySource, dataset_vocabulary


def perturb_documents(task, docs: list[Document]) -> list[Document]:
    cfg = task.perturbation
    name, original = cfg.field, f"{cfg.field}_original"
    for d in docs:
        if name not in d.fields:
            raise UserError(f"task {task.task}: perturbation.field '{name}' is not a field of document {d.id}"
                            f"{did_you_mean(name, d.fields)}")
        if not isinstance(d.fields[name], str):
            raise UserError(f"task {task.task}: perturbation.field '{name}' of document {d.id} is "
                            f"{type(d.fields[name]).__name__}, not text; name a text field")
        if original in d.fields:
            raise UserError(f"task {task.task}: document {d.id} already has a field '{original}', where the "
                            f"unperturbed text would go; rename that field")
    if not docs:
        return docs
    run = perturb_captions([d.fields[name] for d in docs], cfg.kind, seed=cfg.seed, keys=[d.id for d in docs],
                           spacy_model=cfg.spacy_model, pos_roles=cfg.pos_roles, vocabulary=task_vocabulary(task))
    return [Document(d.id, {**d.fields, name: text, original: d.fields[name]})
            for d, text in zip(docs, run[cfg.kind].captions)]


def task_vocabulary(task) -> VocabularySource | None:
    """The caption dataset's every caption; None (the perturbed documents themselves) for other loaders."""
    from mmcomp_eval.data.caption_texts import ALL_TEXTS
    from mmcomp_eval.data.captions import task_data_dir

    if task.dataset.name in ALL_TEXTS:
        return dataset_vocabulary(task.dataset.name, task_data_dir(task))
    return None
