"""Every built-in prompt, rendered in full through the task that uses it.

Each built-in task is prepared by the evaluator (its instruction, template,
shots and chat turns, as a run would build them) on fixed CompAct documents
and compared with the whole expected text: the instruction line, each shot's
``input => answer`` line, and the query. A template that drops its
instruction, a shot or the answer filter, or a task file whose instruction
changes, fails here. Only the dataset is swapped for the fixed documents.
Chat turns are checked the same way, image templates included (their chat
rendering used to fail: ``image()`` did not recognise the shots' copies).
Prompt variants (``prompt.variants``, e.g. Otter's format of the keyframe
task) are checked through a model that declares the variant.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from mmcomp_eval.api.model import Model, ModelCapabilities, ModelDefaults
from mmcomp_eval.evaluation.prepare import RunOptions, prepare
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER as IMG
from mmcomp_eval.config.task_config import DatasetConfig
from mmcomp_eval.tasks.index import BUILTIN_PROMPTS, TaskIndex


def compact_doc(doc_id, narrations, trg_verb, trg_noun, verbs, nouns):
    return {"id": doc_id, "narrations": narrations, "trg_narration": narrations[3], "trg_verb": trg_verb,
            "trg_noun": trg_noun, "verbs": verbs, "nouns": nouns}


# shaped like the CompAct build's documents (multiword atoms joined with "_")
SHOT_A = compact_doc("P01_01_12-13-14-15", ["put down vegetables", "open cupboard", "take cutting board",
                                            "put down cutting board"], "put_down", "cutting_board",
                     ["put_down", "open", "take", "put_down"], ["vegetable", "cupboard", "cutting_board", "cutting_board"])
SHOT_B = compact_doc("P01_01_40-41-42-43", ["pick up egg", "crack egg", "open fridge", "take olive oil"], "take",
                     "olive_oil", ["pick_up", "crack", "open", "take"], ["egg", "egg", "fridge", "olive_oil"])
UNUSED = compact_doc("P01_01_50-51-52-53", ["stir pan", "stir pan", "stir pan", "stir pan"], "stir", "pan",
                     ["stir"] * 4, ["pan"] * 4)
QUERY = compact_doc("P02_03_7-8-9-10", ["wash cutting board", "put down cutting board", "pick up knife", "cut onion"],
                    "cut", "onion", ["wash", "put_down", "pick_up", "cut"], ["cutting_board", "cutting_board", "knife",
                                                                             "onion"])

NUP = "Predict the next narration given 3 sequential previous narrations from a cooking video"
VERB = "Predict the verb of the next action given 3 sequential previous narrations from a cooking video"
NOUN = "Predict the noun of the next action given 3 sequential previous narrations from a cooking video"
FIG7 = ("Predict the next action narration given 3 sequential previous actions (image-narration pairs) in a "
        "cooking video.")

# (instruction, [(shot input, shot answer), (shot input, shot answer)], query input) per template
PLAIN = ["put down vegetables . open cupboard . take cutting board =>", "pick up egg . crack egg . open fridge =>",
         "wash cutting board . put down cutting board . pick up knife =>"]
FIG7_INPUTS = [f"put down vegetables {IMG} . open cupboard {IMG} . take cutting board {IMG} =>",
               f"pick up egg {IMG} . crack egg {IMG} . open fridge {IMG} =>",
               f"wash cutting board {IMG} . put down cutting board {IMG} . pick up knife {IMG} =>"]
FIG10_INPUTS = [f"Narration 1: put down vegetables Image 1: {IMG} Narration 2: open cupboard Image 2: {IMG} "
                f"Narration 3: take cutting board Image 3: {IMG} Narration 4:",
                f"Narration 1: pick up egg Image 1: {IMG} Narration 2: crack egg Image 2: {IMG} "
                f"Narration 3: open fridge Image 3: {IMG} Narration 4:",
                f"Narration 1: wash cutting board Image 1: {IMG} Narration 2: put down cutting board Image 2: {IMG} "
                f"Narration 3: pick up knife Image 3: {IMG} Narration 4:"]
EXPECTED = {
    "compact_llama2.jinja": (NUP, PLAIN, ["put down cutting board", "take olive oil"]),
    "compact_verb.jinja": (VERB, PLAIN, ["put down", "take"]),
    "compact_noun.jinja": (NOUN, PLAIN, ["cutting board", "olive oil"]),
    "compact_idefics.jinja": (FIG7, FIG7_INPUTS, ["put down cutting board", "take olive oil"]),
    "compact_idefics_alt.jinja": (FIG7, FIG10_INPUTS, ["put down cutting board", "take olive oil"]),
}
# every built-in task -> the template it renders with; compact_idefics_alt (appendix Fig. 10) has no task of
# its own: users switch compact_nup_idefics to it with prompt.template, as done here
TASK_TEMPLATES = {
    "compact_nup": "compact_llama2.jinja", "compact_nup_random": "compact_llama2.jinja",
    "compact_verb": "compact_verb.jinja", "compact_verb_random": "compact_verb.jinja",
    "compact_noun": "compact_noun.jinja", "compact_noun_random": "compact_noun.jinja",
    "compact_nup_idefics": "compact_idefics.jinja",
}
CASES = [*TASK_TEMPLATES.items(), ("compact_nup_idefics", "compact_idefics_alt.jinja")]
# Otter's in-context format of the keyframe task: one `<image>User: ... GPT:<answer> answer` turn per example
# (the Flamingo adapter turns each line break after an example into <|endofchunk|>)
OTTER_INPUTS = [f"{IMG}User: {FIG7} put down vegetables . {IMG}open cupboard . {IMG}take cutting board GPT:<answer>",
                f"{IMG}User: {FIG7} pick up egg . {IMG}crack egg . {IMG}open fridge GPT:<answer>",
                f"{IMG}User: {FIG7} wash cutting board . {IMG}put down cutting board . {IMG}pick up knife "
                "GPT:<answer>"]
VARIANTS = {("compact_nup_idefics", "otter"): "compact_otter.jinja"}


class PromptsOnly(Model):
    """Takes image prompts without reading frames; never asked anything here."""

    name = "prompts-only"
    capabilities = ModelCapabilities(images=True, reads_images=False)

    def generate(self, requests, progress=None):  # pragma: no cover - prepare() asks nothing
        raise AssertionError("prepare() must not call the model")


class OtterPromptsOnly(PromptsOnly):
    """Declares Otter's prompt variant and decoding defaults, as the ``otter`` adapter does."""

    defaults = ModelDefaults(generation={"num_beams": 3, "no_repeat_ngram_size": 3}, prompt_variant="otter")


@pytest.fixture(scope="module")
def index():
    return TaskIndex.build()


def prepared_task(index, tmp_path, task_name, template=None, chat=False, model=None):
    """The task prepared on the fixed documents; ``template`` replaces its own (None: keep it)."""
    for name, docs in (("test.jsonl", [QUERY]), ("train.jsonl", [SHOT_A, SHOT_B, UNUSED])):
        (tmp_path / name).write_text("".join(json.dumps(d) + "\n" for d in docs))
    task = index.tasks[task_name]
    prompt = task.prompt
    if template is not None:
        assert task.prompt.template in (template, "compact_idefics.jinja")
        prompt = dataclasses.replace(task.prompt, template=template)
    task = dataclasses.replace(
        task, prompt=prompt,
        dataset=DatasetConfig("jsonl", {"files": {s: str(tmp_path / f"{s}.jsonl") for s in ("test", "train")}}))
    opts = RunOptions(shots=2, sampler="first", apply_chat_template=chat, progress=False)
    p = prepare(task, model or PromptsOnly(), opts, index)
    assert p.shot_ids == {0: [[SHOT_A["id"], SHOT_B["id"]]]}
    return p


def prepared_prompt(index, tmp_path, task_name, template, chat=False):
    return prepared_task(index, tmp_path, task_name, template, chat).prompts[0][0]


def test_every_builtin_task_and_prompt_is_covered(index):
    # every built-in task renders one of these prompts, except the retrieval tasks, which render none
    prompted = {name for name, t in index.tasks.items() if t.output_type != "retrieval"}
    assert set(TASK_TEMPLATES) == prompted
    assert all(index.tasks[t].prompt is None for t in set(index.tasks) - prompted) and len(index.tasks) > len(prompted)
    assert {t for _, t in CASES} | set(VARIANTS.values()) == {p.name for p in BUILTIN_PROMPTS.glob("*.jinja")}
    assert {t for _, t in CASES} == set(EXPECTED)
    assert all(index.tasks[t].prompt.template == tpl for t, tpl in TASK_TEMPLATES.items())
    assert {(t, v): tpl for t, cfg in index.tasks.items() if cfg.prompt is not None
            for v, tpl in cfg.prompt.variants.items()} == VARIANTS


def test_otter_renders_its_own_format_of_the_keyframe_task(index, tmp_path):
    p = prepared_task(index, tmp_path, "compact_nup_idefics", model=OtterPromptsOnly())
    assert p.config.prompt.template == "compact_otter.jinja"
    assert p.prompts[0][0].text == "\n".join([f"{OTTER_INPUTS[0]} put down cutting board",
                                              f"{OTTER_INPUTS[1]} take olive oil", OTTER_INPUTS[2]])
    # each narration's keyframe comes first, in document and clip order
    assert [(i.doc_id, i.clip) for i in p.prompts[0][0].images] == [(d["id"], c) for d in (SHOT_A, SHOT_B, QUERY)
                                                                    for c in range(3)]
    # the task sets max_new_tokens and stop; the model's decoding defaults fill in the rest
    assert p.model_defaults == {"generation": {"num_beams": 3, "no_repeat_ngram_size": 3}, "prompt_variant": "otter"}
    assert (p.config.generation.num_beams, p.config.generation.no_repeat_ngram_size) == (3, 3)
    plain = prepared_task(index, tmp_path, "compact_nup_idefics")  # a model without the variant: Fig. 7
    assert plain.config.prompt.template == "compact_idefics.jinja" and plain.model_defaults["prompt_variant"] is None


@pytest.mark.parametrize("task_name, template", CASES)
def test_full_prompt_text(index, tmp_path, task_name, template):
    instruction, inputs, answers = EXPECTED[template]
    p = prepared_prompt(index, tmp_path, task_name, template)
    assert p.text == "\n".join([instruction, f"{inputs[0]} {answers[0]}", f"{inputs[1]} {answers[1]}", inputs[2]])
    assert p.messages is None
    images = [(d["id"], c) for d in (SHOT_A, SHOT_B, QUERY) for c in range(3)] if IMG in inputs[0] else []
    assert [(i.doc_id, i.clip) for i in p.images] == images


@pytest.mark.parametrize("task_name, template", CASES)
def test_full_chat_turns(index, tmp_path, task_name, template):
    instruction, inputs, answers = EXPECTED[template]
    p = prepared_prompt(index, tmp_path, task_name, template, chat=True)
    assert [(m.role, m.content) for m in p.messages] == [
        ("system", instruction), ("user", inputs[0]), ("assistant", answers[0]), ("user", inputs[1]),
        ("assistant", answers[1]), ("user", inputs[2])]
    # the text form is still rendered (and hashed into prompts_sha256) alongside the turns, with the same images
    assert p.text.splitlines()[0] == instruction
    assert sum(m.content.count(IMG) for m in p.messages) == len(p.images) == (9 if IMG in inputs[0] else 0)
