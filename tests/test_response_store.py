"""The response store and the caching wrapper: keys, resume, re-scoring without the model."""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Sequence

import pytest

from mmcomp_eval.api.model import Model, ModelCapabilities
from mmcomp_eval.api.request import ChatMessage, GenerationRequest, GenerationSettings, LoglikelihoodRequest
from mmcomp_eval.runtime.caching_model import CachingModel, cache_identity
from mmcomp_eval.errors import UserError
from mmcomp_eval.runtime.response_store import CHECKED_FILE, ResponseStore, model_key, request_key

from disk_faults import fill, small_disk
from user_task import USER_TASK, WORDS, make_user_tasks, run_cli


class Crash(Exception):
    pass


class WordModel(Model):
    """Answers the word before '=>' (so scores are not all zero); records what it was asked.

    ``crash_after``: raise after that many answers, like a process killed mid-batch.
    """

    name = "word"

    def __init__(self, batch_size: int = 3, crash_after: int | None = None, callback: bool = True):
        self.batch_size = batch_size
        self.crash_after = crash_after
        self.asked: list[str] = []
        self.capabilities = ModelCapabilities(reports_each_result=callback)
        if not callback:  # an adapter written before on_result existed
            self.generate = self._generate_plain

    def _answer(self, r: GenerationRequest) -> str:
        if self.crash_after is not None and len(self.asked) >= self.crash_after:
            raise Crash
        self.asked.append(r.prompt)
        words = r.prompt.split("=>")[-2].split() if "=>" in r.prompt else [""]
        return " " + (words[-1] if sum(map(ord, r.prompt)) % 4 else "wrong")  # some right, some wrong

    def generate(self, requests, progress=None, on_result=None):
        out = []
        for start in range(0, len(requests), self.batch_size):
            batch = [self._answer(r) for r in requests[start : start + self.batch_size]]
            for j, text in enumerate(batch):
                if on_result:
                    on_result(start + j, text)
            out += batch
        return out

    def _generate_plain(self, requests, progress=None):
        return [self._answer(r) for r in requests]

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest], progress=None, on_result=None):
        self.asked += [r.context for r in requests]
        out = [[-len(c) / 3.0 for c in r.continuations] for r in requests]
        for i, scores in enumerate(out if on_result else ()):
            on_result(i, scores)
        return out

    def fingerprint(self):
        return {"name": self.name, "version": 1}


def test_keys_are_content_addresses():
    s = GenerationSettings(max_new_tokens=4)
    a = GenerationRequest("doc1", "p", s)
    assert request_key("generate", a) == request_key("generate", GenerationRequest("other-id", "p", s))
    different = [GenerationRequest("doc1", "q", s), GenerationRequest("doc1", "p", GenerationSettings(max_new_tokens=5)),
                 GenerationRequest("doc1", "p", GenerationSettings(max_new_tokens=4, seed=1)),
                 GenerationRequest("doc1", "p", s, (ChatMessage("user", "p"),)),
                 GenerationRequest("doc1", "p", s, None, ("doc1#0",))]
    keys = {request_key("generate", r) for r in [a, *different]}
    assert len(keys) == 6
    assert request_key("generate", a, media=["k1"]) != request_key("generate", a, media=["k2"])
    assert request_key("loglikelihood", LoglikelihoodRequest("d", "p", (" a",))) != request_key("generate", a)
    assert model_key({"name": "hf", "dtype": "float32"}) != model_key({"name": "hf", "dtype": "bfloat16"})


def test_store_wal_first_answer_wins_and_floats_round_trip(tmp_path):
    store = ResponseStore(tmp_path)
    mode = sqlite3.connect(store.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    values = [-1.2345678901234567e-5, -0.1 - 0.2, -1e300, float("-inf")]
    store.put("m", "k", "loglikelihood", values)
    store.put("m", "k", "loglikelihood", [0.0])  # a second writer of the same key
    other = ResponseStore(tmp_path)  # another process's connection sees the commit
    got = other.get_many("m", ["k", "absent"])["k"]
    assert got[:3] == values[:3] and math.isinf(got[3]) and "absent" not in other.get_many("m", ["absent"])
    assert other.missing("m", ["k", "x", "x"]) == ["x"]


WRITER = """
import sys, time
from mmcomp_eval.runtime.response_store import ResponseStore
start = float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))  # all processes open the new store at the same moment
store = ResponseStore(sys.argv[1])
for i in range(40):
    store.put("m", f"k{i % 30}", "generate", f"answer {i % 30}")  # overlapping keys: first one wins
    store.put("m", f"w{sys.argv[2]}-{i}", "generate", sys.argv[2])
"""


def test_many_processes_create_and_write_one_store(tmp_path):
    import subprocess
    import sys
    import time

    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "s"), str(n), str(start)],
                              stderr=subprocess.PIPE, text=True) for n in range(6)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    store = ResponseStore(tmp_path / "s")
    assert store.count() == 30 + 6 * 40
    assert store.get_many("m", ["k7"]) == {"k7": "answer 7"}


def test_identity_of_adapters_without_fingerprint_includes_their_arguments():
    class Bare(Model):
        name = "bare"

        def generate(self, requests, progress=None):
            return []

    a = cache_identity(Bare(), {"checkpoint": "a", "batch_size": 8})
    assert a == {"name": "bare", "args": {"checkpoint": "a"}}  # batch size never changes an answer
    assert cache_identity(Bare(), {"checkpoint": "b"}) != a
    assert cache_identity(WordModel(), {"anything": 1}) == {"name": "word", "version": 1}


@pytest.mark.parametrize("callback", [True, False])
def test_only_misses_reach_the_model_and_a_crash_loses_only_what_was_in_flight(tmp_path, callback):
    reqs = [GenerationRequest(f"d{i}", f"word: w{i} =>", GenerationSettings()) for i in range(10)]
    reqs.append(GenerationRequest("dup", "word: w0 =>", GenerationSettings()))  # same content as d0
    fresh = WordModel(callback=callback)
    expected = fresh.generate(reqs) if callback else fresh._generate_plain(reqs)

    store = ResponseStore(tmp_path)
    crashing = WordModel(crash_after=7, callback=callback)
    with pytest.raises(Crash):
        CachingModel(crashing, store, crashing.fingerprint(), unreported_chunk=3).generate(reqs)
    # batches (or, without callbacks, chunks) of 3: the two finished are stored, the one in flight is lost
    assert store.count() == 6

    resumed = WordModel(callback=callback)
    cached = CachingModel(resumed, store, resumed.fingerprint())
    assert cached.generate(reqs) == expected
    assert resumed.asked == [r.prompt for r in reqs[6:10]]  # nothing answered is asked again
    assert (cached.hits, cached.misses) == (11 - len(resumed.asked), len(resumed.asked))
    again = WordModel(callback=callback)
    assert CachingModel(again, store, again.fingerprint()).generate(reqs) == expected and again.asked == []


def test_loglikelihood_is_cached_exactly(tmp_path):
    reqs = [LoglikelihoodRequest(f"d{i}", f"ctx {i}", (" a", " bb", " ccc")) for i in range(4)]
    first = CachingModel(WordModel(), ResponseStore(tmp_path), {"name": "word"})
    values = first.loglikelihood(reqs)
    inner = WordModel()
    second = CachingModel(inner, ResponseStore(tmp_path), {"name": "word"})
    assert second.loglikelihood(reqs) == values and inner.asked == []


@pytest.fixture
def user_tasks(tmp_path):
    return make_user_tasks(tmp_path, [*WORDS, "cup", "fork"])


def test_failed_scoring_is_redone_from_the_store(user_tasks, tiny_llama_dir, tiny_ek100, tmp_path, capsys):
    """Scoring that fails after inference (documents lack the class ids category accuracy
    needs); the rerun with the task fixed asks the model nothing it already answered."""
    broken = USER_TASK.replace("metrics: [exact_match, bleu]",
                               "metrics: [exact_match, {name: category_accuracy, options: {atom: verb}}]")
    (user_tasks / "echo_task.yaml").write_text(broken)
    common = ["--model", "hf", "--model-args", f"pretrained={tiny_llama_dir},batch_size=3", "--tasks", "echo_task",
              "--include-path", str(user_tasks), "--no-progress", "--cache-dir", str(tmp_path / "store"),
              "--seeds", "2", "--offline", "--ek100-dir", str(tiny_ek100),
              "--gen-kwargs", "do_sample=true"]  # sampled: the two seeds ask different requests (greedy would share)
    rc, _, err = run_cli(capsys, *common, "--output-path", str(tmp_path / "a"))
    assert rc == 2 and "trg_verb_class" in err
    store = ResponseStore(tmp_path / "store")
    assert store.count() == 8  # seed 0 was answered before scoring failed

    (user_tasks / "echo_task.yaml").write_text(USER_TASK)
    rc, _, err = run_cli(capsys, *common, "--output-path", str(tmp_path / "b"))
    assert rc == 0, err
    cache = json.loads((tmp_path / "b" / "results.json").read_text())["cache"]
    assert cache["path"] == str(store.path) and (cache["hits"], cache["misses"]) == (8, 8)
    rc, _, err = run_cli(capsys, *common, "--output-path", str(tmp_path / "c"))
    assert rc == 0, err
    res_c = json.loads((tmp_path / "c" / "results.json").read_text())
    assert (res_c["cache"]["hits"], res_c["cache"]["misses"]) == (16, 0)

    rc, _, err = run_cli(capsys, *common, "--output-path", str(tmp_path / "d"), "--no-cache")
    assert rc == 0, err
    res_d = json.loads((tmp_path / "d" / "results.json").read_text())
    assert res_d["cache"] == {"enabled": False}
    assert res_d["tasks"] == res_c["tasks"]
    assert (tmp_path / "c" / "samples.jsonl").read_bytes() == (tmp_path / "d" / "samples.jsonl").read_bytes()


def _store_with_answers(folder, n: int = 3000) -> bytes:
    """A store holding ``n`` answers, closed as a run closes it; its bytes."""
    store = ResponseStore(folder)
    for i in range(n):
        store.put("m", f"{i:064x}", "generate", f"answer {i}")
    store.close()
    return (folder / "responses.sqlite").read_bytes()


def _damage(path, page: int = 40, keep_mtime: bool = False) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:  # what a bad sector or a hostile byte flip does to a data page
        f.seek(4096 * page + 100)
        f.write(bytes(range(256)) * 8)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_damaged_store_is_one_line_on_opening_and_left_as_it_was(tmp_path, capsys):
    _store_with_answers(tmp_path / "s")
    path = tmp_path / "s" / "responses.sqlite"
    assert (tmp_path / "s" / CHECKED_FILE).is_file()  # the clean close vouched for the file
    _damage(path)
    damaged = path.read_bytes()
    with pytest.raises(UserError) as err:
        ResponseStore(tmp_path / "s")
    assert f"response store {path} is damaged (quick_check: On tree page 41" in str(err.value)
    assert f"move it away (mv {path} {path}.damaged) and rerun with a fresh store" in str(err.value)
    assert path.read_bytes() == damaged  # nothing stored was touched
    # through the command line: one line, before the model loads
    tasks = make_user_tasks(tmp_path)
    rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tmp_path / 'no_model'}",
                         "--tasks", "echo_task", "--include-path", str(tasks), "--cache-dir", str(tmp_path / "s"),
                         "--no-progress")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "is damaged" in err and "no_model" not in err


def test_damage_the_opening_check_skipped_is_one_line_when_read(tmp_path):
    _store_with_answers(tmp_path / "s")
    _damage(tmp_path / "s" / "responses.sqlite", keep_mtime=True)  # same inode, size and mtime as vouched for
    store = ResponseStore(tmp_path / "s")  # the cheap rule: an unchanged file is not read through again
    with pytest.raises(UserError) as err:
        store.get_many("m", [f"{i:064x}" for i in range(3000)])
    assert "is damaged (database disk image is malformed); move it away" in str(err.value)
    store.close()
    assert not (tmp_path / "s" / CHECKED_FILE).exists()  # so the next open checks it through


def test_full_disk_mid_run_is_one_line_and_stored_answers_survive(tmp_path):
    reqs = [GenerationRequest(f"d{i}", f"word: w{i} =>", GenerationSettings()) for i in range(300)]
    expected = WordModel().generate(reqs)
    with small_disk(tmp_path / "disk", 4096) as disk:
        store = ResponseStore(disk / "store")
        filler = fill(disk, 160 * 1024)
        with pytest.raises(UserError) as err:
            CachingModel(WordModel(), store, {"name": "word"}).generate(reqs)
        assert f"response store {store.path}: the disk is full (database or disk is full); free space on " \
               f"{disk / 'store'} and rerun: the answers stored so far are kept" in str(err.value)
        stored = store.count()
        store.close()
        assert 0 < stored < len(reqs)
        filler.unlink()  # space freed: the rerun asks only what was not stored
        resumed = WordModel()
        assert CachingModel(resumed, ResponseStore(disk / "store"), {"name": "word"}).generate(reqs) == expected
        assert len(resumed.asked) == len(reqs) - stored
