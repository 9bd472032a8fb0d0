"""``compare``: tables, paired bootstrap (BLEU recomputed per resample), refusals, plots; stderr in results."""

from __future__ import annotations

import csv
import io
import json
import shutil

import numpy as np
import pytest

from mmcomp_eval.evaluation import bootstrap
from mmcomp_eval.api.document import Document
from mmcomp_eval.api.model import Model
from mmcomp_eval.cli import main
from mmcomp_eval.evaluation.compare import load_runs, paired_tests
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.evaluator import RunOptions, run
from mmcomp_eval.metrics.bleu import Bleu
from mmcomp_eval.evaluation.results import ResultWriter
from mmcomp_eval.tasks.index import TaskIndex

from user_task import USER_TASK, USER_TEMPLATE

WORDS = ["knife", "plate", "onion", "board", "pan", "spoon", "cup", "fork", "bowl", "pot", "lid", "tap",
         "jar", "egg", "oil", "salt", "rice", "milk", "tea", "bag"] * 2


class Guesser(Model):
    """Answers the query word (right), or a fixed wrong word for every ``every``-th query."""

    name = "guesser"

    def __init__(self, every: int):
        self.every = every

    def generate(self, requests, progress=None):
        out = []
        for r in requests:
            word = r.prompt.split("=>")[-2].split()[-1]
            out.append(" " + ("spoon big" if WORDS.index(word) % self.every == 0 else word))
        return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    tasks = d / "tasks"
    tasks.mkdir()
    (tasks / "echo_task.yaml").write_text(USER_TASK)
    (tasks / "echo.jinja").write_text(USER_TEMPLATE)
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"id": f"w{i}", "word": w, "answer": w}) + "\n"
                                              for i, w in enumerate(WORDS[:20])))
    index = TaskIndex.build((tasks,))
    out = {}
    for label, every, extra in (("good", 5, {}), ("bad", 1, {}), ("good_again", 5, {}),
                                ("short", 5, {"limit": 15}), ("more_shots", 5, {"shots": 3})):
        opts = RunOptions(seeds=(0, 1), include_paths=(tasks,), progress=False, **extra)
        with ResultWriter(d / label) as writer:  # the block's end publishes results.json + samples.jsonl
            run(index.resolve(["echo_task"]), Guesser(every), {"name": label}, opts, index, writer)
        out[label] = d / label
    return out


def test_results_carry_seeded_bootstrap_stderr(runs):
    good = json.loads((runs["good"] / "results.json").read_text())["tasks"]["echo_task"]["metrics"]
    again = json.loads((runs["good_again"] / "results.json").read_text())["tasks"]["echo_task"]["metrics"]
    assert good == again  # seeded: identical
    assert good["exact_match"]["mean"] == 80.0
    # exact match is a proportion: its bootstrap SE is close to sqrt(p(1-p)/n)
    assert good["exact_match"]["stderr"] == pytest.approx((0.8 * 0.2 / 20) ** 0.5 * 100, rel=0.15)
    assert 0 < good["bleu"]["stderr"] < 20


def test_bleu_bootstrap_recomputes_the_corpus_statistic():
    preds = ["a b c", "a x", "b", "", "c c c d", "a b"]
    refs = ["a b c", "a b", "b c", "a", "c d", "a b"]
    docs = [Document(str(i)) for i in range(len(preds))]
    m = Bleu(max_n=2)
    res = m.compute(preds, refs)
    stat = bootstrap.statistic("bleu", {"max_n": 2}, [res.per_sample], [res.value], [preds], refs, docs)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, len(preds), size=(25, len(preds)))
    direct = [m.compute([preds[i] for i in row], [refs[i] for i in row]).value for row in idx]
    assert stat(idx) == pytest.approx(direct)
    assert stat(np.arange(len(preds))[None])[0] == pytest.approx(res.value)
    assert res.value != pytest.approx(np.mean(res.per_sample))  # really not an average of per-sample scores


def test_paired_tests(runs):
    good, bad, again = load_runs([runs["good"], runs["bad"], runs["good_again"]])
    tests = {(t["a"], t["b"], t["metric"]): t for t in paired_tests([good, bad, again], resamples=2000)}
    same = tests[("good", "good_again", "exact_match")]
    assert same["delta"] == 0 and same["p_value"] == 1.0
    diff = tests[("good", "bad", "exact_match")]
    assert diff["delta"] == pytest.approx(80.0)  # 80% vs 0% right
    assert 50 < diff["ci_low"] < 80 < diff["ci_high"] <= 100
    assert diff["p_value"] < 0.05
    bleu = tests[("good", "bad", "bleu")]
    g = json.loads((runs["good"] / "results.json").read_text())["tasks"]["echo_task"]["metrics"]["bleu"]["mean"]
    b = json.loads((runs["bad"] / "results.json").read_text())["tasks"]["echo_task"]["metrics"]["bleu"]["mean"]
    assert bleu["delta"] == pytest.approx(g - b, abs=1e-3)


def test_compare_cli_formats_and_plots(runs, tmp_path, capsys):
    rc = main(["compare", str(runs["good"]), str(runs["bad"]), "--resamples", "500",
               "--plot-dir", str(tmp_path / "plots")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "| echo_task | exact_match | 80.00 ± " in out and "| good | bad | +80.00 |" in out
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["bleu.png", "exact_match.png"]
    assert (tmp_path / "plots" / "bleu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(runs["good"]), str(runs["bad"]), "--format", "csv", "--resamples", "200",
                 "--output", str(tmp_path / "t.csv")]) == 0
    table = list(csv.reader(io.StringIO((tmp_path / "t.csv").read_text().split("\n\n")[0])))
    assert table[0] == ["task", "metric", "good", "good stderr", "bad", "bad stderr"]
    assert {tuple(r[:2]): r[2] for r in table[1:]}[("echo_task", "exact_match")] == "80.0"
    assert main(["compare", str(runs["good"]), "--format", "latex"]) == 0
    out, _ = capsys.readouterr()
    assert r"\begin{tabular}" in out and r"echo\_task" in out and r"$\pm$" in out


@pytest.mark.parametrize("other, fragment", [
    ("short", "different documents (20 vs 15 documents; only in 'good': w15, w16, w17 ..."),
    ("more_shots", "different prompts for seed 0 (first at document w0, prompt line 4: 'word: knife =>' vs 'word: board => board')"),
])
def test_refuses_runs_on_different_documents_or_prompts(runs, capsys, other, fragment):
    rc = main(["compare", str(runs["good"]), str(runs[other]), "--resamples", "200"])
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert fragment in err


def test_allow_different_prompts_still_needs_same_documents(runs):
    good, more = load_runs([runs["good"], runs["more_shots"]])
    assert paired_tests([good, more], resamples=200, allow_different_prompts=True)
    good, short = load_runs([runs["good"], runs["short"]])
    with pytest.raises(UserError, match="different documents"):
        paired_tests([good, short], resamples=200, allow_different_prompts=True)


def _edit_results(data: dict, path: str, value) -> None:
    *keys, last = path.split(".")
    for k in keys:
        data = data[k]
    if value is _DELETE:
        del data[last]
    else:
        data[last] = value


_DELETE = object()
_METRIC = "tasks.echo_task.metrics.bleu"


@pytest.mark.parametrize("damage, fragment", [
    (b'{"tasks": {"\xff": 1}}', "results.json: not UTF-8 text (byte 0xff at offset 12)"),
    (b'{"tasks": {', "results.json: not valid JSON (Expecting property name enclosed in double quotes at line 1 "
                     "column 12)"),
    (("tasks", []), "results.json: field tasks: expected an object of tasks, got list []"),
    ((f"{_METRIC}.mean", _DELETE), f"results.json: field {_METRIC}.mean: expected a number, got nothing"),
    ((f"{_METRIC}.mean", "80"), f"results.json: field {_METRIC}.mean: expected a number, got str \"80\""),
    ((f"{_METRIC}.per_seed", [1.0]), f"results.json: field {_METRIC}.per_seed: expected a list of 2 numbers, one per seed"),
    (("tasks.echo_task.seeds", _DELETE), "results.json: field tasks.echo_task.seeds: expected a non-empty list of integers"),
])
def test_malformed_results_json_is_one_line_naming_file_and_field(runs, tmp_path, capsys, damage, fragment):
    broken = tmp_path / "broken"
    shutil.copytree(runs["good"], broken)
    if isinstance(damage, bytes):
        (broken / "results.json").write_bytes(damage)
    else:
        data = json.loads((broken / "results.json").read_text())
        _edit_results(data, *damage)
        (broken / "results.json").write_text(json.dumps(data))
    rc = main(["compare", str(runs["good"]), str(broken), "--resamples", "200"])
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{broken / fragment.split(':')[0]}:" in err and fragment.split(":", 1)[1] in err


@pytest.mark.parametrize("line, fragment", [
    (b'{"task": "echo_task", "seed": 0, "doc_id": "w0", "prediction": "\xfe"}',
     "samples.jsonl:1: not UTF-8 text (byte 0xfe at offset 64)"),
    (b'{"seed": 0, "doc_id": "w0"}', "samples.jsonl:1: field task: expected a string, got nothing"),
    (b'[1, 2]', "samples.jsonl:1: expected a JSON object per line, got list"),
])
def test_malformed_samples_are_one_line_naming_file_line_and_field(runs, tmp_path, capsys, line, fragment):
    broken = tmp_path / "broken"
    shutil.copytree(runs["good"], broken)
    data = json.loads((broken / "results.json").read_text())
    del data["samples_sha256"]  # as written before samples_sha256 existed: rows are checked one by one
    (broken / "results.json").write_text(json.dumps(data))
    (broken / "samples.jsonl").write_bytes(line + b"\n" + (runs["good"] / "samples.jsonl").read_bytes())
    rc = main(["compare", str(runs["good"]), str(broken), "--resamples", "200"])
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and f"{broken / 'samples.jsonl'}:1:" in err
    assert fragment.split(":", 2)[2] in err
