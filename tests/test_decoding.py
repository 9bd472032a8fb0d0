"""Decoding: one settings type, --gen-kwargs, and sampling that does not depend on the batch.

The model tests use the tiny random Llama of conftest (SmolLM2's tokenizer).
Its weights are large, so greedy next-token distributions are peaked; the
sampling tests use temperature 1.5 and no top-k, where its distributions
are wide enough that answers vary from draw to draw.
"""

from __future__ import annotations

import json
import logging
import math
import shutil

import pytest
import torch

from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.prepare import RunOptions, with_generation_overrides, with_model_generation_defaults
from mmcomp_eval.config.model_args import parse_model_args
from mmcomp_eval.models import create_model
from mmcomp_eval.models.batching import BatchSizer
from mmcomp_eval.models.decoding import _row_seeded_sampler, uniform
from mmcomp_eval.config.task_config import TaskConfig, load_task_file, parse_generation_overrides
from mmcomp_eval.tasks.index import TaskIndex

from user_task import USER_TASK, make_user_tasks, run_cli

PROMPTS = [f"{verb} {noun} . {verb2} {noun} =>" for verb, verb2 in (("take", "wash"), ("open", "close"),
                                                                      ("cut", "put"), ("pick up", "rinse"))
           for noun in ("plate", "knife", "onion", "board", "pan")]  # 20 prompts of different lengths
HOT = GenerationSettings(max_new_tokens=6, stop=(), do_sample=True, temperature=1.5, top_k=0)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return create_model("hf", {"pretrained": str(tiny_llama_dir), "batch_size": 4})


def _reqs(settings: GenerationSettings, prompts=PROMPTS) -> list[GenerationRequest]:
    return [GenerationRequest(f"r{i}", p, settings) for i, p in enumerate(prompts)]


def _at_batch_size(model, size: int, requests) -> list[str]:
    model._sizer = BatchSizer(size)
    try:
        return model.generate(requests)
    finally:
        model._sizer = BatchSizer(4)


# -- the draws ------------------------------------------------------------------------------------------------


def test_uniform_is_a_pure_function_of_seed_and_step():
    # pinned: a change here changes every sampled answer ever stored
    assert uniform(0, 0) == 0.8336885269740499 and uniform(12345, 7) == 0.7627444150759404
    values = [uniform(seed, step) for seed in range(300) for step in range(40)]
    assert all(0.0 <= v < 1.0 for v in values) and len(set(values)) == len(values)
    assert abs(sum(values) / len(values) - 0.5) < 0.01
    assert sum(v < 0.1 for v in values) / len(values) == pytest.approx(0.1, abs=0.01)


def _draw(settings: GenerationSettings, logits: torch.Tensor, n: int) -> torch.Tensor:
    """Token picked for each of ``n`` seeds from the same logits (step 0)."""
    sampler = _row_seeded_sampler()(settings, range(n), 1)
    out = sampler(torch.zeros(n, 1, dtype=torch.long), logits.expand(n, -1).clone())
    assert torch.isfinite(out).sum(dim=1).eq(1).all()  # exactly one token left per row
    return out.argmax(dim=-1)


def test_sampler_draws_from_the_warped_distribution():
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, -0.5]])
    n = 8000
    cases = [
        (GenerationSettings(do_sample=True, top_k=0), []),
        (GenerationSettings(do_sample=True), [TopKLogitsWarper(50)]),  # HF's top_k 50 unless top_k=0 is asked
        (GenerationSettings(do_sample=True, top_k=0, temperature=0.5), [TemperatureLogitsWarper(0.5)]),
        (GenerationSettings(do_sample=True, top_k=3), [TopKLogitsWarper(3)]),
        (GenerationSettings(do_sample=True, top_k=0, top_p=0.8), [TopPLogitsWarper(0.8)]),
        (GenerationSettings(do_sample=True, top_k=5, top_p=0.9, temperature=0.7),
         [TemperatureLogitsWarper(0.7), TopKLogitsWarper(5), TopPLogitsWarper(0.9)]),
    ]
    for settings, warpers in cases:
        expected = logits.clone()
        for warp in warpers:  # HF's own warpers, HF's order
            expected = warp(None, expected)
        p = expected.softmax(-1)[0]
        freq = torch.bincount(_draw(settings, logits, n), minlength=p.numel()).double() / n
        assert (freq[p == 0] == 0).all(), settings  # filtered tokens are never drawn
        tolerance = 4 * (p * (1 - p) / n).sqrt() + 1e-3
        assert ((freq - p.double()).abs() <= tolerance).all(), (settings, freq, p)


def test_a_rows_draw_ignores_the_other_rows():
    settings = GenerationSettings(do_sample=True, top_k=0)
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 2
    sampler = _row_seeded_sampler()(settings, [11, 22, 33, 44, 55, 66], 3)
    together = sampler(torch.zeros(6, 5, dtype=torch.long), logits.clone()).argmax(-1)
    for row in range(6):
        alone = _row_seeded_sampler()(settings, [11 * (row + 1)], 3)
        assert alone(torch.zeros(1, 5, dtype=torch.long), logits[row : row + 1].clone()).argmax(-1) == together[row]
    later = sampler(torch.zeros(6, 6, dtype=torch.long), logits.clone()).argmax(-1)  # the next step draws anew
    assert not torch.equal(later, together)


# -- the HF adapter -------------------------------------------------------------------------------------------


def test_sampled_answers_do_not_depend_on_batch_size_or_order(tiny):
    reqs = _reqs(HOT)
    one = _at_batch_size(tiny, 1, reqs)
    assert _at_batch_size(tiny, 4, reqs) == one
    assert _at_batch_size(tiny, 16, reqs) == one
    shuffled = reqs[7:] + reqs[:7]  # other batch mates, other positions
    assert _at_batch_size(tiny, 4, shuffled) == one[7:] + one[:7]
    assert len(set(one)) >= 15  # 20 prompts: the answers are drawn, not one degenerate string
    greedy = tiny.generate(_reqs(GenerationSettings(max_new_tokens=6, stop=())))
    assert sum(a != g for a, g in zip(one, greedy)) >= 10


def test_seeds_change_samples_and_nothing_else_does(tiny):
    torch.manual_seed(1)
    first = tiny.generate(_reqs(HOT))
    torch.manual_seed(2)  # the global RNG does not matter
    assert tiny.generate(_reqs(HOT)) == first
    other_seed = tiny.generate(_reqs(GenerationSettings(**{**HOT.__dict__, "seed": 1})))
    assert sum(a != b for a, b in zip(first, other_seed)) >= 10
    # the same prompt under another request id and in another request list: the same draws
    assert tiny.generate([GenerationRequest("elsewhere", PROMPTS[3], HOT)]) == [first[3]]


def test_sampled_first_tokens_follow_the_models_distribution(tiny):
    prompt = PROMPTS[0]
    settings = GenerationSettings(max_new_tokens=1, stop=(), do_sample=True, temperature=1.5, top_k=0)
    ids = tiny.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        p = (tiny.model(ids).logits[0, -1] / 1.5).softmax(-1)
    n = 400
    reqs = [GenerationRequest(f"s{k}", prompt, GenerationSettings(**{**settings.__dict__, "seed": k}))
            for k in range(n)]
    answers = tiny.generate(reqs)
    top = p.topk(3)
    for prob, token in zip(top.values.tolist(), top.indices.tolist()):
        text = tiny.tokenizer.decode([token]).lstrip()
        freq = sum(a == text for a in answers) / n
        assert abs(freq - prob) <= 4 * math.sqrt(prob * (1 - prob) / n) + 0.01, (text, freq, prob)


def test_greedy_is_hf_greedy(tiny):
    reqs = _reqs(GenerationSettings(max_new_tokens=6, stop=()), PROMPTS[:6])
    ours = _at_batch_size(tiny, 4, reqs)
    for req, answer in zip(reqs, ours):
        ids = tiny.tokenizer(req.prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = tiny.model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tiny.tokenizer.pad_token_id)
        assert answer == tiny.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).lstrip()


@pytest.mark.parametrize("extra", [{"num_beams": 3}, {"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.4},
                                   {"num_beams": 3, "length_penalty": 0.0}])
def test_beam_search_and_penalties_are_hfs_and_batch_independent(tiny, extra):
    settings = GenerationSettings(max_new_tokens=8, stop=(), **extra)
    reqs = _reqs(settings, PROMPTS[:8])
    one = _at_batch_size(tiny, 1, reqs)
    assert _at_batch_size(tiny, 4, reqs) == one
    for req, answer in zip(reqs[:3], one):
        ids = tiny.tokenizer(req.prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = tiny.model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tiny.tokenizer.pad_token_id,
                                      **extra)
        assert answer == tiny.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).lstrip()
    plain = tiny.generate(_reqs(GenerationSettings(max_new_tokens=8, stop=()), PROMPTS[:8]))
    assert one != plain  # the setting changed something
    if "no_repeat_ngram_size" in extra:
        for req, answer in zip(reqs, one):
            ids = tiny.tokenizer(req.prompt + answer).input_ids
            bigrams = list(zip(ids, ids[1:]))
            assert len(bigrams) - len(set(bigrams)) <= 1  # at most the prompt/answer seam re-tokenised


def test_beam_search_stops_at_stop_strings(tiny):
    free = tiny.generate(_reqs(GenerationSettings(max_new_tokens=8, stop=(), num_beams=3), PROMPTS[:8]))
    word = next(w for a in free for w in a.split() if len(w) > 2)[:2]
    cut = tiny.generate(_reqs(GenerationSettings(max_new_tokens=8, stop=(word,), num_beams=3), PROMPTS[:8]))
    assert all(word not in a for a in cut)
    assert any(word in a for a in free)


def test_checkpoint_generation_defaults_are_ignored(tiny_llama_dir, tmp_path, caplog):
    folder = tmp_path / "tiny_with_defaults"
    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    config.update(do_sample=True, temperature=0.6, top_p=0.9, repetition_penalty=1.5, num_beams=2)
    (folder / "generation_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="mmcomp_eval.models.decoding"):
        loaded = create_model("hf", {"pretrained": str(folder), "batch_size": 4})
    assert "repetition_penalty=1.5" in caplog.text and "temperature=0.6" in caplog.text
    assert "use_cache" not in caplog.text  # settings that cannot change an answer go without a word
    plain = create_model("hf", {"pretrained": str(tiny_llama_dir), "batch_size": 4})
    settings = GenerationSettings(max_new_tokens=6, stop=())
    assert loaded.generate(_reqs(settings, PROMPTS[:6])) == plain.generate(_reqs(settings, PROMPTS[:6]))


# -- settings, the task file and --gen-kwargs ------------------------------------------------------------------


def test_one_settings_type_with_one_set_of_defaults(tmp_path):
    import typing

    assert typing.get_type_hints(TaskConfig)["generation"] is GenerationSettings
    task = load_task_file(_task_file(tmp_path, ""))
    assert task.generation == GenerationSettings()
    assert GenerationSettings().max_new_tokens == 16 and GenerationSettings().top_k == 50
    nup = TaskIndex.build().tasks["compact_nup"]
    assert isinstance(nup.generation, GenerationSettings) and nup.generation.do_sample is False


def _task_file(tmp_path, generation: str):
    text = USER_TASK.replace('generation: {max_new_tokens: 4, stop: ["\\n"]}', generation)
    p = tmp_path / "t.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("generation, message", [
    ("generation: {seed: 3}", "generation.seed is not a task setting; the run's --seed/--seeds set it"),
    ("generation: {temperature: 0.7}", "temperature=0.7 only applies when sampling; add do_sample=true"),
    ("generation: {do_sample: true, num_beams: 2}", "beam-search sampling is not supported"),
    ("generation: {do_sample: true, temperature: 0}", "temperature=0.0: must be > 0 when sampling"),
    ("generation: {do_sample: true, top_p: 0}", "top_p=0.0: must be in (0, 1]"),
    ("generation: {max_new_tokens: 0}", "max_new_tokens=0: must be at least 1"),
    ("generation: {length_penalty: 0.0}", "length_penalty=0.0 only applies to beam search; add num_beams > 1"),
    ("generation: {top_q: 0.5}", "unknown key 'generation.top_q' (did you mean 'top_p'?)"),
])
def test_task_file_generation_errors(tmp_path, generation, message):
    with pytest.raises(UserError) as err:
        load_task_file(_task_file(tmp_path, generation))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_gen_kwargs_parse_like_model_args():
    parsed = parse_generation_overrides(parse_model_args('do_sample=True,top_p=0.9,top_k=0,stop="\\n",max_new_tokens=8',
                                                         flag="--gen-kwargs"))
    assert parsed == {"do_sample": True, "top_p": 0.9, "top_k": 0, "stop": ("\n",), "max_new_tokens": 8}
    assert type(parsed["top_k"]) is int and type(parsed["top_p"]) is float
    assert parse_generation_overrides(parse_model_args('{"stop": [".", "\\n"], "temperature": 1}')) == {
        "stop": (".", "\n"), "temperature": 1.0}
    for text, message in [("top_pp=0.9", "--gen-kwargs: unknown key 'top_pp' (did you mean 'top_p'?)"),
                          ("seed=1", "use --seed/--seeds"),
                          ("num_beams=two", "'num_beams' must be an integer, got 'two'"),
                          ("do_sample=maybe", "'do_sample' must be true or false")]:
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
            parse_generation_overrides(parse_model_args(text, flag="--gen-kwargs"))
    with pytest.raises(UserError, match="--gen-kwargs: unterminated"):
        parse_model_args('top_p="0.9', flag="--gen-kwargs")


def test_gen_kwargs_override_the_task_and_are_checked_with_it(tmp_path):
    task = load_task_file(_task_file(tmp_path, "generation: {do_sample: true, temperature: 0.6, top_p: 0.9}"))
    greedy = with_generation_overrides(task, {"do_sample": False})  # the task's sampling settings go with it
    assert greedy.generation == GenerationSettings()
    beams = with_generation_overrides(task, {"do_sample": False, "num_beams": 3})
    assert beams.generation.num_beams == 3
    with pytest.raises(UserError, match=r"task echo_task: generation do_sample=true with num_beams=3.*--gen-kwargs "
                                        r"num_beams=3 over"):
        with_generation_overrides(task, {"num_beams": 3})
    hotter = with_generation_overrides(task, {"temperature": 1.2, "max_new_tokens": 9})
    assert (hotter.generation.temperature, hotter.generation.top_p, hotter.generation.max_new_tokens) == (1.2, 0.9, 9)
    assert with_generation_overrides(task, {}) is task
    with pytest.raises(UserError, match="unknown key 'top_pp'"):  # library callers get the same checks
        RunOptions(gen_kwargs={"top_pp": 0.9}).validate()


def test_model_decoding_defaults_fill_only_what_task_and_gen_kwargs_leave(tmp_path):
    openflamingo = {"num_beams": 3, "length_penalty": 0.0}  # its evaluation's beam search
    task = load_task_file(_task_file(tmp_path, "generation: {max_new_tokens: 5}"))
    assert task.generation_keys == ("max_new_tokens",)
    filled, applied = with_model_generation_defaults(task, openflamingo, ())
    assert applied == openflamingo and filled.generation == GenerationSettings(max_new_tokens=5, num_beams=3,
                                                                               length_penalty=0.0)
    # a task file that names a field keeps it, even at the built-in default; the length penalty then has no beams
    greedy = load_task_file(_task_file(tmp_path, "generation: {num_beams: 1}"))
    assert with_model_generation_defaults(greedy, openflamingo, ()) == (greedy, {})
    # --gen-kwargs (already applied to the task) win the same way
    five = with_generation_overrides(task, {"num_beams": 5})
    assert with_model_generation_defaults(five, openflamingo, ("num_beams",))[1] == {"length_penalty": 0.0}
    # a task that samples gets no beams; Otter's no-repeat rule fits sampling and is kept
    sampled = load_task_file(_task_file(tmp_path, "generation: {do_sample: true, top_p: 0.9}"))
    otter = {"num_beams": 3, "no_repeat_ngram_size": 3}
    out, applied = with_model_generation_defaults(sampled, otter, ())
    assert applied == {"no_repeat_ngram_size": 3} and out.generation.num_beams == 1 and out.generation.do_sample
    # a TaskConfig built in Python: fields away from the built-in defaults count as set
    python_task = TaskConfig(**{**{f: getattr(task, f) for f in ("task", "dataset", "target_field", "prompt",
                                                                 "metrics")},
                                "generation": GenerationSettings(num_beams=2)})
    assert with_model_generation_defaults(python_task, openflamingo, ())[1] == {"length_penalty": 0.0}
    # a length penalty alone is fine for a model whose defaults bring the beams, and refused for one without
    penalised = with_generation_overrides(task, {"length_penalty": 0.5}, openflamingo)
    out, applied = with_model_generation_defaults(penalised, openflamingo, ("length_penalty",))
    assert applied == {"num_beams": 3} and (out.generation.num_beams, out.generation.length_penalty) == (3, 0.5)
    with pytest.raises(UserError, match="length_penalty"):
        with_generation_overrides(task, {"length_penalty": 0.5})


def test_bad_gen_kwargs_fail_before_the_model_loads(tmp_path, capsys):
    tasks = make_user_tasks(tmp_path)
    common = ["--model", "hf", "--model-args", f"pretrained={tmp_path / 'missing'}", "--tasks", "echo_task",
              "--include-path", str(tasks), "--no-progress", "--no-cache"]
    rc, _, err = run_cli(capsys, *common, "--gen-kwargs", "temperature=0.5")
    assert rc == 2 and err.count("\n") == 1
    assert "temperature=0.5 only applies when sampling; add do_sample=true" in err
    rc, _, err = run_cli(capsys, *common, "--gen-kwargs", "do_sample=true,temperature=0.5")
    assert rc == 2 and "does not exist" in err  # valid settings: now the model is what fails


# -- runs: results.json, seeds, resume ---------------------------------------------------------------------


WORDS12 = ["knife", "plate", "onion", "board", "pan", "spoon", "tap", "cup", "lid", "bowl", "fork", "jar"]


def _run(capsys, tiny_llama_dir, tasks, out, *more):
    rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}", "--tasks",
                         "echo_task", "--include-path", str(tasks), "--no-progress", "--output-path", str(out), *more)
    assert rc == 0, err
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return json.loads((out / "results.json").read_text()), rows


def test_sampled_run_resumes_to_the_uninterrupted_answers(tiny_llama_dir, tmp_path, capsys):
    tasks = make_user_tasks(tmp_path, WORDS12)
    sample = ["--gen-kwargs", "do_sample=true,temperature=1.5,top_k=0,max_new_tokens=5", "--seeds", "2"]
    whole, rows = _run(capsys, tiny_llama_dir, tasks, tmp_path / "whole", *sample, "--no-cache", "--batch-size", "16")
    store = ["--cache-dir", str(tmp_path / "store")]
    _run(capsys, tiny_llama_dir, tasks, tmp_path / "part", *sample, *store, "--limit", "5", "--batch-size", "1")
    resumed, resumed_rows = _run(capsys, tiny_llama_dir, tasks, tmp_path / "resumed", *sample, *store,
                                 "--batch-size", "4")
    assert resumed["cache"]["hits"] == 2 * 5 and resumed["cache"]["misses"] == 2 * 7  # 5 documents per seed stored
    assert [r["raw_output"] for r in resumed_rows] == [r["raw_output"] for r in rows]
    assert whole["config"]["gen_kwargs"] == {"do_sample": True, "temperature": 1.5, "top_k": 0, "max_new_tokens": 5}
    record = whole["tasks"]["echo_task"]["generation"]
    assert record["do_sample"] is True and record["temperature"] == 1.5 and record["max_new_tokens"] == 5
    assert record["top_k"] == 0 and record["top_p"] == 1.0 and record["stop"] == ["\n"]
    assert record["sampling_seed"].startswith("per request") and "seed" not in record
    by_seed = {s: [r["raw_output"] for r in rows if r["seed"] == s] for s in (0, 1)}
    assert by_seed[0] != by_seed[1]  # same prompts (sampler 'first'), other sampling seed
    assert [r["prompt"] for r in rows if r["seed"] == 0] == [r["prompt"] for r in rows if r["seed"] == 1]


def test_greedy_seeds_share_answers_of_identical_prompts(tiny_llama_dir, tmp_path, capsys):
    tasks = make_user_tasks(tmp_path, WORDS12)
    store = ["--cache-dir", str(tmp_path / "store"), "--seeds", "2"]
    result, rows = _run(capsys, tiny_llama_dir, tasks, tmp_path / "out", *store)
    assert result["cache"]["hits"] == 12  # seed 1's prompts equal seed 0's ('first' shots) and decoding is greedy
    assert result["tasks"]["echo_task"]["generation"]["sampling_seed"].startswith("none")
    assert result["config"]["gen_kwargs"] == {}


def test_requests_carry_the_seed_only_when_sampling(tmp_path):
    from mmcomp_eval.api.document import Document
    from mmcomp_eval.evaluation.prepare import PreparedTask
    from mmcomp_eval.tasks.loaders import DataContext
    from mmcomp_eval.tasks.outputs.generate import Generate
    from mmcomp_eval.tasks.prompting import RenderedPrompt

    task = load_task_file(_task_file(tmp_path, ""))
    doc = Document("d0", {"word": "a", "answer": "a"})
    prompts = {3: [RenderedPrompt("word: a =>", None, ())]}
    prepared = PreparedTask(task, "test", [doc], 0, None, prompts, {3: [[]]})
    reqs = Generate(task, DataContext()).requests(prepared, 3).requests
    assert reqs[0].settings == GenerationSettings()  # greedy: seed 0, whatever the run seed
    sampled = with_generation_overrides(task, {"do_sample": True})
    reqs = Generate(sampled, DataContext()).requests(PreparedTask(sampled, "test", [doc], 0, None, prompts, {3: [[]]}),
                                                     3).requests
    assert reqs[0].settings.seed == 3 and reqs[0].sampling_seed() != GenerationRequest(
        "x", "word: a =>", GenerationSettings(do_sample=True, seed=4)).sampling_seed()
    assert RunOptions().gen_kwargs == {}
