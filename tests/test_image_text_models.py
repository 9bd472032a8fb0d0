"""The ``hf_vlm`` adapter on tiny random Idefics2, Idefics3 (SmolVLM's layout), LLaVA, LLaVA-NeXT and Qwen2-VL models.

Scores from random weights mean nothing; these tests check the paths: where
each family's chat template puts the images, that they reach the model in
prompt order (the adapter's answer equals the model called directly on the
interleaved inputs), that a batch does not change an answer (greedy and
seeded sampling), that images change it, text-only runs, the argument checks
and the Fig. 7 keyframe task through the CLI on synthetic frames.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from mmcomp_eval.api.request import ChatMessage, GenerationRequest, GenerationSettings
from mmcomp_eval.cli import main
from mmcomp_eval.errors import UserError
from mmcomp_eval.media import synthetic as S
from mmcomp_eval.models import create_model, decoding
from mmcomp_eval.models.image_text import ImageTextAdapter
from mmcomp_eval.testing.tiny_image_text import random_image_text, save_random_image_text

FAMILIES = ("idefics2", "idefics3", "llava", "llava_next", "qwen2_vl")
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
TASK = """
task: {name}
dataset: {{name: jsonl, options: {{files: {{test: {docs}, train: {docs}}}}}}}
target_field: trg_narration
answer_kind: narration
prompt: {{template: compact_idefics.jinja, instruction: Predict the next narration.}}
fewshot: {{sampler: first, k: 2}}
generation: {{max_new_tokens: 4, stop: ["\\n"]}}
metrics: [exact_match, bleu]
media: {{frames_root: {root}, videos_root: {root}}}
"""
#: one shot and a query in the layout of Fig. 7 (compact_idefics.jinja)
FIG7 = "Predict.\ntake knife <image> . wash plate <image> => cut onion\nopen tap <image> . stir pan <image> =>"
#: what each family's chat template makes of FIG7 as one user turn (``{i}``: the image markup)
EXPECTED_TEXT = {
    "idefics2": "User: {fig7}<end_of_utterance>\nAssistant:",
    "idefics3": "<|im_start|>User: {fig7}<end_of_utterance>\nAssistant:",
    "llava": "USER: {fig7} ASSISTANT:",
    "llava_next": "[INST] {fig7} [/INST]",
    "qwen2_vl": ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{fig7}<|im_end|>\n"
                 "<|im_start|>assistant\n"),
}
MARKUP = {"idefics2": "<image>", "idefics3": "<image>", "llava": "<image>", "llava_next": "<image>",
          "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>"}
GREEDY = GenerationSettings(max_new_tokens=5, stop=())


@pytest.fixture(scope="module")
def tiny():
    """family -> (model, processor), built once; adapters wrap them without copying."""
    return {family: random_image_text(family, S.corpus()) for family in FAMILIES}


def adapter(tiny, family, **options) -> ImageTextAdapter:
    model, processor = tiny[family]
    return ImageTextAdapter.from_loaded(model, processor, **{"batch_size": 4, **options})


def requests(prompts, settings=GREEDY):
    return [GenerationRequest(f"r{i}", p, settings, images=tuple(f"d{i}#{c}" for c in range(p.count("<image>"))))
            for i, p in enumerate(prompts)]


def frames(reqs):
    return [[S.frame_image(i + 1, 10 * c + 5) for c in range(len(r.images))] for i, r in enumerate(reqs)]


@pytest.mark.parametrize("family", FAMILIES)
def test_images_reach_the_model_where_the_placeholders_were(tiny, family):
    model = adapter(tiny, family)
    assert model.slots.placement == ("inline" if family.startswith("llava") else "content_parts")
    req = requests([FIG7])[0]
    text = model._encode(req).value
    assert text == EXPECTED_TEXT[family].format(fig7=FIG7.replace("<image>", MARKUP[family]))
    # the answer equals the model's own on the interleaved inputs, built here without the adapter
    imgs = frames([req])[0]
    processor, hf_model = model.processor, model.model
    special = not text.startswith(processor.tokenizer.bos_token)
    direct = processor(text=[text], images=[imgs], return_tensors="pt", add_special_tokens=special)
    width = direct["input_ids"].shape[1]
    out = hf_model.generate(**direct, max_new_tokens=5, do_sample=False, pad_token_id=processor.tokenizer.pad_token_id)
    expected = decoding.decode_new(processor.tokenizer, out[:, width:], model.eos_ids, ())
    assert model.generate([req], images=[imgs]) == expected
    # the same images in another order give another answer: order reaches the model
    assert model.generate([req], images=[imgs[::-1]]) != expected


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_invariance_sampling_and_images_matter(tiny, family):
    model = adapter(tiny, family)
    prompts = [FIG7, "open tap <image> =>", "cut onion <image> . stir pan <image> . pour oil <image> =>", "wash pan =>"]
    reqs = requests(prompts)
    images = frames(reqs)
    model.batch_size = 1
    one = model.generate(reqs, images=images)
    model.batch_size = 4
    assert model.generate(reqs, images=images) == one  # rows with 4, 1, 3 and 0 images in one batch
    swapped = [[S.frame_image(9, 99)] + row[1:] if row else row for row in images]
    changed = model.generate(reqs, images=swapped)
    assert [a != b for a, b in zip(changed, one)] == [True, True, True, False]  # only rows with images change
    hot = GenerationSettings(max_new_tokens=5, stop=(), do_sample=True, temperature=2.0, top_k=0, seed=7)
    sampled = requests(prompts, hot)
    drawn = model.generate(sampled, images=images)
    model.batch_size = 1
    assert model.generate(sampled, images=images) == drawn  # each request draws from its own stream
    assert model.generate(sampled[1:], images=images[1:]) == drawn[1:]
    assert drawn != one
    reseeded = requests(prompts, GenerationSettings(**{**hot.__dict__, "seed": 8}))
    assert model.generate(reseeded, images=images) != drawn


@pytest.mark.parametrize("family", ["idefics3", "llava"])
def test_text_only_and_chat_turns(tiny, family):
    model = adapter(tiny, family, images=False)
    assert not model.capabilities.reads_images and model.fingerprint()["images"] is False
    req = requests([FIG7])[0]
    text = model._encode(req).value
    assert "<image>" not in text and "take knife . wash plate => cut onion" in text
    batch = model.encode([text], None)
    assert "pixel_values" not in batch
    assert len(model.generate([req])) == 1  # image references, no image data: a text-only run
    # --apply-chat-template: shots as user/assistant turns, each turn's images in place
    chat = adapter(tiny, family)
    turns = (ChatMessage("system", "Predict."), ChatMessage("user", "take knife <image> . wash plate <image> =>"),
             ChatMessage("assistant", "cut onion"), ChatMessage("user", "open tap <image> =>"))
    prompt = "Predict.\ntake knife <image> . wash plate <image> => cut onion\nopen tap <image> =>"
    req = GenerationRequest("c", prompt, GREEDY, messages=turns, images=("a#0", "a#1", "b#0"))
    text = chat._encode(req).value
    if family == "idefics3":
        assert text == ("<|im_start|>System: Predict.<end_of_utterance>\nUser: take knife <image> . wash plate <image> "
                        "=><end_of_utterance>\nAssistant: cut onion<end_of_utterance>\nUser: open tap <image> =>"
                        "<end_of_utterance>\nAssistant:")
    else:
        assert text == ("Predict. USER: take knife <image> . wash plate <image> => ASSISTANT: cut onion "
                        "USER: open tap <image> => ASSISTANT:")
    assert len(chat.generate([req], images=[[S.frame_image(1, k) for k in (1, 2, 3)]])) == 1


def test_raw_format_image_budget_and_errors(tiny, tmp_path):
    from transformers import LlamaConfig

    folder = save_random_image_text(tmp_path / "idefics3", "idefics3", S.corpus())
    tiled = create_model("hf_vlm", f"pretrained={folder},dtype=float32")
    single = create_model("hf_vlm", f"pretrained={folder},dtype=float32,image_splitting=false,prompt_format=raw")
    shrunk = create_model("hf_vlm", f"pretrained={folder},dtype=float32,image_longest_edge=32")
    req = requests(["open tap <image> =>"])[0]
    img = [[S.frame_image(1, 5)]]  # 64x48: 2x2 tiles of 4 tokens plus a global view, or the global view alone
    image_id = tiled.tokenizer.convert_tokens_to_ids("<image>")
    for model, tokens in ((tiled, 20), (single, 4), (shrunk, 4)):  # shrunk to one tile: nothing to split
        ids = model.encode([model._encode(req).value], img)["input_ids"]
        assert int((ids == image_id).sum()) == tokens
    assert single._encode(req).value == "open tap <image> =>"  # raw: the prompt as written
    assert single.fingerprint()["image_arguments"] == {"image_splitting": False}
    with pytest.raises(UserError, match="prompt_format=raw sends the prompt text as it is"):
        single._encode(GenerationRequest("c", "x", messages=(ChatMessage("user", "x"),)))
    with pytest.raises(UserError, match="image_splitting applies to Idefics2, Idefics3, SmolVLM processors; "
                                        "'<in memory>' is a llava model"):
        adapter(tiny, "llava", image_splitting=False)
    with pytest.raises(UserError, match="image arguments apply when a processor is loaded"):
        adapter(tiny, "idefics3", image_splitting=False)
    with pytest.raises(UserError, match="prompt_format='plain' is not one of chat, raw"):
        adapter(tiny, "llava", prompt_format="plain")
    with pytest.raises(UserError, match="request r0: the prompt holds 1 <image> placeholders but 2 images"):
        tiled._encode(GenerationRequest("r0", "open tap <image> =>", images=("a#0", "a#1")))
    (folder / "chat_template.jinja").unlink()  # a base checkpoint: no chat template
    with pytest.raises(UserError, match="has no chat template; add --model-args prompt_format=raw"):
        create_model("hf_vlm", f"pretrained={folder}")
    LlamaConfig(hidden_size=32, num_hidden_layers=1).save_pretrained(tmp_path / "llama")
    with pytest.raises(UserError, match="is a llama model, which transformers' AutoModelForImageTextToText does not"):
        create_model("hf_vlm", f"pretrained={tmp_path / 'llama'}")  # refused from its config.json alone
    small = create_model("hf_vlm", f"pretrained={folder},dtype=float32,max_length=40,prompt_format=raw")
    n = small.encode([small._encode(req).value], img)["input_ids"].shape[1]  # the image tokens count too
    assert n + 5 > 40 and small.fingerprint()["image_placement"] == "inline"
    with pytest.raises(UserError, match=f"request r0: the prompt has {n} tokens and max_new_tokens is 5, more "
                                        "than the model's 40; use fewer shots"):
        small.generate([req], images=img)


def test_qwen2_vl_from_a_folder(tmp_path):
    """Qwen2-VL's processor needs torchvision (transformers builds its video processor): loaded, or one clear line."""
    folder = save_random_image_text(tmp_path / "qwen2_vl", "qwen2_vl", S.corpus())
    args = f"pretrained={folder},dtype=float32,max_pixels=784"
    if not HAS_TORCHVISION:
        with pytest.raises(UserError, match=r"needs torchvision, which is not installed: pip install torchvision"):
            create_model("hf_vlm", args)
        return
    model = create_model("hf_vlm", args)
    req = requests(["open tap <image> =>"])[0]
    batch = model.encode([model._encode(req).value], [[S.frame_image(1, 5)]])
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2]]  # capped at 784 pixels: one token
    assert int((batch["input_ids"] == model.processor.image_token_id).sum()) == 1


def test_keyframe_task_through_the_cli(tmp_path, capsys, monkeypatch):
    """Fig. 7 on synthetic frames: 2 shots and the query, 9 keyframes in prompt order, with and without images."""
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(tmp_path / "cache"))
    media, tasks = tmp_path / "media", tmp_path / "tasks"
    S.write_frames(media, "P01_01", 120, video_index=1)
    S.write_video(media, "P02_01", 120, video_index=2)
    tasks.mkdir()
    S.write_jsonl(tasks / "docs.jsonl", S.compact_docs(4, ["P01_01", "P02_01"]))
    (tasks / "fig7.yaml").write_text(TASK.format(name="fig7", docs="docs.jsonl", root=str(media)))
    llava = save_random_image_text(tmp_path / "llava", "llava", S.corpus())
    for args, chat, out in ((f"pretrained={llava},dtype=float32,batch_size=3", [], tmp_path / "vl"),
                            (f"pretrained={llava},dtype=float32,images=false", [], tmp_path / "l"),
                            (f"pretrained={llava},dtype=float32", ["--apply-chat-template"], tmp_path / "chat")):
        rc = main(["--model", "hf_vlm", "--model-args", args, "--tasks", "fig7", "--include-path", str(tasks),
                   "--no-progress", "--no-cache", "--output-path", str(out), *chat])
        _, err = capsys.readouterr()
        assert rc == 0, err
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and rows[0]["shot_ids"] == ["d1", "d2"]
        assert rows[0]["images"] == [f"{d}#{c}" for d in ("d1", "d2", "d0") for c in range(3)]
        results = json.loads((out / "results.json").read_text())
        fingerprint = results["model"]["fingerprint"]
        assert fingerprint["model_type"] == "llava" and fingerprint["image_placement"] == "inline"
        task = results["tasks"]["fig7"]
        if "images=false" in args:
            assert fingerprint["images"] is False and "media" not in task
        else:
            assert task["media"]["keyframes"] == 12 and task["n_skipped"] == 0
