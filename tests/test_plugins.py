"""A real plugin package, built and pip-installed, used through the CLI: model, metric, output type and tasks.

The plugin also registers a retrieval model (``embed``) through the same
``mmcomp_eval.models`` entry point and ships a retrieval task of its own.

The package is installed with ``pip install --target`` into a folder that
only this test's subprocesses see (``PYTHONPATH``), not into the shared
virtualenv: other test sessions running at the same time never see it, and
nothing is left behind if this test is killed. Entry points are discovered
from the installed ``.dist-info`` exactly as from site-packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "mmcomp-tiny-plugin"
version = "0.0.1"

[project.entry-points."mmcomp_eval.models"]
last-word = "mmcomp_tiny_plugin.model:LastWord"
letters = "mmcomp_tiny_plugin.letters:Letters"

[project.entry-points."mmcomp_eval.metrics"]
first_letter = "mmcomp_tiny_plugin.metric:FirstLetter"

[project.entry-points."mmcomp_eval.output_types"]
shout = "mmcomp_tiny_plugin.output:Shout"

[project.entry-points."mmcomp_eval.tasks"]
tiny = "mmcomp_tiny_plugin:TASKS_DIR"

[tool.setuptools]
packages = ["mmcomp_tiny_plugin"]

[tool.setuptools.package-data]
mmcomp_tiny_plugin = ["tasks/*", "tasks/feats/*"]
"""
MODEL = '''
from mmcomp_eval.api.model import Model


class LastWord(Model):
    """Answers the query's word reversed after the first letter."""

    name = "last-word"

    def __init__(self, flip: bool = True):
        self.flip = flip

    def generate(self, requests, progress=None):
        words = [r.prompt.split("=>")[-2].split()[-1] for r in requests]
        return [" " + (w[0] + w[1:][::-1] if self.flip else w) for w in words]

    def fingerprint(self):
        return {"name": self.name, "flip": self.flip}
'''
METRIC = '''
from mmcomp_eval.api.metric import Metric, MetricResult


class FirstLetter(Metric):
    """Right when the first letters agree."""

    name = "first_letter"

    def __init__(self, resources=None):
        pass

    def compute(self, predictions, references, docs=()):
        per = tuple(100.0 if p[:1] == r[:1] else 0.0 for p, r in zip(predictions, references))
        return MetricResult(self.name, sum(per) / len(per), per)
'''
LETTERS = '''
import numpy as np

from mmcomp_eval.api.model import Model, ModelCapabilities


class Letters(Model):
    """A retrieval model: a caption is its letter counts, a video its precomputed 26 numbers; both normalised."""

    name = "letters"
    capabilities = ModelCapabilities(generate=False, embeddings=True)

    def embed(self, requests, progress=None):
        out = []
        for r in requests:
            if r.text is not None:
                v = np.zeros(26, dtype=np.float32)
                for c in r.text.lower():
                    if "a" <= c <= "z":
                        v[ord(c) - 97] += 1
            else:
                v = np.load(r.video.features.path).astype(np.float32)
            out.append(v / np.linalg.norm(v))
        return out

    def fingerprint(self):
        return {"name": self.name}
'''
RETRIEVAL_TASK = """
task: plugin_retrieval
output_type: retrieval
dataset: {name: jsonl, options: {files: {test: captions.jsonl}}}
target_field: video
metrics: [t2v_r1, t2v_mnr, v2t_r1, v2t_mnr]
retrieval: {text_field: text, features_dir: feats}
"""
OUTPUT = '''
from mmcomp_eval.tasks.outputs.generate import Generate


class Shout(Generate):
    """Generated text, read in capitals."""

    name = "shout"

    def parse(self, answers):
        return [p.upper() for p in super().parse(answers)]
'''
TASK = """
task: plugin_echo
dataset: {name: jsonl, options: {files: {test: docs.jsonl, train: docs.jsonl}}}
target_field: answer
prompt: {template: plugin_echo.jinja}
fewshot: {sampler: first, k: 1}
metrics: [exact_match, first_letter]
"""
TEMPLATE = """{%- macro input(d) -%}word: {{ d.word }} =>{%- endmacro -%}
{%- macro answer(d) -%}{{ d.answer }}{%- endmacro -%}
{% for s in shots -%}{{ input(s) }} {{ answer(s) }}
{% endfor -%}{{ input(doc) }}"""


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("plugin_src")
    pkg = src / "mmcomp_tiny_plugin"
    (pkg / "tasks").mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "__init__.py").write_text("from pathlib import Path\n\nTASKS_DIR = Path(__file__).parent / 'tasks'\n")
    (pkg / "model.py").write_text(textwrap.dedent(MODEL))
    (pkg / "metric.py").write_text(textwrap.dedent(METRIC))
    (pkg / "output.py").write_text(textwrap.dedent(OUTPUT))
    (pkg / "tasks" / "plugin_echo.yaml").write_text(TASK)
    (pkg / "tasks" / "plugin_shout.yaml").write_text(
        TASK.replace("task: plugin_echo", "task: plugin_shout\noutput_type: shout"))
    (pkg / "tasks" / "plugin_echo.jinja").write_text(TEMPLATE)
    (pkg / "letters.py").write_text(textwrap.dedent(LETTERS))
    (pkg / "tasks" / "plugin_retrieval.yaml").write_text(RETRIEVAL_TASK)
    (pkg / "tasks" / "feats").mkdir()
    # video v3 shows an onion too: caption "onion" ties with it, caption "egg" finds nothing of its own
    for i, w in enumerate(["knife", "plate", "onion", "onion"]):
        counts = [float(w.count(chr(97 + j))) for j in range(26)]
        (pkg / "tasks" / "feats" / f"v{i}.npy").write_bytes(_npy(counts))
    (pkg / "tasks" / "captions.jsonl").write_text("".join(
        json.dumps({"id": f"c{i}", "video": f"v{i}", "text": w}) + "\n"
        for i, w in enumerate(["knife", "plate", "onion", "egg"])))
    words = ["knife", "plate", "onion", "egg"]  # "egg" reversed after its first letter stays "egg"
    (pkg / "tasks" / "docs.jsonl").write_text(
        "".join(json.dumps({"id": f"w{i}", "word": w, "answer": w}) + "\n" for i, w in enumerate(words)))
    site = tmp_path_factory.mktemp("plugin_site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(site.glob("mmcomp_tiny_plugin-0.0.1.dist-info/entry_points.txt"))
    return site


def _npy(values: list[float]) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.array(values, dtype=np.float32))
    return buf.getvalue()


def _cli(site: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mmcomp_eval", *argv], capture_output=True, text=True,
                          timeout=300, env=env)


def test_plugin_model_metric_and_tasks_through_the_cli(plugin_site, tmp_path):
    ls = {what: _cli(plugin_site, "ls", what) for what in ("models", "metrics", "tasks")}
    assert all(p.returncode == 0 for p in ls.values()), [p.stderr for p in ls.values()]
    assert "last-word" in ls["models"].stdout
    assert "first_letter" in ls["metrics"].stdout and "Right when the first letters agree." in ls["metrics"].stdout
    assert "plugin_echo" in ls["tasks"].stdout and "compact_nup" in ls["tasks"].stdout

    run = _cli(plugin_site, "--model", "last-word", "--tasks", "plugin_echo,plugin_shout", "--no-progress",
               "--cache-dir", str(tmp_path / "store"), "--output-path", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    tasks = json.loads((tmp_path / "out" / "results.json").read_text())["tasks"]
    metrics = tasks["plugin_echo"]["metrics"]
    assert metrics["exact_match"]["mean"] == 25.0 and metrics["first_letter"]["mean"] == 100.0
    # the plugin's output type read the same answers in capitals: exact match ignores case, first_letter does not
    shout = tasks["plugin_shout"]["metrics"]
    assert shout["exact_match"]["mean"] == 25.0 and shout["first_letter"]["mean"] == 0.0

    # without the plugin on the path, its names are unknown again (one line, exit 2)
    gone = subprocess.run([sys.executable, "-m", "mmcomp_eval", "--model", "last-word", "--tasks", "plugin_echo"],
                          capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2 and "unknown" in gone.stderr and len(gone.stderr.strip().splitlines()) == 1


def test_plugin_retrieval_model_and_task(plugin_site, tmp_path):
    run = _cli(plugin_site, "--model", "letters", "--tasks", "plugin_retrieval", "--no-progress",
               "--cache-dir", str(tmp_path / "store"), "--output-path", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    task = json.loads((tmp_path / "out" / "results.json").read_text())["tasks"]["plugin_retrieval"]
    ranks = {r["doc_id"]: int(r["prediction"]) for r in
             map(json.loads, (tmp_path / "out" / "samples.jsonl").read_text().splitlines())}
    # t2v: knife, plate 1; onion ties with v3 (rank 2, pessimistic); egg scores 0.2 on v0, v1 and 0 on v3: rank 4.
    # v2t: v3 (onion features) ranks onion 1.0, knife 0.45, then plate and egg at 0: its caption egg is 4th
    assert ranks == {"t2v:c0": 1, "t2v:c1": 1, "t2v:c2": 2, "t2v:c3": 4, "v2t:v0": 1, "v2t:v1": 1, "v2t:v2": 1,
                     "v2t:v3": 4}
    m = task["metrics"]
    assert (m["t2v_r1"]["mean"], m["t2v_mnr"]["mean"], m["v2t_r1"]["mean"], m["v2t_mnr"]["mean"]) == \
        (50.0, 2.0, 75.0, 1.75)
    assert task["retrieval"]["similarity"] == "dot product of the caption and video embeddings"
