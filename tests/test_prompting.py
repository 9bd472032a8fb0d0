"""Prompt rendering: the paper's templates, chat turns, strictness, sandbox."""

from __future__ import annotations

import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER, PromptTemplate
from mmcomp_eval.tasks.index import BUILTIN_PROMPTS


def cdoc(i, narrations):
    return Document(f"v_{i}", {"id": f"v_{i}", "narrations": narrations, "trg_narration": narrations[3],
                               "trg_verb": narrations[3].split()[0], "trg_noun": narrations[3].split()[-1]})


SHOTS = [cdoc(1, ["put down bowl", "move frying pan", "pick up spatula", "put down spatula"]),
         cdoc(2, ["put down bowl", "move jar", "pick up egg", "crack egg"])]
QUERY = cdoc(3, ["pick up tins", "put down tins", "move bowl", "take bowl"])
INSTRUCTION = "Predict the next narration given 3 sequential previous narrations from a cooking video"


def test_llama2_template_is_figure_6():
    p = PromptTemplate(BUILTIN_PROMPTS / "compact_llama2.jinja").render(QUERY, SHOTS, INSTRUCTION)
    assert p.text == (
        f"{INSTRUCTION}\n"
        "put down bowl . move frying pan . pick up spatula => put down spatula\n"
        "put down bowl . move jar . pick up egg => crack egg\n"
        "pick up tins . put down tins . move bowl =>")
    assert p.images == () and p.messages is None


def test_chat_turns():
    p = PromptTemplate(BUILTIN_PROMPTS / "compact_llama2.jinja").render(QUERY, SHOTS, INSTRUCTION, chat=True)
    roles = [m.role for m in p.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert p.messages[2].content == "put down spatula"
    assert p.messages[-1].content == "pick up tins . put down tins . move bowl =>"


def test_idefics_template_images_in_order():
    p = PromptTemplate(BUILTIN_PROMPTS / "compact_idefics.jinja").render(QUERY, SHOTS[:1], "I")
    assert p.text.count(IMAGE_PLACEHOLDER) == 6
    assert [(i.doc_id, i.clip) for i in p.images] == [("v_1", 0), ("v_1", 1), ("v_1", 2),
                                                       ("v_3", 0), ("v_3", 1), ("v_3", 2)]
    assert p.text.splitlines()[1].startswith(f"put down bowl {IMAGE_PLACEHOLDER} . move frying pan")
    alt = PromptTemplate(BUILTIN_PROMPTS / "compact_idefics_alt.jinja").render(QUERY, [], "I")
    assert alt.text.endswith(f"Narration 3: move bowl Image 3: {IMAGE_PLACEHOLDER} Narration 4:")


def test_atom_templates_answer_with_spaces():
    d = Document("x", {"narrations": ["a", "b", "c", "pick up knife"], "trg_verb": "pick_up", "trg_noun": "knife"})
    assert PromptTemplate(BUILTIN_PROMPTS / "compact_verb.jinja").answer(d) == "pick up"
    assert PromptTemplate(BUILTIN_PROMPTS / "compact_noun.jinja").answer(d) == "knife"


def test_missing_variable_is_one_line_error(tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("{{ doc.nonexistent }}")
    with pytest.raises(UserError, match="nonexistent.*document v_3"):
        PromptTemplate(t).render(QUERY, [], "")


@pytest.mark.parametrize("payload", [
    "{{ doc.__class__.__mro__ }}",
    "{{ ''.__class__.__base__.__subclasses__() }}",
    "{{ instruction.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
])
def test_sandbox_blocks_python_internals(tmp_path, payload):
    t = tmp_path / "t.jinja"
    t.write_text(payload)
    with pytest.raises(UserError):
        PromptTemplate(t).render(QUERY, [], "")


def test_syntax_error_names_line(tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("ok\n{% for %}")
    with pytest.raises(UserError, match=r"t.jinja:2: template syntax error"):
        PromptTemplate(t)


def test_image_refs_use_the_documents_ids_not_a_field_named_id():
    """Tasks may name their id field differently; image refs carry Document.id."""
    doc = Document("clip-7", {"narrations": ["a", "b", "c", "d"], "trg_narration": "d"})
    shot = Document("clip-3", {"narrations": ["e", "f", "g", "h"], "trg_narration": "h"})
    p = PromptTemplate(BUILTIN_PROMPTS / "compact_idefics.jinja").render(doc, [shot], "I")
    assert [i.doc_id for i in p.images] == ["clip-3"] * 3 + ["clip-7"] * 3
