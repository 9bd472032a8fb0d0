"""``mmcomp_eval.evaluate``: the Python entry point, and every input checked before the model is built.

The adapters registered here raise in ``__init__``: a check that passes
before the model is constructed fails with its own one-line error instead of
"the model was built".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import mmcomp_eval
from mmcomp_eval.api.model import Model, ModelCapabilities
from mmcomp_eval.config.task_config import load_task_file
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.evaluate import evaluate
from mmcomp_eval.media import synthetic as S
from mmcomp_eval.models import MODELS

from user_task import USER_TASK, make_user_tasks, run_cli


class ModelWasBuilt(AssertionError):
    pass


class NeverBuilt(Model):
    """A text model whose construction is the failure: checks must all come before it."""

    name = "never-built"
    capabilities = ModelCapabilities(generate=True)

    def __init__(self, size: int = 1):
        raise ModelWasBuilt("the model was built before the inputs were checked")

    def generate(self, requests, progress=None):  # pragma: no cover - never built
        raise AssertionError


class NeverBuiltVision(NeverBuilt):
    """Takes images; how many depends on its arguments, known before it is built through ``capabilities_for``."""

    name = "never-built-vision"

    def __init__(self, max_images: int | None = None):
        raise ModelWasBuilt("the model was built before the inputs were checked")

    @classmethod
    def capabilities_for(cls, args):
        return ModelCapabilities(generate=True, images=True, reads_images=True, max_images=args.get("max_images"))


class Echo(Model):
    """Answers the query word: right on every document of the echo task."""

    name = "echo"

    def generate(self, requests, progress=None):
        return [" " + r.prompt.rsplit("word: ", 1)[1].split(" =>")[0] for r in requests]


class Overpromising(Echo):
    """Declares images before it is built, has none after: a broken adapter the run must refuse."""

    name = "overpromising"

    @classmethod
    def capabilities_for(cls, args):
        return ModelCapabilities(generate=True, images=True, reads_images=False)


@pytest.fixture
def adapters(monkeypatch):
    for cls in (NeverBuilt, NeverBuiltVision, Echo, Overpromising):
        monkeypatch.setitem(MODELS._items, cls.name, cls)


@pytest.fixture
def user_tasks(tmp_path):
    return make_user_tasks(tmp_path)


def _fails(match: str, tasks: Path, model: str = "never-built", **kwargs):
    with pytest.raises(UserError, match=match):
        evaluate(model, "echo_task", include_paths=[tasks], no_cache=True, progress=False, **kwargs)


def test_the_package_exports_evaluate():
    assert mmcomp_eval.evaluate is evaluate


@pytest.mark.parametrize("kwargs, match", [
    ({"split": "validaton"}, "dataset.options.files has no 'validaton' file"),
    ({"sampler": "simlar"}, r"unknown few-shot sampler 'simlar' \(did you mean 'similar'\?\)"),
    ({"gen_kwargs": "temprature=0.5"}, r"--gen-kwargs: unknown key 'temprature' \(did you mean 'temperature'\?\)"),
    ({"gen_kwargs": {"temperature": 0.5}}, "task echo_task: generation temperature=0.5 only applies when sampling"),
    ({"limit": 0}, "--limit 0: expected a positive number"),
    ({"seeds": []}, "--seeds must be at least 1"),
    ({"model_args": "size=big"}, "model argument size='big' for 'never-built' must be int"),
])
def test_bad_run_options_fail_before_the_model_is_built(adapters, user_tasks, kwargs, match):
    _fails(match, user_tasks, **kwargs)


def test_bad_metric_option_fails_before_the_model_is_built(adapters, user_tasks):
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace(
        "metrics: [exact_match, bleu]", "metrics: [exact_match, {name: bleu, options: {max_m: 4}}]"))
    _fails(r"metric 'bleu' has no option 'max_m' \(did you mean 'max_n'\?\)", user_tasks)


def test_missing_scoring_model_fails_before_the_model_is_built(adapters, user_tasks, tmp_path):
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace(
        "metrics: [exact_match, bleu]", "metrics: [{name: bertscore, options: {model: no-such-org/no-such-model}}]"))
    _fails("metric 'bertscore': model 'no-such-org/no-such-model' is not a local folder and not in the Hugging "
           "Face cache, and this run is offline", user_tasks, offline=True)


def test_missing_metric_resource_fails_before_the_model_is_built(adapters, user_tasks, tmp_path):
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace("metrics: [exact_match, bleu]",
                                                                 "metrics: [category_accuracy]"))
    (tmp_path / "empty").mkdir()
    _fails(f"metric 'category_accuracy' needs ek100_category_map: {tmp_path / 'empty'}: no EPIC_100_train.csv",
           user_tasks, ek100_dir=tmp_path / "empty")


def test_missing_documents_fail_before_the_model_is_built(adapters, user_tasks):
    (user_tasks / "docs.jsonl").unlink()
    _fails(f"{user_tasks / 'docs.jsonl'}: file not found", user_tasks)


IMAGE_TASK = """
task: echo_task
dataset: {{name: jsonl, options: {{files: {{test: docs.jsonl, train: docs.jsonl}}}}}}
target_field: trg_narration
prompt: {{template: compact_idefics.jinja}}
fewshot: {{sampler: first, k: 2}}
metrics: [exact_match]
media: {{frames_root: {root}}}
"""


@pytest.fixture
def image_tasks(tmp_path):
    d = tmp_path / "image_tasks"
    d.mkdir()
    S.write_jsonl(d / "docs.jsonl", S.compact_docs(4, ["P01_01"]))
    (d / "echo_task.yaml").write_text(IMAGE_TASK.format(root=tmp_path / "no_frames"))
    return d


def test_missing_media_folder_fails_before_the_model_is_built(adapters, image_tasks, tmp_path):
    _fails(f"task echo_task: media frames_root {tmp_path / 'no_frames'} is not a folder", image_tasks,
           model="never-built-vision")


def test_model_capabilities_are_checked_before_the_model_is_built(adapters, image_tasks):
    _fails("puts 9 images in its prompts but model 'never-built' is text-only", image_tasks)
    # capabilities_for reads the arguments: max_images=3 is known before any load
    _fails("prompts hold up to 9 images but model 'never-built-vision' takes at most 3; use fewer shots",
           image_tasks, model="never-built-vision", model_args={"max_images": 3})


def test_rank_choices_needs_a_model_that_scores_loglikelihoods(adapters, user_tasks, tiny_ek100):
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace(
        "metrics:", "output_type: rank_choices\nchoices: ek100_verb_classes\nmetrics:"))
    _fails("task echo_task has output_type 'rank_choices' but model 'never-built' cannot score log-likelihoods",
           user_tasks, ek100_dir=tiny_ek100)


def test_an_adapter_that_breaks_its_promise_is_refused(adapters, image_tasks):
    with pytest.raises(UserError, match=r"model 'overpromising': adapter Overpromising declared .* before loading "
                                        r"but has .*; its capabilities_for must say"):
        evaluate("overpromising", "echo_task", include_paths=[image_tasks], no_cache=True, progress=False,
                 model_args={})


def test_bad_input_through_the_cli_is_one_line_and_no_model(adapters, user_tasks, capsys):
    rc, _, err = run_cli(capsys, "--model", "never-built", "--tasks", "echo_task", "--include-path", str(user_tasks),
                         "--split", "validaton", "--no-progress", "--no-cache")
    assert rc == 2 and err.strip().splitlines() == [
        f"mmcomp-eval: error: {user_tasks / 'echo_task.yaml'}: dataset.options.files has no 'validaton' file; "
        "add one or use --split"]


def test_evaluate_returns_the_record_it_writes(user_tasks, tmp_path):
    out = tmp_path / "out"
    results = evaluate(Echo(), ["echo_task"], include_paths=[user_tasks], seeds=[3, 4], limit=4,
                       output_path=out, cache_dir=tmp_path / "store", progress=False)
    written = json.loads((out / "results.json").read_text())
    assert results["tasks"] == written["tasks"] and results["model"] == written["model"] == {
        "name": "echo", "args": {}, "fingerprint": {"name": "echo"}}
    task = results["tasks"]["echo_task"]
    assert task["n_documents"] == 4 and task["seeds"] == [3, 4]
    assert task["metrics"]["exact_match"]["mean"] == 100.0
    # greedy decoding with 'first' shots: seed 4 asks what seed 3 asked
    assert (results["cache"]["hits"], results["cache"]["misses"]) == (4, 4)
    assert results["processes"] == {"count": 1, "launcher": None}
    assert len((out / "samples.jsonl").read_text().splitlines()) == 8


def test_evaluate_takes_task_configs(user_tasks, tmp_path):
    task = load_task_file(user_tasks / "echo_task.yaml")
    renamed = dataclasses.replace(task, task="echo_renamed")
    results = evaluate(Echo(), [renamed], no_cache=True, progress=False, limit=2)
    assert list(results["tasks"]) == ["echo_renamed"] and results["cache"] == {"enabled": False}


def test_evaluate_refuses_what_other_processes_cannot_rebuild(user_tasks, tmp_path):
    with pytest.raises(UserError, match="cannot share a Model object; pass the model's name"):
        evaluate(Echo(), "echo_task", include_paths=[user_tasks], num_processes=2, cache_dir=tmp_path / "s",
                 progress=False)
    with pytest.raises(UserError, match="model_args, batch_size and device configure a model that evaluate"):
        evaluate(Echo(), "echo_task", include_paths=[user_tasks], model_args="x=1", no_cache=True)
    with pytest.raises(UserError, match="--num-processes 0: expected at least 1"):
        evaluate("echo", "echo_task", include_paths=[user_tasks], num_processes=0)
    with pytest.raises(UserError, match="data-parallel runs pass answers through the response store"):
        evaluate("echo", "echo_task", include_paths=[user_tasks], num_processes=2, no_cache=True)
