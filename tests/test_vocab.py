"""The EK-100 category index on raw, normalised and plain spellings."""

from __future__ import annotations

import pytest

from conftest import write_classes
from mmcomp_eval.data.vocab import CategoryIndex, plain_noun
from mmcomp_eval.errors import UserError


@pytest.fixture
def index(tmp_path):
    write_classes(tmp_path)
    return CategoryIndex.from_dir(tmp_path)


@pytest.mark.parametrize("spelling, cls", [
    ("pick-up", 0), ("pick_up", 0), ("pick up", 0), ("Pick Up", 0), ("grab", 0), ("put-down", 1),
    ("rinse", 2), ("slice", 5), ("fly", None),
])
def test_verbs(index, spelling, cls):
    assert index.verb_class(spelling) == cls


@pytest.mark.parametrize("spelling, cls", [
    ("board:chopping", 2), ("chopping_board", 2), ("chopping board", 2), ("board", 2),
    ("oil:olive", 5), ("olive oil", 5), ("olive_oil", 5), ("water tap", 0), ("onions", 4), ("spaceship", None),
])
def test_nouns(index, spelling, cls):
    assert index.noun_class(spelling) == cls


def test_plain_noun_reverses_modifiers():
    assert plain_noun("board:chopping") == "chopping board"
    assert plain_noun("oil:olive") == "olive oil"


def test_reference_class_tables(reference_ek100):
    index = CategoryIndex.from_dir(reference_ek100)
    assert len(index.verbs) == 97 and len(index.nouns) == 300
    assert index.verb_class("pick-up") == index.verb_class("pick up") == index.verb_class("take") == 0
    assert index.noun_class("board:chopping") == index.noun_class("chopping_board") == index.noun_class("chopping board")


def test_bad_class_table(tmp_path):
    (tmp_path / "EPIC_100_verb_classes.csv").write_text("id,key\n0,take\n")
    (tmp_path / "EPIC_100_noun_classes.csv").write_text("id,key,instances,category\n0,tap,['tap'],x\n")
    with pytest.raises(UserError, match="missing column\\(s\\) instances"):
        CategoryIndex.from_dir(tmp_path)
