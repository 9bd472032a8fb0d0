"""Category accuracy of the gold answers, and what the category map costs.

Prints Markdown tables:

1. time to learn the prediction -> (verb class, noun class) map from the
   EK-100 CSVs (cold), to load it from its cache (warm), and to map every
   test target;
2. gold CA: every CompAct task's own target (``trg_narration``, ``trg_verb``,
   ``trg_noun``) scored as if it were the prediction, WITHOUT the identity
   rule of the metric (which would make it 100 by definition), per split kind
   x split x atom, with the unmapped count, next to the phrase parser over
   the class tables alone (what CA used before);
3. every gold miss left, with the classes the text is annotated with;
4. the fallback tiers alone: the map learned from the train file only, on
   the validation narrations whose text never occurs in train (so the
   narration tier cannot answer), against the class-table parser.

    MMCOMP_DATA_DIR=../shared/data python bench/bench_category_map.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from mmcomp_eval.data import ek100
from mmcomp_eval.data.category_map import CategoryMap
from mmcomp_eval.data.compact_build import SPLIT_KINDS, build_compact, load_split
from mmcomp_eval.data.vocab import CategoryIndex, lookup_key, singular
from mmcomp_eval.textnorm import category_key

ATOMS = {"action": ("trg_narration", ("trg_verb_class", "trg_noun_class")),
         "verb": ("trg_verb", ("trg_verb_class",)), "noun": ("trg_noun", ("trg_noun_class",))}


def mapped(cmap: CategoryMap, atom: str, text: str) -> tuple:
    m = getattr(cmap, atom)(text)
    return {"action": (m.verb, m.noun), "verb": (m.verb,), "noun": (m.noun,)}[atom], m.source


def parser_only(index: CategoryIndex, atom: str, text: str) -> tuple:
    """What category accuracy did before the map: the class tables and a left-to-right parser."""
    if atom == "action":
        return _class_table_parse(index, text)
    lookup = index.verb_class if atom == "verb" else index.noun_class
    whole = lookup(text)
    return (whole if whole is not None else _class_table_parse(index, text)[atom == "noun"],)


def _class_table_parse(index: CategoryIndex, text: str) -> tuple:
    """The parser CA used before the category map (``CategoryIndex.parse_narration``), kept as the baseline.

    Longest leading run of tokens naming a verb in the class tables (else
    the first verb anywhere), then the first noun after it, longest first.
    """
    tokens = lookup_key(text.replace(".", " ").replace(",", " ")).split()

    def match(i, table, longest):
        for n in range(min(longest, len(tokens) - i), 0, -1):
            phrase = " ".join(tokens[i:i + n])
            cid = table.get(phrase)
            if cid is None and n == 1:
                cid = table.get(singular(phrase))
            if cid is not None:
                return cid, i + n
        return None, i

    verbs, nouns = index._verb_lookup, index._noun_lookup  # noqa: SLF001 (the baseline needs the raw tables)
    verb, start = match(0, verbs, 3)
    if verb is None:
        for i in range(len(tokens)):
            verb, start = match(i, verbs, 3)
            if verb is not None:
                break
        else:
            start = 0
    noun = None
    for i in [*range(start, len(tokens)), *range(0, start)]:
        noun, _ = match(i, nouns, 4)
        if noun is not None:
            break
    return verb, noun


def gold_table(cmap: CategoryMap, index: CategoryIndex, directory: Path):
    rows, misses = [], []
    for kind in SPLIT_KINDS:
        for split in ("validation", "test"):
            docs = load_split(directory, kind, split)
            for atom, (field, class_fields) in ATOMS.items():
                hits = old_hits = unmapped = 0
                sources: Counter = Counter()
                start = time.perf_counter()
                for d in docs:
                    want = tuple(d[f] for f in class_fields)
                    got, source = mapped(cmap, atom, d[field])
                    sources[source or "unmapped"] += 1
                    unmapped += source is None
                    if got == want:
                        hits += 1
                    else:
                        misses.append((kind, split, atom, d["id"], d[field], want, got, source,
                                       d["narration_ids"][-1]))
                    old_hits += parser_only(index, atom, d[field]) == want
                seconds = time.perf_counter() - start
                n = len(docs)
                rows.append((kind, split, atom, n, 100 * hits / n, 100 * old_hits / n, unmapped,
                             ", ".join(f"{k} {v}" for k, v in sorted(sources.items())), seconds))
    return rows, misses


def _clips(files: ek100.EK100Files, index: CategoryIndex) -> list[ek100.Clip]:
    verb_ids, noun_ids = set(index.verbs), set(index.nouns)
    return ek100.read_clips(files.train, verb_ids, noun_ids) + ek100.read_clips(files.validation, verb_ids, noun_ids)


def miss_reason(miss: tuple, by_id: dict, pairs: dict, index: CategoryIndex) -> str:
    """Why a gold target does not map to its own classes, read off the target clip's annotation row."""
    atom, text, narration_id = miss[2], miss[4], miss[8]
    clip = by_id[narration_id]
    if atom == "action":
        counts = pairs[category_key(text)]
        return ("text annotated with several (verb, noun) pairs; this clip's is not the majority"
                if len(counts) > 1 else "text has one pair")
    cell = clip.verb if atom == "verb" else clip.noun
    if cell is None:
        return (f"row has no {atom} cell (reconstructed train row): trg_{atom} was read from the text, "
                f"and the text's {atom} is not of the clip's annotated class")
    table = index.verb_class(cell) if atom == "verb" else index.noun_class(cell)
    annotated = clip.verb_class if atom == "verb" else clip.noun_class
    if table != annotated:
        return f"row's {atom} cell is of another class in the class tables than the row's {atom}_class"
    return f"{atom} phrase's majority class differs from this row's"


def heldout_table(files: ek100.EK100Files, index: CategoryIndex):
    verb_ids, noun_ids = set(index.verbs), set(index.nouns)
    train = ek100.read_clips(files.train, verb_ids, noun_ids)
    validation = ek100.read_clips(files.validation, verb_ids, noun_ids)
    cmap = CategoryMap.learn(train, index)
    seen = {category_key(c.narration) for c in train if c.narration}
    by_text: dict[str, Counter] = defaultdict(Counter)
    for c in validation:
        if c.narration and category_key(c.narration) not in seen:
            by_text[category_key(c.narration)][(c.verb_class, c.noun_class)] += 1
    clips = [(t, pair) for t, pairs in by_text.items() for pair, k in pairs.items() for _ in range(k)]
    rows = []
    for name, fn in (("class-table parser (before)", lambda t: (_class_table_parse(index, t), "parse")),
                     ("category map, tiers 2-4 (train only)", lambda t: mapped(cmap, "action", t))):
        action = verb = noun = unmapped = 0
        sources: Counter = Counter()
        for text, (v, n) in clips:
            (pv, pn), source = fn(text)
            action += (pv, pn) == (v, n)
            verb += pv == v
            noun += pn == n
            unmapped += pv is None or pn is None
            sources[source or "unmapped"] += 1
        k = len(clips)
        rows.append((name, k, 100 * action / k, 100 * verb / k, 100 * noun / k, unmapped,
                     ", ".join(f"{s} {c}" for s, c in sorted(sources.items()))))
    return rows, len(by_text), cmap.describe()["lemmatizer"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ek100-dir", type=Path, default=None, help="default: $MMCOMP_DATA_DIR/ek100")
    ap.add_argument("--max-misses", type=int, default=60, help="gold misses listed (0: none)")
    args = ap.parse_args()
    files = ek100.locate(args.ek100_dir)
    index = CategoryIndex.from_csv(files.verb_classes, files.noun_classes)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        CategoryMap.load(files, cache_dir=Path(tmp))
        cold = time.perf_counter() - start
        start = time.perf_counter()
        cmap = CategoryMap.load(files, cache_dir=Path(tmp))
        warm = time.perf_counter() - start
    print("| step | seconds |\n|---|---:|")
    print(f"| learn the map from the CSVs and cache it (cold) | {cold:.2f} |")
    print(f"| load it from the cache (warm, every later run) | {warm:.2f} |")
    stats = cmap.tables.stats
    print(f"\nlearned from {', '.join(stats['files'])}: {stats['narration_texts']} narration texts "
          f"({stats['narration_texts_with_several_pairs']} with several pairs), {stats['verb_phrases']} verb "
          f"phrases, {stats['noun_phrases']} noun phrases; tie-break: {stats['tie_break']}")

    rows, misses = gold_table(cmap, index, build_compact(args.ek100_dir).directory)
    print("\nGold CA: each task's target scored as its own prediction, without the identity rule\n")
    print("| split kind | split | atom (target field) | n | CA (map) | CA (class-table parser, before) "
          "| unmapped | decided by | map seconds |")
    print("|---|---|---|---:|---:|---:|---:|---|---:|")
    for kind, split, atom, n, ca, old, unmapped, sources, seconds in rows:
        print(f"| {kind} | {split} | {atom} ({ATOMS[atom][0]}) | {n} | {ca:.2f} | {old:.2f} | {unmapped} "
              f"| {sources} | {seconds:.3f} |")
    print(f"\nlemmatizer: {cmap.describe()['lemmatizer']}")

    if args.max_misses:
        clips = _clips(files, index)
        by_id = {c.narration_id: c for c in clips if c.narration_id}
        pairs: dict[str, Counter] = defaultdict(Counter)
        for c in clips:
            if c.narration:
                pairs[category_key(c.narration)][(c.verb_class, c.noun_class)] += 1
        reasons = Counter(miss_reason(m, by_id, pairs, index) for m in misses)
        print(f"\nGold misses by reason ({len(misses)} in all)\n\n| reason | misses |\n|---|---:|")
        for reason, count in reasons.most_common():
            print(f"| {reason} | {count} |")
        print(f"\nGold misses (first {min(len(misses), args.max_misses)})\n")
        print("| split | atom | id | target text | target | mapped | tier | reason |\n|---|---|---|---|---|---|---|---|")
        for m in misses[:args.max_misses]:
            kind, split, atom, doc_id, text, want, got, source, _ = m
            print(f"| {kind}/{split} | {atom} | {doc_id} | {text} | {want} | {got} | {source} "
                  f"| {miss_reason(m, by_id, pairs, index)} |")

    held, n_texts, lemmatizer = heldout_table(files, index)
    print(f"\nFallback tiers alone: validation narrations whose text is not in the train file "
          f"({n_texts} texts), map learned from train only; lemmatizer: {lemmatizer}\n")
    print("| mapper | clips | action | verb | noun | unmapped | decided by |\n|---|---:|---:|---:|---:|---:|---|")
    for name, k, a, v, n, unmapped, sources in held:
        print(f"| {name} | {k} | {a:.2f} | {v:.2f} | {n:.2f} | {unmapped} | {sources} |")


if __name__ == "__main__":
    main()
