"""EK-100 verb/noun class index: any spelling of a verb or noun -> its class.

Category accuracy needs to decide whether "grab" and "pick up" are the same
verb (this index is the class-table tier of ``data/category_map.py``, after
what the annotations themselves teach). EK-100 ships that knowledge as class tables (``key`` plus the list of
``instances`` folded into the class). Instances come in the annotation's raw
spelling (``pick-up``, ``board:chopping``); predictions come as plain text
("pick up chopping board") or in CompAct's normalised form
(``pick_up chopping_board``). All three spellings map to the same lookup key.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval.data.category_rules import lookup_key, plain_noun, plain_verb, singular, table_lookup
from mmcomp_eval.errors import UserError
from mmcomp_eval.textfiles import read_csv

# the spellings live with the category map's rules, which the lm-eval export ships standalone
__all__ = ["AtomClass", "CategoryIndex", "lookup_key", "normalised", "plain_noun", "plain_verb", "singular"]


def normalised(plain: str) -> str:
    """CompAct's multiword token form (paper A.3.2): ``pick up`` -> ``pick_up``."""
    return "_".join(plain.split())


@dataclass(frozen=True)
class AtomClass:
    id: int
    key: str
    category: str


class CategoryIndex:
    """Maps verb and noun spellings to EK-100 class ids.

    When two classes list spellings that collapse to the same key, the lower
    class id wins; the class's own ``key`` always wins over another class's
    instance.
    """

    def __init__(self, verbs: list[AtomClass], nouns: list[AtomClass],
                 verb_lookup: dict[str, int], noun_lookup: dict[str, int]):
        self.verbs = {c.id: c for c in verbs}
        self.nouns = {c.id: c for c in nouns}
        self._verb_lookup = verb_lookup
        self._noun_lookup = noun_lookup

    @classmethod
    def from_csv(cls, verb_csv: Path, noun_csv: Path) -> CategoryIndex:
        verbs, verb_lookup = _read_class_table(Path(verb_csv), plain_verb)
        nouns, noun_lookup = _read_class_table(Path(noun_csv), plain_noun)
        return cls(verbs, nouns, verb_lookup, noun_lookup)

    @classmethod
    def from_dir(cls, ek100_dir: Path) -> CategoryIndex:
        d = Path(ek100_dir)
        return cls.from_csv(d / "EPIC_100_verb_classes.csv", d / "EPIC_100_noun_classes.csv")

    def verb_class(self, text: str) -> int | None:
        return table_lookup(self._verb_lookup, text, plain_verb)

    def noun_class(self, text: str) -> int | None:
        return table_lookup(self._noun_lookup, text, plain_noun)

    @property
    def verb_table(self) -> dict[str, int]:
        """Every verb spelling (:func:`lookup_key` form) -> its class."""
        return self._verb_lookup

    @property
    def noun_table(self) -> dict[str, int]:
        """Every noun spelling (:func:`lookup_key` form) -> its class."""
        return self._noun_lookup


def _read_class_table(path: Path, to_plain) -> tuple[list[AtomClass], dict[str, int]]:
    if not path.is_file():
        raise UserError(f"{path}: class table not found; pass --ek100-dir with the EK-100 annotation CSVs")
    classes: list[AtomClass] = []
    own: dict[str, int] = {}
    others: dict[str, int] = {}
    for row_no, row in read_csv(path, ("id", "key", "instances")):
        try:
            cid = int(row["id"])
            instances = ast.literal_eval(row["instances"])
            if not isinstance(instances, list):
                raise ValueError
        except (ValueError, SyntaxError, TypeError):
            raise UserError(
                f"{path}:{row_no}: bad 'id' or 'instances' value; expected an integer id and a list like ['a', 'b']"
            ) from None
        classes.append(AtomClass(cid, row["key"], row.get("category", "")))
        own.setdefault(lookup_key(to_plain(row["key"])), cid)
        for inst in instances:
            others.setdefault(lookup_key(to_plain(str(inst))), cid)
    return classes, {**others, **own}
