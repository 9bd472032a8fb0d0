"""Offline means no network at all; templates, YAML and task folders cannot run code."""

from __future__ import annotations

import json
import re
import socket

import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.cli import main
from mmcomp_eval.errors import UserError
from mmcomp_eval.tasks.prompting import PromptTemplate

from user_task import USER_TASK, USER_TEMPLATE


@pytest.fixture
def no_network(monkeypatch):
    """Every way out (DNS, TCP/UDP connect) is recorded and refused."""
    attempts: list[str] = []

    def refuse(what):
        def blocked(*args, **kwargs):
            attempts.append(f"{what}{args[1:] if what.startswith('socket.') else args}")
            raise OSError(f"network blocked by the test: {what}")
        return blocked

    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("socket.connect_ex"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    return attempts


@pytest.fixture
def user_tasks(tmp_path):
    d = tmp_path / "my_tasks"
    d.mkdir()
    # BERTScore is the metric that would reach for the Hub if anything did
    (d / "echo_task.yaml").write_text(USER_TASK.replace("[exact_match, bleu]", "[exact_match, bleu, bertscore]"))
    (d / "echo.jinja").write_text(USER_TEMPLATE)
    (d / "docs.jsonl").write_text("".join(json.dumps({"id": f"w{i}", "word": w, "answer": w}) + "\n"
                                          for i, w in enumerate(["knife", "plate", "onion", "pan"])))
    return d


def test_offline_run_touches_no_network(user_tasks, tiny_llama_dir, tmp_path, capsys, monkeypatch, no_network):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MMCOMP_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)  # _go_offline sets them; monkeypatch restores them afterwards
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", hub.HF_HUB_OFFLINE)
    common = ["--tasks", "echo_task", "--include-path", str(user_tasks), "--no-progress",
              "--cache-dir", str(tmp_path / "store")]
    rc = main(["--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}", *common, "--offline",
               "--output-path", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert no_network == []
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["config"]["data"]["offline"] is True and results["model"]["args"]["offline"] is True
    assert results["tasks"]["echo_task"]["metrics"]["bertscore"]["mean"] > 0

    # a Hub model that is not cached fails in one line instead of downloading
    rc = main(["--model", "hf", "--model-args", "pretrained=nobody/not-cached-model", *common, "--offline"])
    _, err = capsys.readouterr()
    # the one error line, after the run's INFO stage lines (tasks prepared, loading the model)
    problems = [line for line in err.strip().splitlines() if not re.match(r"\d\d:\d\d:\d\d INFO ", line)]
    assert rc == 2 and "nobody/not-cached-model" in err and len(problems) == 1, err
    assert problems[0].startswith("mmcomp-eval: error: ")
    assert no_network == []


def test_hf_hub_offline_variable_means_offline(user_tasks, tiny_llama_dir, tmp_path, capsys, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc = main(["--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}", "--tasks", "echo_task",
               "--include-path", str(user_tasks), "--no-progress", "--no-cache", "--limit", "2",
               "--output-path", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert rc == 0, err and no_network == []
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["config"]["data"]["offline"] is True and results["model"]["args"]["offline"] is True


QUERY = Document("q", {"id": "q", "word": "knife", "answer": "knife"})
ESCAPES = [
    "{{ doc.__class__ }}",
    "{{ shots.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ image.__globals__ }}",
    "{{ image.__closure__[0].cell_contents }}",
    "{{ image.__code__.co_consts }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__.os }}",
    "{{ namespace.__init__.__globals__.os }}",
    "{{ self.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ '{0.__class__.__mro__}'.format(doc) }}",
    "{{ doc|attr('__class__') }}",
    "{{ doc.get.__self__ }}",
    "{{ range.__self__ }}",
    "{% set x = doc.update({'word': 'pwned'}) %}{{ x }}",
    "{% set x = shots.append(1) %}{{ x }}",
    "{{ config }}{{ request }}{{ os }}{{ __builtins__ }}",
    "{% include '../../../../../../etc/passwd' %}",
    "{% import '/etc/passwd' as p %}",
    "{% extends '/etc/hostname' %}",
    "{{ range(10**9)|list|length }}",
]


@pytest.mark.parametrize("payload", ESCAPES)
def test_templates_cannot_reach_python_internals(tmp_path, payload):
    t = tmp_path / "t.jinja"
    t.write_text(payload)
    with pytest.raises(UserError) as exc:
        PromptTemplate(t).render(QUERY, [], "instruction")
    message = str(exc.value)
    assert "\n" not in message and "root:" not in message and "<class" not in message


def test_yaml_python_tags_are_rejected_in_one_line(tmp_path, capsys):
    marker = tmp_path / "pwned"
    for tag in (f"!!python/object/apply:os.system ['touch {marker}']", "!!python/name:os.system",
                "!!python/object:mmcomp_eval.errors.UserError {}"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"task: {tag}\n")
        rc = main(["validate", str(bad)])
        _, err = capsys.readouterr()
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "python/" in err and "malformed YAML" in err
    assert not marker.exists()


def test_python_files_in_task_folders_never_run(tmp_path, capsys):
    d = tmp_path / "tasks"
    d.mkdir()
    (d / "echo_task.yaml").write_text(USER_TASK)
    (d / "echo.jinja").write_text(USER_TEMPLATE)
    (d / "docs.jsonl").write_text("".join(json.dumps({"id": w, "word": w, "answer": w}) + "\n" for w in "abc"))
    marker = tmp_path / "hook_ran"
    for name in ("__init__.py", "hooks.py", "echo_task.py", "conftest.py"):
        (d / name).write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    assert main(["ls", "tasks", "--include-path", str(d)]) == 0
    assert main(["validate", str(d / "echo_task.yaml")]) == 0
    assert main(["--model", "mrh", "--tasks", "echo_task", "--include-path", str(d), "--no-progress",
                 "--no-cache"]) in (0, 2)  # mrh cannot answer this task; what matters is no hook ran
    capsys.readouterr()
    assert not marker.exists()
