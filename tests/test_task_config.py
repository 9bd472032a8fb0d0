"""Task YAML: validation, include, groups, user folders, templates."""

from __future__ import annotations

import textwrap

import pytest

from mmcomp_eval.errors import UserError
from mmcomp_eval.config.task_config import TaskConfig
from mmcomp_eval.tasks.checks import load_checked
from mmcomp_eval.tasks.index import TaskIndex

BASE = """
task: my_task
dataset: {name: jsonl, options: {files: {test: docs.jsonl, train: docs.jsonl}}}
target_field: answer
prompt: {template: my.jinja, instruction: Answer}
metrics: [exact_match]
"""


def write(d, name, text):
    p = d / name
    p.write_text(textwrap.dedent(text))
    return p


def test_builtin_tasks_load():
    index = TaskIndex.build()
    assert {"compact_nup", "compact_verb", "compact_noun", "compact_nup_random"} <= set(index.tasks)
    nup = index.tasks["compact_nup"]
    assert nup.fewshot.k == 5 and nup.fewshot.sampler == "similar"
    assert [m.name for m in nup.metrics] == ["bleu", "exact_match", "category_accuracy", "bertscore"]
    rnd = index.tasks["compact_verb_random"]
    assert rnd.dataset.options == {"split_kind": "random"}
    assert rnd.target_field == "trg_verb"  # inherited through two includes
    assert [t.task for t in index.resolve(["compact"])] == ["compact_nup", "compact_verb", "compact_noun"]


def test_unknown_key_suggests(tmp_path):
    p = write(tmp_path, "t.yaml", BASE + "promt: {}\n")
    with pytest.raises(UserError, match=r"unknown key 'promt' \(did you mean 'prompt'\?\)"):
        load_checked(p)
    p = write(tmp_path, "t.yaml", BASE.replace("instruction:", "instructions:"))
    with pytest.raises(UserError, match=r"unknown key 'prompt.instructions'"):
        load_checked(p)


def test_type_and_value_errors(tmp_path):
    p = write(tmp_path, "t.yaml", BASE + "fewshot: {k: five}\n")
    with pytest.raises(UserError, match="'fewshot.k' must be an integer"):
        load_checked(p)
    p = write(tmp_path, "t.yaml", BASE + "output_type: generat\n")
    with pytest.raises(UserError, match="did you mean 'generate'"):
        load_checked(p)
    p = write(tmp_path, "t.yaml", BASE.replace("target_field: answer\n", ""))
    with pytest.raises(UserError, match="missing required key 'target_field'"):
        load_checked(p)


def test_malformed_yaml_names_line(tmp_path):
    p = write(tmp_path, "t.yaml", "task: [unclosed\n")
    with pytest.raises(UserError, match=r"t.yaml:\d+:\d+: malformed YAML"):
        load_checked(p)


def test_include_local_wins_and_cycles(tmp_path):
    write(tmp_path, "_base.yaml", BASE)
    p = write(tmp_path, "child.yaml", "include: _base.yaml\ntask: child\nprompt: {instruction: Other}\n")
    cfg = load_checked(p)
    assert isinstance(cfg, TaskConfig)
    assert cfg.task == "child" and cfg.prompt.instruction == "Other" and cfg.prompt.template == "my.jinja"
    write(tmp_path, "a.yaml", "include: b.yaml\n")
    write(tmp_path, "b.yaml", "include: a.yaml\n")
    with pytest.raises(UserError, match="include cycle"):
        load_checked(tmp_path / "a.yaml")


def test_unknown_task_suggests():
    with pytest.raises(UserError, match="did you mean 'compact_nup'"):
        TaskIndex.build().resolve(["compact_nupp"])


def test_user_folder_adds_tasks(tmp_path):
    write(tmp_path, "mine.yaml", BASE)
    index = TaskIndex.build((tmp_path,))
    assert "my_task" in index.tasks and "compact_nup" in index.tasks
    with pytest.raises(UserError, match="not a folder"):
        TaskIndex.build((tmp_path / "nope",))
