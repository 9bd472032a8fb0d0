"""Output types, choice sources and metric resources come from registries: nothing is known to the evaluator by name."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.api.model import Model, ModelCapabilities
from mmcomp_eval.tasks.checks import load_checked
from mmcomp_eval.data.choice_sources import CHOICE_SOURCES
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.evaluate import evaluate
from mmcomp_eval.metrics import METRIC_RESOURCES, METRICS, MetricResource, MetricResources, build_metric
from mmcomp_eval.tasks.loaders import DataContext
from mmcomp_eval.tasks.outputs import OUTPUT_TYPES
from mmcomp_eval.tasks.outputs.generate import Generate
from mmcomp_eval.tasks.outputs.rank_choices import RankChoices

from user_task import USER_TASK, make_user_tasks

COLOURS = ("red", "green", "blue")


@pytest.fixture
def user_tasks(tmp_path):
    d = make_user_tasks(tmp_path, words=["green", "blue", "red", "blue"])
    return d


@pytest.fixture
def colours(monkeypatch):
    """A choice source of the test's own: candidates need no change to any built-in module."""
    seen = []

    def colour_names(task, ctx):
        seen.append((task.task, ctx))
        return COLOURS

    monkeypatch.setitem(CHOICE_SOURCES._items, "colours", colour_names)
    return seen


class Oracle(Model):
    """Scores the continuation that is the query word highest: ranks every colour right."""

    name = "oracle"
    capabilities = ModelCapabilities(generate=False, loglikelihood=True)

    def generate(self, requests, progress=None):  # pragma: no cover - rank_choices only
        raise AssertionError

    def loglikelihood(self, requests, progress=None):
        word = [r.context.rsplit("word: ", 1)[1].split(" =>")[0] for r in requests]
        return [[0.0 if c.strip() == w else -1.0 - i for i, c in enumerate(r.continuations)]
                for w, r in zip(word, requests)]


def rank_task(folder, source="colours"):
    (folder / "echo_task.yaml").write_text(USER_TASK.replace(
        "metrics:", f"output_type: rank_choices\nchoices: {source}\nmetrics:"))


def test_the_builtin_output_types_are_registered():
    assert list(OUTPUT_TYPES) == ["generate", "rank_choices", "retrieval"]
    assert {"ek100_verb_classes", "ek100_noun_classes"} <= set(CHOICE_SOURCES.names())


def test_rank_choices_over_a_registered_choice_source(colours, user_tasks, tmp_path):
    rank_task(user_tasks)
    results = evaluate(Oracle(), "echo_task", include_paths=[user_tasks], no_cache=True, progress=False,
                       output_path=tmp_path / "out")
    task = results["tasks"]["echo_task"]
    assert task["metrics"]["exact_match"]["mean"] == 100.0
    assert task["choices"] == {"source": "colours", "count": 3} and task["generation"] is None
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == ["green", "blue", "red", "blue"]
    assert rows[0]["raw_output"] == [-1.0, 0.0, -3.0]  # the scores of red, green, blue
    assert [task for task, _ in colours] == ["echo_task"]  # loaded once, when the task was prepared


def test_choice_sources_are_checked_when_the_task_file_is_read(user_tasks):
    rank_task(user_tasks, source="colors")
    with pytest.raises(UserError, match=r"choices 'colors' is not one of ek100_noun_classes, ek100_verb_classes"):
        load_checked(user_tasks / "echo_task.yaml")
    (user_tasks / "echo_task.yaml").write_text(USER_TASK.replace("metrics:", "output_type: rank_choices\nmetrics:"))
    with pytest.raises(UserError, match="output_type 'rank_choices' needs 'choices' "
                                        r"\(ek100_noun_classes, ek100_verb_classes\)"):
        load_checked(user_tasks / "echo_task.yaml")


def test_ek100_choice_sources_read_the_class_tables(tiny_ek100, user_tasks):
    from conftest import NOUN_CLASSES, VERB_CLASSES

    task = load_checked(user_tasks / "echo_task.yaml")
    ctx = DataContext(ek100_dir=tiny_ek100)
    assert CHOICE_SOURCES.get("ek100_verb_classes")(task, ctx) == ("take", "put", "wash", "open", "close", "cut")
    nouns = CHOICE_SOURCES.get("ek100_noun_classes")(task, ctx)
    assert len(nouns) == len(NOUN_CLASSES) and nouns[2] == "chopping board" and len(VERB_CLASSES) == 6


def test_parsing_of_each_output_type(user_tasks, colours):
    task = load_checked(user_tasks / "echo_task.yaml")
    assert Generate(task, DataContext()).parse(["  knife \nmore", "", "\n\nplate\n"]) == ["knife", "", "plate"]
    rank_task(user_tasks)
    ranking = RankChoices(load_checked(user_tasks / "echo_task.yaml"), DataContext())
    # the highest score wins; the earliest choice wins a tie, so results never depend on float noise in sort order
    assert ranking.parse([[-3.0, -1.0, -2.0], [-1.0, -2.0, -1.0]]) == ["green", "red"]


def test_an_output_type_states_what_models_it_needs():
    assert Generate.model_problem(ModelCapabilities(generate=True)) is None
    assert RankChoices.model_problem(ModelCapabilities(generate=True)) == "cannot score log-likelihoods"
    assert RankChoices.model_problem(ModelCapabilities(loglikelihood=True)) is None


# -- metric resources -----------------------------------------------------------------------------------


class Vocabulary(Metric):
    """Right when the prediction is in the run's vocabulary (a resource built from the data settings)."""

    name = "in_vocabulary"
    resources = ("test_vocabulary",)

    def __init__(self, resources: MetricResources, *, scale: float = 100.0):
        self.words = resources.get("test_vocabulary")
        self.scale = scale

    def compute(self, predictions: Sequence[str], references: Sequence[str], docs: Sequence[Document]):
        per = tuple(self.scale if p in self.words else 0.0 for p in predictions)
        return MetricResult(self.name, sum(per) / len(per), per)


@pytest.fixture
def vocabulary_metric(monkeypatch):
    builds = []

    def build(data: DataContext):
        builds.append(data)
        return {"green", "red"}

    monkeypatch.setitem(METRICS._items, Vocabulary.name, Vocabulary)
    monkeypatch.setitem(METRIC_RESOURCES._items, "test_vocabulary", MetricResource(build, "the test's word list"))
    return builds


def test_a_declared_resource_is_built_once_per_run_for_every_metric_that_reads_it(vocabulary_metric, user_tasks,
                                                                                    colours):
    rank_task(user_tasks)
    (user_tasks / "echo_task.yaml").write_text((user_tasks / "echo_task.yaml").read_text().replace(
        "metrics: [exact_match, bleu]", "metrics: [in_vocabulary]"))
    (user_tasks / "echo_twice.yaml").write_text((user_tasks / "echo_task.yaml").read_text().replace(
        "task: echo_task", "task: echo_twice").replace("metrics: [in_vocabulary]",
                                                       "metrics: [{name: in_vocabulary, options: {scale: 1.0}}]"))
    results = evaluate(Oracle(), "echo_task,echo_twice", include_paths=[user_tasks], no_cache=True, progress=False)
    assert results["tasks"]["echo_task"]["metrics"]["in_vocabulary"]["mean"] == 50.0  # green, red of 4 words
    assert results["tasks"]["echo_twice"]["metrics"]["in_vocabulary"]["mean"] == 0.5
    assert len(vocabulary_metric) == 1  # the metrics of both tasks shared one build


def test_a_resource_without_data_settings_names_the_metric_and_what_it_needs(vocabulary_metric):
    with pytest.raises(UserError, match="metric 'in_vocabulary' needs test_vocabulary: test_vocabulary is built "
                                        "from the test's word list"):
        build_metric("in_vocabulary", {}, MetricResources())
    metric = build_metric("in_vocabulary", {}, MetricResources(prebuilt={"test_vocabulary": {"x"}}))
    assert metric.compute(["x", "y"], ["", ""], []).per_sample == (100.0, 0.0) and not vocabulary_metric
