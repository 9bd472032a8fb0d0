"""Vision-language models end to end on synthetic EK-100 media: tiny random IDEFICS, OpenFlamingo and Otter.

Scores from random weights mean nothing; these tests check the paths: which
images reach the model and in what order (few-shot images included),
placeholder tokens, batching, keyframe caching, per-document media errors
and the checks that fail a run before any work.
"""

from __future__ import annotations

import json
import os

import pytest

from mmcomp_eval.api.model import ModelCapabilities
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.cli import main
from mmcomp_eval.errors import UserError
from mmcomp_eval.media import synthetic as S
from mmcomp_eval.media.video import DECODES
from mmcomp_eval.models import create_model
from mmcomp_eval.models.flamingo.checkpoint import remap_checkpoint
from mmcomp_eval.models.flamingo.prompt import END_OF_CHUNK, chunked
from mmcomp_eval.models.vlm import interleave, strip_placeholders
from mmcomp_eval.testing.tiny_models import random_tokenizer, save_random_flamingo, save_random_idefics

INSTRUCTION = "Predict the next narration given 3 sequential previous narrations from a cooking video"
TASK = """
task: {name}
dataset: {{name: jsonl, options: {{files: {{test: {docs}, train: {docs}}}}}}}
target_field: trg_narration
answer_kind: narration
prompt: {{template: compact_idefics.jinja, variants: {{otter: compact_otter.jinja}}, instruction: {instruction}}}
fewshot: {{sampler: first, k: 2}}
generation: {{max_new_tokens: 4, stop: ["\\n"]}}
metrics: [exact_match, bleu]
media: {{frames_root: {root}, videos_root: {root}, on_error: {on_error}}}
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Media (frames of P01_01, a video of P02_01), tasks over them, and tiny random checkpoints."""
    d = tmp_path_factory.mktemp("vlm")
    media = d / "media"
    S.write_frames(media, "P01_01", 120, video_index=1)
    S.write_video(media, "P02_01", 120, video_index=2)
    (media / "P08" / "videos").mkdir(parents=True)
    (media / "P08" / "videos" / "P08_01.MP4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x07" * 500)  # corrupt
    tasks = d / "tasks"
    tasks.mkdir()
    S.write_jsonl(tasks / "docs.jsonl", S.compact_docs(6, ["P01_01", "P02_01"]))
    broken = S.compact_docs(4, ["P01_01", "P02_01"]) + S.compact_docs(2, ["P07_01", "P08_01"], prefix="bad")
    S.write_jsonl(tasks / "broken.jsonl", broken)
    for name, docs, on_error in (("vlm_task", "docs.jsonl", "stop"), ("vlm_skip", "broken.jsonl", "skip"),
                                 ("vlm_stop", "broken.jsonl", "stop")):
        (tasks / f"{name}.yaml").write_text(TASK.format(name=name, docs=docs, instruction=INSTRUCTION,
                                                         root=str(media), on_error=on_error))
    corpus = S.corpus()
    models = {
        "idefics": save_random_idefics(d / "idefics", corpus),
        "of_mpt": save_random_flamingo(d / "of_mpt", corpus, "openflamingo", "mpt"),
        "of_neox": save_random_flamingo(d / "of_neox", corpus, "openflamingo", "gpt_neox", cross_attn_every_n_layers=2),
        "otter": save_random_flamingo(d / "otter", corpus, "otter", "llama"),
    }
    return {"dir": d, "media": media, "tasks": tasks, **models}


def _args(base: dict, extra: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in {**base, **extra}.items())


def idefics_args(env, **extra) -> str:
    return _args({"pretrained": env["idefics"], "dtype": "float32", "batch_size": 4}, extra)


def of_args(env, key="of_mpt", **extra) -> str:
    p = env[key]
    return _args({"checkpoint": p, "lang_encoder": p / "lang", "vision_encoder": p / "vision", "dtype": "float32",
                  "cross_attn_every_n_layers": 2 if key == "of_neox" else 1}, extra)


def run_cli(capsys, env, model, args, task, out=None, *more):
    argv = ["--model", model, "--model-args", args, "--tasks", task, "--include-path", str(env["tasks"]),
            "--no-progress", "--no-cache", *more]  # no response store: every answer comes from the model
    if out is not None:
        argv += ["--output-path", str(out)]
    rc = main(argv)
    _, err = capsys.readouterr()
    return rc, err


def error_lines(err: str) -> list[str]:
    """The CLI's error lines (transformers' loading progress bars also write to stderr)."""
    return [line for line in err.strip().splitlines() if line.startswith("mmcomp-eval: error:")]


def samples(out) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def solid(rgb):
    from PIL import Image

    return Image.new("RGB", (40, 30), rgb)


# -- IDEFICS ------------------------------------------------------------------------------------------------


def test_idefics_end_to_end_few_shot_images_in_order_and_cached(env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path / "cache"))
    before = DECODES.frames
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env), "vlm_task", tmp_path / "a")
    assert rc == 0, err
    first_decodes = DECODES.frames - before
    rows = samples(tmp_path / "a")
    assert len(rows) == 6
    d0 = rows[0]
    assert d0["shot_ids"] == ["d1", "d2"]
    # Fig. 7: one image after each narration, shots first, then the query -- 9 images, in this order
    assert d0["images"] == [f"{d}#{c}" for d in ("d1", "d2", "d0") for c in range(3)]
    assert d0["prompt"].count("<image>") == 9
    d1 = json.loads((env["tasks"] / "docs.jsonl").read_text().splitlines()[1])
    assert d0["prompt"].split("\n")[1] == (f"{d1['narrations'][0]} <image> . {d1['narrations'][1]} <image> . "
                                           f"{d1['narrations'][2]} <image> => {d1['trg_narration']}")
    task = json.loads((tmp_path / "a" / "results.json").read_text())["tasks"]["vlm_task"]
    assert task["n_skipped"] == 0 and task["skipped"] == []
    assert task["media"]["keyframes"] == 18 and task["media"]["cache_misses"] == 18
    assert task["media"]["frames_decoded"] == first_decodes > 0
    # second run: every keyframe comes from the cache, nothing is decoded, answers are identical
    before = DECODES.frames
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env, batch_size=1), "vlm_task", tmp_path / "b")
    assert rc == 0, err
    assert DECODES.frames == before
    again = json.loads((tmp_path / "b" / "results.json").read_text())["tasks"]["vlm_task"]["media"]
    assert again["cache_hits"] == 18 and again["frames_decoded"] == 0
    assert [r["raw_output"] for r in samples(tmp_path / "b")] == [r["raw_output"] for r in rows]


def test_idefics_prompt_assembly(env):
    model = create_model("idefics", idefics_args(env))
    assert model.capabilities == ModelCapabilities(images=True, reads_images=True, max_images=None,
                                                   reports_each_result=True)
    assert interleave("a <image> b <image>", ["I0", "I1"]) == ["a ", "I0", " b ", "I1"]
    with pytest.raises(UserError, match="2 <image> placeholders but 1 images"):
        interleave("a <image> b <image>", ["I0"])
    imgs = [[solid((250, 0, 0)), solid((0, 250, 0)), solid((0, 0, 250))], [solid((9, 9, 9))]]
    batch = model.encode(["take knife <image> . wash plate <image> . cut onion <image> =>", "open tap <image> =>"],
                         imgs)
    tok = model.processor.tokenizer
    image_id, fake_id = tok.convert_tokens_to_ids("<image>"), tok.convert_tokens_to_ids("<fake_token_around_image>")
    ids = batch["input_ids"]
    assert (ids == image_id).sum(dim=1).tolist() == [3, 1]
    assert ids[1, 0] == tok.pad_token_id and batch["attention_mask"][1, 0] == 0  # left padding
    row = ids[0].tolist()
    for pos in [k for k, t in enumerate(row) if t == image_id]:
        assert row[pos - 1] == fake_id and row[pos + 1] == fake_id
    # pixel rows follow the images, in order; the shorter row is padded with a zero image nobody attends to
    expected = model.processor.image_processor(imgs[0], return_tensors="pt")  # IDEFICS's returns the tensor
    expected = expected if hasattr(expected, "shape") else expected["pixel_values"]
    channel_means = {tuple(x.mean(dim=(1, 2)).round(decimals=3).tolist()) for x in expected}
    assert expected.shape[0] == 3 and len(channel_means) == 3  # three distinguishable images
    assert (batch["pixel_values"][0] - expected).abs().max() < 1e-6
    assert batch["pixel_values"][1, 1].abs().max() == 0
    mask = batch["image_attention_mask"]
    positions = [k for k, t in enumerate(row) if t == image_id]
    assert [int(mask[0, p].argmax()) for p in positions] == [0, 1, 2]
    assert mask[1, :, 1].sum() == 0  # no token of row 1 attends to the padding image
    text_only = create_model("idefics", idefics_args(env, images="false"))
    assert text_only.capabilities == ModelCapabilities(images=True, reads_images=False, max_images=None,
                                                       reports_each_result=True)
    assert strip_placeholders("take knife <image> . wash <image> =>") == "take knife . wash =>"
    req = GenerationRequest("r", "take knife <image> . wash <image> =>", images=("a#0", "a#1"))
    assert text_only._render(req) == "take knife . wash =>"
    assert (text_only.encode([text_only._render(req)], None)["input_ids"] == image_id).sum() == 0


def test_idefics_batching_seeds_and_images_matter(env):
    model = create_model("idefics", idefics_args(env))
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 20), (20, 220, 220)]
    prompts = [f"{v} knife <image> . wash plate <image> =>" for v in S.VERBS[:5]]
    prompts[2] = "open tap <image> =>"  # rows with different image counts share a batch
    greedy = GenerationSettings(max_new_tokens=5, stop=())
    reqs = [GenerationRequest(f"r{i}", p, greedy, images=tuple(f"d{i}#{c}" for c in range(p.count("<image>"))))
            for i, p in enumerate(prompts)]
    images = [[solid(colours[(i + c) % 5]) for c in range(len(r.images))] for i, r in enumerate(reqs)]
    model.batch_size = 1
    one = model.generate(reqs, images=images)
    model.batch_size = 5
    assert model.generate(reqs, images=images) == one
    swapped = [list(reversed(x)) if len(x) > 1 else [solid((0, 0, 0))] for x in images]
    assert model.generate(reqs, images=swapped) != one  # the images reach the model
    hot = GenerationSettings(max_new_tokens=5, stop=(), do_sample=True, temperature=2.0, top_k=0, seed=7)
    sampled = [GenerationRequest(r.request_id, r.prompt, hot, images=r.images) for r in reqs]
    drawn = model.generate(sampled, images=images)  # batch size 5
    model.batch_size = 1
    assert model.generate(sampled, images=images) == drawn  # each request draws from its own stream
    assert model.generate(sampled[2:], images=images[2:]) == drawn[2:]
    assert drawn != one
    other = [GenerationRequest(r.request_id, r.prompt, GenerationSettings(**{**hot.__dict__, "seed": 8}),
                               images=r.images) for r in reqs]
    assert model.generate(other, images=images) != drawn
    beams = [GenerationRequest(r.request_id, r.prompt, GenerationSettings(max_new_tokens=5, stop=(), num_beams=3),
                               images=r.images) for r in reqs]
    alone = model.generate(beams, images=images)
    model.batch_size = 5
    assert model.generate(beams, images=images) == alone and alone != one
    with pytest.raises(UserError, match="got prompts with images but no image data"):
        model.generate(reqs)


def test_vlm_auto_batch_size_backs_off_and_reports_each_answer(env):
    """The local-adapter loop serves VLMs too: batch_size=auto, out-of-memory back-off, one on_result per request."""
    import torch

    model = create_model("idefics", idefics_args(env, batch_size="auto", max_batch_size=8))
    assert model.batch_size == "auto"
    greedy = GenerationSettings(max_new_tokens=4, stop=())
    prompts = [f"{v} {n} <image> =>" for v, n in zip(S.VERBS, S.NOUNS)] + ["take knife <image> . cut onion <image> =>"]
    reqs = [GenerationRequest(f"r{i}", p, greedy, images=tuple(f"d{i}#{c}" for c in range(p.count("<image>"))))
            for i, p in enumerate(prompts)]
    images = [[S.frame_image(i + 1, 10 * c + 5) for c in range(len(r.images))] for i, r in enumerate(reqs)]
    rows_run = []
    generate_batch = model._generate_batch

    def at_most_three_rows(prompts, *args):
        if len(prompts) > 3:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory: {len(prompts)} rows")
        rows_run.append(len(prompts))
        return generate_batch(prompts, *args)

    model._generate_batch = at_most_three_rows
    reported = {}
    answers = model.generate(reqs, images=images, on_result=lambda i, a: reported.setdefault(i, a))
    assert reported == dict(enumerate(answers))  # every answer reported once, under its request's index
    assert max(rows_run) == 3 and sum(rows_run) == len(reqs)  # backed off to what fits; each request run once
    model._generate_batch = generate_batch
    model.batch_size = 1
    assert model.generate(reqs, images=images) == answers
    one_image = create_model("idefics", idefics_args(env, max_images=1))
    with pytest.raises(UserError, match=f"request r{len(reqs) - 1} has 2 images; model 'idefics' takes at most 1"):
        one_image.generate(reqs, images=images)


def test_text_only_evaluation_reads_no_frames(env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path / "cache"))
    before = DECODES.frames
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env, images="false"), "vlm_task", tmp_path / "out")
    assert rc == 0, err
    assert DECODES.frames == before and not (tmp_path / "cache" / "keyframes").exists()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["model"]["fingerprint"]["images"] is False
    assert "media" not in results["tasks"]["vlm_task"] and results["tasks"]["vlm_task"]["n_skipped"] == 0


# -- media errors and bad input -----------------------------------------------------------------------------


def test_unreadable_media_skip_counts_documents(env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path / "cache"))
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env), "vlm_skip", tmp_path / "out")
    assert rc == 0, err
    task = json.loads((tmp_path / "out" / "results.json").read_text())["tasks"]["vlm_skip"]
    assert task["n_documents"] == 4 and task["n_skipped"] == 2
    reasons = {s["doc_id"]: s["reason"] for s in task["skipped"]}
    assert reasons["bad0"].startswith("no frames for video P07_01")
    assert "P08_01.MP4" in reasons["bad1"] and "cannot be opened" in reasons["bad1"]
    assert [r["doc_id"] for r in samples(tmp_path / "out")] == ["d0", "d1", "d2", "d3"]


def test_unreadable_media_stop_is_one_line(env, capsys):
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env), "vlm_stop")
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("mmcomp-eval: error: task vlm_stop, document bad0: no frames for video P07_01")


def test_bad_input_fails_before_any_work(env, tmp_path, capsys):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok, _ = random_tokenizer(S.corpus())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path / "llm")
    tok.save_pretrained(tmp_path / "llm")
    before = DECODES.frames
    rc, err = run_cli(capsys, env, "hf", f"pretrained={tmp_path / 'llm'}", "vlm_task")
    assert rc == 2 and len(error_lines(err)) == 1
    assert "puts 9 images in its prompts but model 'hf' is text-only" in err
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env, max_images=4), "vlm_task")
    assert rc == 2 and "prompts hold up to 9 images but model 'idefics' takes at most 4; use fewer shots" in err
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env, load_in_4bit="true"), "vlm_task")
    assert rc == 2 and "needs CUDA" in err and len(error_lines(err)) == 1
    assert DECODES.frames == before  # not one frame decoded


def test_idefics_chat_turns_with_images(env, tmp_path, capsys, monkeypatch):
    """--apply-chat-template on the keyframe task: IDEFICS-instruct's User:/Assistant: turns, images kept in order."""
    from mmcomp_eval.tasks.index import BUILTIN_PROMPTS
    from mmcomp_eval.tasks.prompting import PromptTemplate
    from mmcomp_eval.api.document import Document

    docs = [Document(d["id"], d) for d in S.compact_docs(3, ["P01_01"])]
    rendered = PromptTemplate(BUILTIN_PROMPTS / "compact_idefics.jinja").render(docs[0], docs[1:], "Predict.",
                                                                                 chat=True)
    model = create_model("idefics", idefics_args(env))
    req = GenerationRequest("r", rendered.text, messages=rendered.messages,
                            images=tuple(f"{i.doc_id}#{i.clip}" for i in rendered.images))

    def turn(d):
        n = d.fields["narrations"]
        return f"{n[0]} <image> . {n[1]} <image> . {n[2]} <image> =>"

    eou = "<end_of_utterance>"
    assert model._render(req) == "".join([
        "Predict.\n",
        f"User: {turn(docs[1])}{eou}\nAssistant: {docs[1].fields['trg_narration']}{eou}\n",
        f"User: {turn(docs[2])}{eou}\nAssistant: {docs[2].fields['trg_narration']}{eou}\n",
        f"User: {turn(docs[0])}{eou}\nAssistant:"])
    assert [(i.doc_id, i.clip) for i in rendered.images] == [(d.id, c) for d in (docs[1], docs[2], docs[0])
                                                             for c in range(3)]
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path / "cache"))
    rc, err = run_cli(capsys, env, "idefics", idefics_args(env), "vlm_task", tmp_path / "chat", "--apply-chat-template")
    assert rc == 0, err
    row = samples(tmp_path / "chat")[0]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert sum(m["content"].count("<image>") for m in row["messages"]) == len(row["images"]) == 9


def test_idefics_never_generates_image_tokens(env):
    """bad_words_ids for <image> and <fake_token_around_image>, as IDEFICS's model card passes them."""
    import torch

    from mmcomp_eval.models.idefics import IdeficsAdapter
    from mmcomp_eval.testing.tiny_models import random_idefics

    model, processor = random_idefics(S.corpus())
    banned = processor.tokenizer(["<image>", "<fake_token_around_image>"], add_special_tokens=False).input_ids
    with torch.no_grad():  # make the two tokens the likeliest next tokens almost everywhere
        for (token,) in banned:
            model.lm_head.additional_fc.weight[token - model.config.vocab_size] *= 60
    adapter = IdeficsAdapter.from_loaded(model, processor)
    assert adapter.bad_words_ids == banned and adapter.fingerprint()["bad_words"] == ["<image>",
                                                                                     "<fake_token_around_image>"]
    prompts = [f"{v} knife <image> =>" for v in S.VERBS[:4]]
    reqs = [GenerationRequest(f"r{i}", p, GenerationSettings(max_new_tokens=6, stop=()), images=(f"d{i}#0",))
            for i, p in enumerate(prompts)]
    images = [[S.frame_image(i + 1, 7)] for i in range(4)]
    answers = adapter.generate(reqs, images=images)
    free = []
    for prompt, imgs, answer in zip(prompts, images, answers):
        batch = {k: v for k, v in adapter.encode([prompt], [imgs]).items()}
        width = batch["input_ids"].shape[1]
        eos = sorted(adapter.eos_ids)
        with torch.no_grad():
            kept = model.generate(**batch, max_new_tokens=6, do_sample=False, eos_token_id=eos, bad_words_ids=banned)
            unconstrained = model.generate(**batch, max_new_tokens=6, do_sample=False, eos_token_id=eos)
        assert answer == adapter.tokenizer.decode(kept[0, width:], skip_special_tokens=True).strip()
        assert not {t for (t,) in banned} & set(kept[0, width:].tolist())
        free += unconstrained[0, width:].tolist()
    assert {t for (t,) in banned} & set(free)  # without the ban the model would have produced them


# -- OpenFlamingo and Otter ---------------------------------------------------------------------------------


def test_flamingo_prompt_conventions(env):
    model = create_model("open_flamingo", of_args(env))
    text = "Predict.\na <image> . b <image> => c\nd <image> => e\nf <image> =>"
    eoc = END_OF_CHUNK
    assert chunked(text) == f"Predict.\na <image> . b <image> => c{eoc}d <image> => e{eoc}f <image> =>"
    req = GenerationRequest("r", text, images=("x#0", "x#1", "x#2", "x#3"))
    enc = model.encode([model._render(req)], [[solid((k * 50, 0, 0)) for k in range(4)]])
    ids = enc["input_ids"][0].tolist()
    assert ids.count(model.tokenizer.convert_tokens_to_ids("<image>")) == 4 and enc["counts"] == [4]
    assert ids.count(model.eoc_id) == 2
    assert model.eoc_id in model.eos_ids and enc["pixel_values"].shape[0] == 4
    with pytest.raises(UserError, match="has 4 <image> tokens but 3 images"):
        model.encode([model._render(req)], [[solid((0, 0, 0))] * 3])


@pytest.mark.parametrize("key", ["of_mpt", "of_neox"])
def test_open_flamingo_batching_and_images(env, key):
    model = create_model("open_flamingo", of_args(env, key))
    greedy = GenerationSettings(max_new_tokens=4, stop=())
    prompts = ["take knife <image> . wash plate <image> =>", "open tap <image> =>",
               "cut onion <image> . stir pan <image> =>"]
    reqs = [GenerationRequest(f"r{i}", p, greedy, images=tuple(f"x#{c}" for c in range(p.count("<image>"))))
            for i, p in enumerate(prompts)]
    images = [[S.frame_image(i + 1, 40 * c + 3) for c in range(len(r.images))] for i, r in enumerate(reqs)]
    model.batch_size = 1
    one = model.generate(reqs, images=images)
    model.batch_size = 3
    assert model.generate(reqs, images=images) == one
    other = [list(reversed(x)) if len(x) > 1 else [S.frame_image(7, 77)] for x in images]
    assert model.generate(reqs, images=other) != one  # the images reach the model
    text_only = create_model("open_flamingo", of_args(env, key, images="false"))
    assert len(text_only.generate(reqs)) == 3
    # beam search (OpenFlamingo's own evaluation decodes with beams) and sampling, independent of the batch
    for settings in (GenerationSettings(max_new_tokens=4, stop=(), num_beams=3),
                     GenerationSettings(max_new_tokens=4, stop=(), do_sample=True, temperature=2.0, top_k=0)):
        asked = [GenerationRequest(r.request_id, r.prompt, settings, images=r.images) for r in reqs]
        model.batch_size = 1
        alone = model.generate(asked, images=images)
        model.batch_size = 3
        assert model.generate(asked, images=images) == alone, settings
        assert alone != one, settings


def test_flamingo_and_otter_through_the_cli(env, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path / "cache"))
    for model, args in (("open_flamingo", of_args(env, batch_size=3)),
                        ("otter", f"checkpoint={env['otter']},dtype=float32,batch_size=3")):
        out = tmp_path / model
        rc, err = run_cli(capsys, env, model, args, "vlm_task", out)
        assert rc == 0, err
        rows = samples(out)
        assert len(rows) == 6 and rows[0]["images"] == [f"{d}#{c}" for d in ("d1", "d2", "d0") for c in range(3)]
        results = json.loads((out / "results.json").read_text())
        fp = results["model"]["fingerprint"]
        assert fp["format"] == ("otter" if model == "otter" else "openflamingo") and fp["loaded"]["loaded"] > 0
        # each model's own decoding where the task is silent (it sets max_new_tokens and stop), Otter's own format
        task = results["tasks"]["vlm_task"]
        own = ({"generation": {"num_beams": 3, "no_repeat_ngram_size": 3}, "prompt_variant": "otter"}
               if model == "otter" else {"generation": {"num_beams": 3, "length_penalty": 0.0}, "prompt_variant": None})
        assert task["model_defaults"] == own
        assert {k: task["generation"][k] for k in own["generation"]} == own["generation"]
        assert ("GPT:<answer>" in rows[0]["prompt"]) == (model == "otter")


def test_flamingo_checkpoint_names_and_errors(env, tmp_path, capsys):
    state = {"perceiver.latents": 1, "lang_encoder.gated_cross_attn_layers.3.attn_gate": 2,
             "lang_encoder.transformer.blocks.3.gated_cross_attn_layer.ff_gate": 3,
             "lang_encoder.transformer.blocks.3.decoder_layer.attn.Wqkv.weight": 4,
             "lang_encoder.old_decoder_blocks.3.attn.Wqkv.weight": 5, "lang_encoder.transformer.wte.weight": 6,
             "vision_encoder.vision_model.post_layernorm.weight": 7}
    mapped, dropped = remap_checkpoint(state, "transformer.blocks")
    assert mapped == {"perceiver.latents": 1, "gated_cross_attn_layers.3.attn_gate": 2,
                      "gated_cross_attn_layers.3.ff_gate": 3, "lang_encoder.transformer.blocks.3.attn.Wqkv.weight": 4,
                      "lang_encoder.transformer.wte.weight": 6, "vision_encoder.vision_model.post_layernorm.weight": 7}
    assert dropped == ["lang_encoder.old_decoder_blocks.3.attn.Wqkv.weight"]
    with pytest.raises(UserError, match="open_clip vision weight"):
        remap_checkpoint({"vision_encoder.transformer.resblocks.0.ln_1.weight": 0}, "model.layers")
    # a checkpoint trained with cross-attention every layer does not fit a model built with every 2nd
    rc, err = run_cli(capsys, env, "open_flamingo", of_args(env, cross_attn_every_n_layers=2), "vlm_task")
    assert rc == 2 and len(error_lines(err)) == 1 and "weights do not fit this model" in err
    rc, err = run_cli(capsys, env, "otter", f"checkpoint={tmp_path / 'nowhere'}", "vlm_task")
    assert rc == 2 and "does not exist" in err
    rc, err = run_cli(capsys, env, "open_flamingo", f"checkpoint={env['of_mpt']}", "vlm_task")
    assert rc == 2 and "needs --model-args lang_encoder=" in err


def test_flamingo_identity_covers_every_part_and_its_format(env, tmp_path, capsys):
    """The store must not hand one model's answers to another: LM, vision tower, tokenizer and format all count."""
    from mmcomp_eval.models.flamingo.adapter import FlamingoAdapter, OtterAdapter

    a = create_model("open_flamingo", of_args(env))
    fp = a.fingerprint()
    assert fp["sources"]["lang_encoder"]["given"] == str(env["of_mpt"] / "lang")
    assert fp["sources"]["vision_encoder"]["weights_stat"] and fp["sources"]["checkpoint"]["weights_stat"]
    # the same checkpoint.pt over another language model is another model
    twin = save_random_flamingo(tmp_path / "of_mpt_seed1", S.corpus(), "openflamingo", "mpt", seed=1)
    other = create_model("open_flamingo", of_args(env, lang_encoder=twin / "lang"))
    assert other.fingerprint()["sources"]["lang_encoder"] != fp["sources"]["lang_encoder"]
    # the weights' format, not the adapter's name, picks the original decoding and prompt
    assert FlamingoAdapter.defaults_for({"checkpoint_format": "otter"}) == OtterAdapter.defaults
    assert OtterAdapter.defaults_for({"checkpoint_format": "openflamingo"}) == FlamingoAdapter.defaults
    otter_via_of = create_model("open_flamingo", f"checkpoint={env['otter']},checkpoint_format=otter,dtype=float32")
    assert otter_via_of.defaults == OtterAdapter.defaults
    # a folder of another architecture as the vision tower is refused, not loaded as a random CLIP
    with pytest.raises(UserError, match="is not a CLIP vision checkpoint"):
        create_model("open_flamingo", of_args(env, vision_encoder=env["idefics"]))


def test_local_folders_written_over_and_unnamed_models_in_memory(env, tmp_path):
    import shutil

    from mmcomp_eval.evaluation.evaluate import evaluate
    from mmcomp_eval.models.idefics import IdeficsAdapter

    folder = tmp_path / "idefics"
    shutil.copytree(env["idefics"], folder)
    before = create_model("idefics", idefics_args(env, pretrained=folder)).fingerprint()["weights_stat"]
    weights = next(folder.glob("*.safetensors"))
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # written over by a later training run
    assert create_model("idefics", idefics_args(env, pretrained=folder)).fingerprint()["weights_stat"] != before
    # a model handed over in memory without a name: its answers are computed, never stored
    loaded = create_model("idefics", idefics_args(env))
    unnamed = IdeficsAdapter.from_loaded(loaded.model, loaded.processor)
    run = dict(include_paths=[env["tasks"]], limit=2, cache_dir=tmp_path / "store", progress=False)
    first = evaluate(unnamed, ["vlm_task"], **run)
    assert first["cache"]["enabled"] is False
    named = IdeficsAdapter.from_loaded(loaded.model, loaded.processor, pretrained="my-idefics-run-3")
    assert evaluate(named, ["vlm_task"], **run)["cache"]["misses"] == 2
