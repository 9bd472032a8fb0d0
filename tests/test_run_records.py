"""What a run writes, checked against its documented promises and direct computations.

* samples.jsonl rows come in task, seed, document order (docs/results.md), with
  documents whose file order is not their id order, two tasks requested in
  non-alphabetical order and two seeds, so no sorting can pass for it;
* each row's prompt, prediction and target belong to its document and seed;
* ``std`` over seeds is the sample standard deviation (ddof=1);
* ``stderr`` equals the bootstrap recomputed here from the rows themselves.
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from mmcomp_eval.evaluation.aggregate import aggregate
from mmcomp_eval.api.model import Model
from mmcomp_eval.evaluation.evaluator import RunOptions, run
from mmcomp_eval.metrics.bleu import Bleu
from mmcomp_eval.evaluation.results import ResultWriter
from mmcomp_eval.tasks.index import TaskIndex

from user_task import USER_TASK, USER_TEMPLATE

# file order != sorted id order, for both tasks
ZETA = [("z5", "knife"), ("z1", "pan"), ("z3", "onion"), ("z0", "cup"), ("z4", "plate"), ("z2", "jar"),
        ("z10", "spoon"), ("z9", "bowl")]
ALPHA = [("a2", "milk"), ("a0", "kettle"), ("a1", "tea"), ("a3", "rice")]
TRAIN = [("t0", "lid"), ("t1", "fork"), ("t2", "egg")]


class SeededEcho(Model):
    """Repeats the query word; seed 0 says 3-letter words twice, seed 1 drops 4-letter words."""

    name = "seeded-echo"

    def generate(self, requests, progress=None):
        out = []
        for r in requests:
            word = r.prompt.split("=>")[-2].split()[-1]
            seed = r.settings.seed
            out.append(f"{word} {word}" if seed == 0 and len(word) == 3 else "" if seed == 1 and len(word) == 4
                       else word)
        return out


def write_task(d, name, docs):
    text = USER_TASK.replace("task: echo_task", f"task: {name}").replace("test: docs.jsonl, train: docs.jsonl",
                                                                         f"test: {name}.jsonl, train: train.jsonl")
    # sampled, so each seed reaches the requests (greedy requests share seed 0 and one stored answer)
    text = text.replace("max_new_tokens: 4,", "max_new_tokens: 4, do_sample: true,")
    assert "do_sample: true" in text
    (d / f"{name}.yaml").write_text(text)
    (d / f"{name}.jsonl").write_text("".join(json.dumps({"id": i, "word": w, "answer": w}) + "\n" for i, w in docs))


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "echo.jinja").write_text(USER_TEMPLATE)
    write_task(tasks, "zeta_words", ZETA)
    write_task(tasks, "alpha_words", ALPHA)
    (tasks / "train.jsonl").write_text("".join(json.dumps({"id": i, "word": w, "answer": w}) + "\n" for i, w in TRAIN))
    index = TaskIndex.build((tasks,))
    opts = RunOptions(seeds=(0, 1), include_paths=(tasks,), progress=False)
    with ResultWriter(root / "out") as writer:
        run(index.resolve(["zeta_words", "alpha_words"]), SeededEcho(), {"name": "echo"}, opts, index, writer)
    return root / "out"


def _rows(out):
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_samples_are_in_task_seed_document_order(out):
    rows = _rows(out)
    expected = [(task, seed, doc_id) for task, docs in (("zeta_words", ZETA), ("alpha_words", ALPHA))
                for seed in (0, 1) for doc_id, _ in docs]
    assert [(r["task"], r["seed"], r["doc_id"]) for r in rows] == expected
    assert [d for d, _ in ZETA] != sorted(d for d, _ in ZETA)  # so sorting by id cannot pass


def test_each_row_belongs_to_its_document_and_seed(out):
    words = dict(ZETA + ALPHA)
    for r in _rows(out):
        word = words[r["doc_id"]]
        assert r["target"] == word
        assert r["prompt"].endswith(f"word: {word} =>")
        assert r["prompt"] == f"Repeat the word.\nword: lid => lid\nword: fork => fork\nword: {word} =>"
        assert r["shot_ids"] == ["t0", "t1"]
        expected = f"{word} {word}" if r["seed"] == 0 and len(word) == 3 else "" if r["seed"] == 1 and len(word) == 4 \
            else word
        assert r["prediction"] == expected
        assert r["scores"]["exact_match"] == (100.0 if expected == word else 0.0)


def _expected_em(docs, seed):
    return 100 * sum(not (seed == 0 and len(w) == 3 or seed == 1 and len(w) == 4) for _, w in docs) / len(docs)


def test_mean_and_sample_std_over_seeds(out):
    m = json.loads((out / "results.json").read_text())["tasks"]["zeta_words"]["metrics"]["exact_match"]
    per_seed = [_expected_em(ZETA, 0), _expected_em(ZETA, 1)]
    assert per_seed == [62.5, 87.5]
    assert m["per_seed"] == per_seed and m["mean"] == 75.0
    # the sample std (ddof=1), as lm-eval's sample_stddev; the population std would be 12.5
    assert m["std"] == pytest.approx(statistics.stdev(per_seed), abs=1e-4) == pytest.approx(17.6777, abs=1e-4)
    assert aggregate("x", [1.0, 2.0, 4.0]).std == pytest.approx((7 / 3) ** 0.5)
    assert aggregate("x", [3.0]).std == 0.0


def _bootstrap_stderr(n, stat):
    idx = np.random.default_rng(0).integers(0, n, size=(1000, n))  # one chunk for small n
    return float(np.std([stat(row) for row in idx], ddof=1))


def test_stderr_is_the_bootstrap_over_documents_with_the_same_indices_for_every_seed(out):
    results = json.loads((out / "results.json").read_text())["tasks"]
    rows = _rows(out)
    for task, docs in (("zeta_words", ZETA), ("alpha_words", ALPHA)):
        seeds = [[r for r in rows if r["task"] == task and r["seed"] == s] for s in (0, 1)]
        em = np.array([[r["scores"]["exact_match"] for r in seed_rows] for seed_rows in seeds])
        direct_em = _bootstrap_stderr(len(docs), lambda row: em[:, row].mean())
        assert results[task]["metrics"]["exact_match"]["stderr"] == pytest.approx(direct_em, abs=1e-4)
        bleu = Bleu()
        direct_bleu = _bootstrap_stderr(len(docs), lambda row: np.mean([bleu.compute(
            [seed_rows[i]["prediction"] for i in row], [seed_rows[i]["target"] for i in row]).value
            for seed_rows in seeds]))
        assert results[task]["metrics"]["bleu"]["stderr"] == pytest.approx(direct_bleu, abs=1e-4)
        assert direct_em > 0 and direct_bleu > 0
