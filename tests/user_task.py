"""The small user task (a jsonl dataset, a template) that CLI-level tests share."""

from __future__ import annotations

import json
from pathlib import Path

from mmcomp_eval.cli import main

USER_TASK = """
task: echo_task
dataset:
  name: jsonl
  options:
    files: {test: docs.jsonl, train: docs.jsonl}
target_field: answer
answer_kind: text
prompt: {template: echo.jinja, instruction: Repeat the word.}
fewshot: {sampler: first, k: 2}
generation: {max_new_tokens: 4, stop: ["\\n"]}
metrics: [exact_match, bleu]
"""
USER_TEMPLATE = """{%- macro input(d) -%}word: {{ d.word }} =>{%- endmacro -%}
{%- macro answer(d) -%}{{ d.answer }}{%- endmacro -%}
{{ instruction }}
{% for s in shots -%}{{ input(s) }} {{ answer(s) }}
{% endfor -%}{{ input(doc) }}"""


WORDS = ["knife", "plate", "onion", "board", "pan", "spoon"]


def make_user_tasks(root: Path, words=WORDS) -> Path:
    """A folder for --include-path with the echo task, its template and one document per word."""
    d = root / "my_tasks"
    d.mkdir()
    (d / "echo_task.yaml").write_text(USER_TASK)
    (d / "echo.jinja").write_text(USER_TEMPLATE)
    (d / "docs.jsonl").write_text("".join(json.dumps({"id": f"w{i}", "word": w, "answer": w}) + "\n"
                                          for i, w in enumerate(words)))
    return d


def run_cli(capsys, *argv):
    """(exit code, stdout, stderr) of one in-process CLI call."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err
