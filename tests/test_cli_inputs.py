"""Bad input files through the command line: exit code 2 and one line naming the file, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import write_classes
from user_task import USER_TASK, USER_TEMPLATE, make_user_tasks, run_cli


#: transformers' "Loading weights" bar on stderr is not an error line
PROGRESS_BAR = re.compile(r"\| *\d+/\d+ \[")


@pytest.fixture
def user_tasks(tmp_path):
    return make_user_tasks(tmp_path)


def one_line_error(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if not PROGRESS_BAR.search(line)]
    assert len(lines) == 1 and lines[0].startswith("mmcomp-eval: error: "), err
    return lines[0]


def validate(capsys, user_tasks) -> str:
    return one_line_error(*run_cli(capsys, "validate", str(user_tasks / "echo_task.yaml"))[::2])


def test_non_utf8_byte_in_jsonl_data(user_tasks, capsys):
    docs = user_tasks / "docs.jsonl"
    docs.write_bytes(docs.read_bytes() + b'{"id": "x", "word": "caf\xe9", "answer": "x"}\n')
    line = validate(capsys, user_tasks)
    assert f"{docs}:7: byte 0xe9 at offset" in line and "is not UTF-8" in line


def test_json_error_in_jsonl_says_where(user_tasks, capsys):
    docs = user_tasks / "docs.jsonl"
    docs.write_text('{"id": "a", "word": "x", "answer": "x"}\n{"id": "b", "word": "tab\there", "answer": "y"}\n')
    line = validate(capsys, user_tasks)
    assert f"{docs}:2:25: not valid JSON (Invalid control character at: line 2 column 25)" in line


def test_non_utf8_byte_in_task_yaml(user_tasks, capsys):
    task = user_tasks / "echo_task.yaml"
    task.write_bytes(USER_TASK.replace("Repeat the word.", "R\xe9p\xe9te le mot.").encode("latin-1"))
    line_no = USER_TASK[:USER_TASK.index("Repeat")].count("\n") + 1
    offset = USER_TASK.index("Repeat") + 1
    assert f"{task}:{line_no}: byte 0xe9 at offset {offset} is not UTF-8" in validate(capsys, user_tasks)
    rc, _, err = run_cli(capsys, "ls", "tasks", "--include-path", str(user_tasks))
    assert f"{task}:{line_no}: byte 0xe9" in one_line_error(rc, err)


def test_files_given_as_a_string(user_tasks, capsys):
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace("files: {test: docs.jsonl, train: docs.jsonl}",
                                                                 "files: docs.jsonl"))
    line = validate(capsys, user_tasks)
    assert "echo_task.yaml: dataset.options.files is 'docs.jsonl'; it must map each split to its file" in line


BROKEN_TEMPLATES = {
    "runtime": ({"echo.jinja": USER_TEMPLATE.replace("{{ input(doc) }}", "{{ input(doc) }}\n{{ 1 / 0 }}")},
                "echo.jinja:6: while rendering document w0, ZeroDivisionError: division by zero"),
    "include": ({"echo.jinja": "{% include 'inner.jinja' %}\n" + USER_TEMPLATE, "inner.jinja": "a\n{% for %}"},
                "inner.jinja:2: template syntax error"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_TEMPLATES))
def test_template_errors_in_validate(user_tasks, capsys, case):
    files, fragment = BROKEN_TEMPLATES[case]
    for name, text in files.items():
        (user_tasks / name).write_text(text)
    assert f"{user_tasks / fragment}" in validate(capsys, user_tasks)


@pytest.mark.parametrize("case", sorted(BROKEN_TEMPLATES))
def test_template_errors_in_a_run(user_tasks, tiny_llama_dir, capsys, case):
    files, fragment = BROKEN_TEMPLATES[case]
    for name, text in files.items():
        (user_tasks / name).write_text(text)
    rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}", "--tasks",
                         "echo_task", "--include-path", str(user_tasks), "--no-progress", "--no-cache")
    assert f"{user_tasks / fragment}" in one_line_error(rc, err)


def test_template_error_in_a_separate_process_has_no_traceback(user_tasks):
    (user_tasks / "echo.jinja").write_text("{{ doc.word | int }}{{ 1 / 0 }}")
    proc = subprocess.run([sys.executable, "-m", "mmcomp_eval", "validate", str(user_tasks / "echo_task.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{user_tasks / 'echo.jinja'}:1: while rendering document w0, ZeroDivisionError" in proc.stderr


CAPTION_TASK = """
task: captions
dataset: {name: msrvtt, options: {data_dir: capdata}}
id_field: id
target_field: caption
prompt: {template: cap.jinja}
fewshot: {sampler: none, k: 0}
metrics: [exact_match]
"""


def test_non_utf8_byte_in_a_caption_csv(tmp_path, capsys):
    (tmp_path / "capdata").mkdir()
    csv_file = tmp_path / "capdata" / "MSRVTT_JSFUSION_test.csv"
    csv_file.write_bytes(b"key,vid_key,video_id,sentence\nk0,v0,video0,a man cooks\nk1,v1,video1,caf\xe9 scene\n")
    (tmp_path / "cap.jinja").write_text("{{ doc.caption }}")
    (tmp_path / "captions.yaml").write_text(CAPTION_TASK)
    rc, _, err = run_cli(capsys, "validate", str(tmp_path / "captions.yaml"))
    assert f"{csv_file}:3: byte 0xe9 at offset" in one_line_error(rc, err)


@pytest.mark.parametrize("damage, fragment", [
    (lambda b: b.replace(b"wash knife", b"wash kn\xeffe", 1), "EPIC_100_train.csv:3: byte 0xef at offset"),
    (lambda b: b.rstrip(b"\n").rsplit(b",", 2)[0], "EPIC_100_train.csv:7: 13 fields but the header has 15"),
])
def test_damaged_ek100_csv_in_data_build(tiny_ek100, capsys, damage, fragment):
    f = tiny_ek100 / "EPIC_100_train.csv"
    f.write_bytes(damage(f.read_bytes()))
    rc, _, err = run_cli(capsys, "data", "build", "compact", "--ek100-dir", str(tiny_ek100), "--target-size", "3")
    assert f"{tiny_ek100}/{fragment}" in one_line_error(rc, err)


def test_missing_data_dir_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MMCOMP_DATA_DIR", str(tmp_path / "no-such-folder"))
    rc, _, err = run_cli(capsys, "data", "build", "compact", "--offline")
    assert f"MMCOMP_DATA_DIR={tmp_path / 'no-such-folder'}: no such folder" in one_line_error(rc, err)
    (tmp_path / "ek").mkdir()
    write_classes(tmp_path / "ek")
    rc, _, err = run_cli(capsys, "data", "build", "compact", "--offline", "--ek100-dir", str(tmp_path / "ek"))
    assert "no EPIC_100_train.csv" in one_line_error(rc, err)  # an explicit folder does not consult the variable
