"""The compositional gap: declared twins, in-domain minus compositional, unpaired bootstrap, report and compare.

Every number is checked against a direct computation (the streams, the
sign, the seed combination, BLEU as a corpus statistic), so a gap with the
wrong sign, a shared resampling stream or per-seed indices cannot pass.
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from mmcomp_eval.api.model import Model
from mmcomp_eval.cli import main
from mmcomp_eval.evaluation.compare import gap_table, load_runs
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.evaluator import RunOptions, run
from mmcomp_eval.metrics.bleu import Bleu
from mmcomp_eval.evaluation.report import markdown_table
from mmcomp_eval.evaluation.results import ResultWriter
from mmcomp_eval.tasks.index import BUILTIN_TASKS, TaskIndex

from user_task import USER_TEMPLATE, run_cli

TWIN_TASK = """
task: {name}
{extra}
dataset:
  name: jsonl
  options:
    files: {{test: {docs}, train: train.jsonl}}
target_field: answer
answer_kind: text
prompt: {{template: echo.jinja, instruction: Repeat the word.}}
fewshot: {{sampler: first, k: {k}}}
# sampled, so each seed reaches the requests (greedy requests share seed 0)
generation: {{max_new_tokens: 4, stop: ["\\n"], do_sample: true}}
metrics: [exact_match, bleu]
"""
# the model gets these wrong (the "novel compositions"): 9 of 20 compositional words, 2 of 24 in-domain ones
HARD = {"fork", "bowl", "pot", "lid", "tap", "jar", "egg", "oil", "salt", "cup", "bag"}
COMPOSITIONAL = ["fork", "bowl", "knife", "pot", "lid", "plate", "tap", "jar", "onion", "egg",
                 "oil", "board", "salt", "pan", "spoon", "rice", "milk", "tea", "kettle", "peach"]
IN_DOMAIN = ["plate", "onion", "board", "pan", "spoon", "rice", "milk", "tea", "cup", "bag", "sink", "mug",
             "towel", "apple", "bread", "cheese", "glass", "knob", "lamp", "mat", "nut", "pear", "sauce", "wok"]


class Guesser(Model):
    """Repeats the query word, except hard words (answered wrong), and with seed 1 every word of 4 letters."""

    name = "guesser"

    def __init__(self, hard=frozenset(HARD)):
        self.hard = hard

    def generate(self, requests, progress=None):
        out = []
        for r in requests:
            word = r.prompt.split("=>")[-2].split()[-1]
            wrong = word in self.hard or (r.settings.seed == 1 and len(word) == 4)
            out.append(" " + ("spoon big" if wrong else word))
        return out


def expected_em(words, seed, hard=HARD):
    """Exact match of :class:`Guesser`, restated from its rule."""
    return 100 * sum(w not in hard and not (seed == 1 and len(w) == 4) for w in words) / len(words)


def write_twins(d, comp_extra="", rand_extra="in_domain_of: words", rand_k=1):
    d.mkdir(parents=True, exist_ok=True)
    (d / "words.yaml").write_text(TWIN_TASK.format(name="words", extra=comp_extra, docs="comp.jsonl", k=1))
    (d / "words_random.yaml").write_text(TWIN_TASK.format(name="words_random", extra=rand_extra, docs="rand.jsonl",
                                                          k=rand_k))
    (d / "echo.jinja").write_text(USER_TEMPLATE)
    for name, words, prefix in (("comp.jsonl", COMPOSITIONAL, "c"), ("rand.jsonl", IN_DOMAIN, "r"),
                                ("train.jsonl", ["shot", "cook", "stir", "boil"], "t")):
        (d / name).write_text("".join(json.dumps({"id": f"{prefix}{i}", "word": w, "answer": w}) + "\n"
                                      for i, w in enumerate(words)))
    return d


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gap")
    tasks = write_twins(root / "tasks")
    index = TaskIndex.build((tasks,))
    out = {}
    for label, model in (("guesser", Guesser()), ("perfect", Guesser(frozenset()))):
        opts = RunOptions(seeds=(0, 1), include_paths=(tasks,), progress=False)
        with ResultWriter(root / label) as writer:
            record = run(index.resolve(["words", "words_random"]), model, {"name": label}, opts, index, writer)
        out[label] = (root / label, record)
    return out


def _results(folder):
    return json.loads((folder / "results.json").read_text())


def _samples(folder, task):
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    by_seed: dict[int, list[dict]] = {}
    for r in rows:
        if r["task"] == task:
            by_seed.setdefault(r["seed"], []).append(r)
    return [by_seed[s] for s in sorted(by_seed)]


def test_gap_is_in_domain_minus_compositional_per_metric_and_seed(twin_runs):
    res = _results(twin_runs["guesser"][0])
    (g,) = res["gaps"]
    assert (g["compositional_task"], g["in_domain_task"], g["definition"]) == ("words", "words_random",
                                                                             "in_domain - compositional")
    assert g["n_documents"] == {"compositional": 20, "in_domain": 24}
    assert g["bootstrap"] == {"method": "unpaired percentile", "resamples": 1000, "seed": 0, "level": 0.95}
    comp, dom = res["tasks"]["words"]["metrics"], res["tasks"]["words_random"]["metrics"]
    comp_em, dom_em = ([expected_em(words, s) for s in (0, 1)] for words in (COMPOSITIONAL, IN_DOMAIN))
    assert comp_em == [55.0, 45.0]  # 9 of 20 hard; seed 1 also misses rice and milk
    assert comp["exact_match"]["per_seed"] == comp_em
    assert dom["exact_match"]["per_seed"] == pytest.approx(dom_em, abs=1e-4)
    # mean +- sample std (ddof=1) over seeds, as the paper's "mean and std across 3 runs" and lm-eval
    assert comp["exact_match"]["mean"] == 50.0 and comp["exact_match"]["std"] == pytest.approx(10 / 2 ** 0.5, abs=1e-4)
    em = g["metrics"]["exact_match"]
    assert em["compositional"] == 50.0 and em["in_domain"] == dom["exact_match"]["mean"]
    assert em["gap"] == pytest.approx(statistics.fmean(dom_em) - 50.0, abs=1e-4) and em["gap"] > 0
    assert em["per_seed"] == pytest.approx([d - c for d, c in zip(dom_em, comp_em)], abs=1e-4)
    assert em["gap"] == pytest.approx(statistics.fmean(em["per_seed"]), abs=1e-4)
    bleu = g["metrics"]["bleu"]
    assert bleu["gap"] == pytest.approx(dom["bleu"]["mean"] - comp["bleu"]["mean"], abs=1e-3)
    assert set(g["metrics"]) == {"exact_match", "bleu"}
    # the same run in memory: what the printed report reads
    assert twin_runs["guesser"][1].as_dict()["gaps"] == res["gaps"]


def _direct_gap(folder, metric, stat):
    """Percentile CI and p-value of in-domain minus compositional, resampled here from samples.jsonl."""
    stream_dom, stream_comp = np.random.SeedSequence(0).spawn(2)
    values = {}
    for task, stream in (("words_random", stream_dom), ("words", stream_comp)):
        seeds = _samples(folder, task)
        idx = np.random.default_rng(stream).integers(0, len(seeds[0]), size=(1000, len(seeds[0])))
        values[task] = np.mean([stat(rows, idx, metric) for rows in seeds], axis=0)  # mean over seeds, same idx
    deltas = values["words_random"] - values["words"]
    return deltas


def _mean_of_scores(rows, idx, metric):
    scores = np.array([r["scores"][metric] for r in rows])
    return scores[idx].mean(axis=1)


def _corpus_bleu(rows, idx, metric):
    m = Bleu()
    return np.array([m.compute([rows[i]["prediction"] for i in row], [rows[i]["target"] for i in row]).value
                     for row in idx])


@pytest.mark.parametrize("metric, stat", [("exact_match", _mean_of_scores), ("bleu", _corpus_bleu)])
def test_gap_interval_is_an_unpaired_bootstrap_over_both_test_sets(twin_runs, metric, stat):
    folder = twin_runs["guesser"][0]
    m = _results(folder)["gaps"][0]["metrics"][metric]
    deltas = _direct_gap(folder, metric, stat)
    lo, hi = np.quantile(deltas, [0.025, 0.975])
    assert (m["ci_low"], m["ci_high"]) == (pytest.approx(lo, abs=1e-4), pytest.approx(hi, abs=1e-4))
    p = (np.sum(np.abs(deltas - m["gap"]) >= abs(m["gap"]) - 1e-9) + 1) / 1001
    assert m["p_value"] == pytest.approx(p, abs=2e-3)
    assert m["ci_low"] < m["gap"] < m["ci_high"]
    if metric == "bleu":  # a corpus statistic: the mean of per-pair BLEU would give another interval
        assert not np.allclose(deltas, _direct_gap(folder, metric, _mean_of_scores))


def test_a_model_without_hard_words_has_a_gap_only_from_seed_1(twin_runs):
    g = _results(twin_runs["perfect"][0])["gaps"][0]["metrics"]["exact_match"]
    comp, dom = ([expected_em(words, s, hard=()) for s in (0, 1)] for words in (COMPOSITIONAL, IN_DOMAIN))
    assert comp[0] == dom[0] == 100.0  # seed 0 is all right on both sides; seed 1 misses the 4-letter words
    assert g["per_seed"] == pytest.approx([0.0, dom[1] - comp[1]], abs=1e-4)


def test_gap_needs_both_twins_in_the_run(tmp_path):
    tasks = write_twins(tmp_path / "tasks")
    index = TaskIndex.build((tasks,))
    opts = RunOptions(include_paths=(tasks,), progress=False)
    with ResultWriter(tmp_path / "o") as writer:
        record = run(index.resolve(["words_random"]), Guesser(), {"name": "g"}, opts, index, writer)
    assert record.gaps == [] and _results(tmp_path / "o")["gaps"] == []
    assert "Compositional gap" not in markdown_table(record.as_dict())


def test_twins_are_declared_not_guessed_from_names(tmp_path):
    """A task called ``*_random`` without ``in_domain_of`` is no twin; a declared twin of any name is."""
    tasks = write_twins(tmp_path / "tasks", rand_extra="")
    index = TaskIndex.build((tasks,))
    opts = RunOptions(include_paths=(tasks,), progress=False)
    record = run(index.resolve(["words", "words_random"]), Guesser(), {"name": "g"}, opts, index, ResultWriter(None))
    assert record.gaps == []
    tasks = write_twins(tmp_path / "t2", comp_extra="in_domain_of: words_random", rand_extra="")
    index = TaskIndex.build((tasks,))
    record = run(index.resolve(["words_random", "words"]), Guesser(), {"name": "g"}, opts, index, ResultWriter(None))
    (g,) = record.gaps  # here "words" is declared the in-domain twin of "words_random"
    assert (g["compositional_task"], g["in_domain_task"]) == ("words_random", "words")
    assert g["metrics"]["exact_match"]["gap"] < 0


def test_builtin_random_tasks_are_declared_twins_differing_only_in_the_split():
    index = TaskIndex.build()
    twins = {t.task: t.in_domain_of for t in index.tasks.values() if t.in_domain_of}
    assert twins == {"compact_nup_random": "compact_nup", "compact_verb_random": "compact_verb",
                     "compact_noun_random": "compact_noun"}
    for dom, comp in twins.items():
        a, b = index.tasks[dom], index.tasks[comp]
        assert a.dataset.options == {**b.dataset.options, "split_kind": "random"}
        assert b.dataset.options["split_kind"] == "compositional"
        same = ("prompt", "metrics", "fewshot", "generation", "target_field", "answer_kind", "eval_split",
                "fewshot_split")
        assert all(getattr(a, f) == getattr(b, f) for f in same)
        assert b.in_domain_of is None  # the compositional side does not inherit the link


@pytest.mark.parametrize("comp_extra, rand_extra, rand_k, fragment", [
    ("", "in_domain_of: wrods", 1, "in_domain_of 'wrods' is not a known task (did you mean 'words'?)"),
    ("", "in_domain_of: words_random", 1, "in_domain_of names the task itself"),
])
def test_bad_twin_declarations_are_one_line_errors(tmp_path, capsys, comp_extra, rand_extra, rand_k, fragment):
    tasks = write_twins(tmp_path / "tasks", comp_extra, rand_extra, rand_k)
    (tasks / "dummy.yaml").write_text(TWIN_TASK.format(name="dummy", extra="", docs="comp.jsonl", k=1))
    rc, _, err = run_cli(capsys, "--model", "mrh", "--tasks", "words,words_random", "--include-path", str(tasks))
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert fragment in err


def test_twins_with_different_shots_are_refused_before_inference(tmp_path):
    tasks = write_twins(tmp_path / "tasks", rand_k=3)
    index = TaskIndex.build((tasks,))

    class Refuses(Guesser):
        def generate(self, requests, progress=None):
            raise AssertionError("asked the model before refusing")

    with pytest.raises(UserError, match="tasks words and words_random are twins .in_domain_of. but run with 1 and 3 "
                                        "shots; give them the same fewshot.k or pass --shots"):
        run(index.resolve(["words", "words_random"]), Refuses(), {"name": "g"}, RunOptions(progress=False), index,
            ResultWriter(None))
    opts = RunOptions(shots=2, progress=False)  # --shots makes them equal
    assert run(index.resolve(["words", "words_random"]), Guesser(), {"name": "g"}, opts, index, ResultWriter(None)).gaps


def test_twins_without_a_shared_metric_are_refused(tmp_path, capsys):
    tasks = write_twins(tmp_path / "tasks")
    text = (tasks / "words_random.yaml").read_text().replace("metrics: [exact_match, bleu]", "metrics: [bertscore]")
    (tasks / "words_random.yaml").write_text(text)
    rc, _, err = run_cli(capsys, "--model", "mrh", "--tasks", "words,words_random", "--include-path", str(tasks))
    assert rc == 2 and "in_domain_of 'words', but the two tasks share no metric" in err


def test_report_prints_the_gap_with_its_sign_convention(twin_runs):
    folder, record = twin_runs["guesser"]
    text = markdown_table(record.as_dict())
    m = _results(folder)["gaps"][0]["metrics"]["exact_match"]
    assert "Compositional gap = in-domain (random split) minus compositional; positive: worse on novel" in text
    assert (f"| words | words_random | exact_match | 50.00 | {m['in_domain']:.2f} | {m['gap']:+.2f} | "
            f"[{m['ci_low']:+.2f}, {m['ci_high']:+.2f}] | {m['p_value']:.4f} |") in text


def test_compare_shows_each_models_gap(twin_runs, tmp_path, capsys):
    g, p = (_results(twin_runs[k][0])["gaps"][0]["metrics"]["exact_match"] for k in ("guesser", "perfect"))
    rc = main(["compare", str(twin_runs["guesser"][0]), str(twin_runs["perfect"][0]), "--no-significance"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "| compositional | in-domain | metric | guesser | perfect |" in out
    assert (f"| words | words_random | exact_match | {g['gap']:+.2f} [{g['ci_low']:+.2f}, {g['ci_high']:+.2f}] | "
            f"{p['gap']:+.2f} [{p['ci_low']:+.2f}, {p['ci_high']:+.2f}] |") in out
    runs = load_runs([twin_runs["guesser"][0], twin_runs["perfect"][0]])
    header, *rows = gap_table(runs, "csv").splitlines()
    assert header == ("compositional,in_domain,metric,guesser gap,guesser ci_low,guesser ci_high,"
                      "perfect gap,perfect ci_low,perfect ci_high")
    assert f"words,words_random,exact_match,{g['gap']},{g['ci_low']},{g['ci_high']},{p['gap']},{p['ci_low']}," \
           f"{p['ci_high']}" in rows
    assert r"words\_random" in gap_table(runs, "latex")


def test_compare_without_gaps_prints_no_gap_table(twin_runs, tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    old = _results(twin_runs["guesser"][0])
    del old["gaps"]  # a results.json written before gaps existed
    (folder / "results.json").write_text(json.dumps(old))
    assert gap_table(load_runs([folder])) == ""


@pytest.mark.data
def test_mrh_gap_on_the_reference_splits(reference_ek100, tmp_path, capsys):
    """The README command on real data: the gap equals the difference of the two tasks' reported means."""
    rc, out, err = run_cli(capsys, "--model", "mrh", "--tasks", "compact_nup,compact_nup_random", "--limit", "100",
                           "--no-progress", "--ek100-dir", str(reference_ek100), "--output-path", str(tmp_path / "o"))
    assert rc == 0, err
    res = _results(tmp_path / "o")
    (g,) = res["gaps"]
    assert (g["compositional_task"], g["in_domain_task"]) == ("compact_nup", "compact_nup_random")
    assert set(g["metrics"]) == {"bleu", "exact_match", "category_accuracy", "bertscore"}
    for metric, m in g["metrics"].items():
        comp = res["tasks"]["compact_nup"]["metrics"][metric]["mean"]
        dom = res["tasks"]["compact_nup_random"]["metrics"][metric]["mean"]
        assert m["gap"] == pytest.approx(dom - comp, abs=2e-4)
        assert m["ci_low"] <= m["gap"] <= m["ci_high"]  # EM can be 0 on both sides of 100 MRH documents
    assert any(m["ci_low"] < m["gap"] < m["ci_high"] for m in g["metrics"].values())
    assert "| compact_nup | compact_nup_random | bleu |" in out
    assert (BUILTIN_TASKS / "compact_nup_random.yaml").read_text().count("in_domain_of: compact_nup") == 1
