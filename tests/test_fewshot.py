"""Few-shot samplers on hand-made pools, and what a run records about them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.tasks.fewshot import ShotExclusion, build_sampler, sampler_options
from user_task import USER_TASK, make_user_tasks, run_cli


def doc(i, verbs, nouns):
    # the last clip is the target: the similar sampler ignores it by default
    return Document(f"d{i}", {"verbs": [*verbs, "TARGET_VERB"], "nouns": [*nouns, "TARGET_NOUN"]})


POOL = [
    doc(0, ["take", "wash", "cut"], ["knife", "onion", "board"]),   # shares 2 verbs + 2 nouns with the query
    doc(1, ["open", "close", "put"], ["fridge", "door", "plate"]),  # shares nothing
    doc(2, ["take", "open", "stir"], ["knife", "pan", "spoon"]),    # shares 1 verb + 1 noun
    doc(3, ["take", "cut", "peel"], ["onion", "knife", "carrot"]),  # shares 2 + 2
    doc(4, ["wash", "dry", "put"], ["pan", "towel", "plate"]),      # shares 1 verb
]
QUERY = doc(9, ["take", "cut", "mix"], ["knife", "onion", "bowl"])


def test_similar_ranks_by_shared_nouns_plus_verbs():
    picks = build_sampler("similar", {}).select([QUERY], POOL, 3, seed=0)[0]
    assert set(picks[:2]) == {0, 3}
    assert picks[2] == 2


def test_similar_ignores_target_clip():
    q = Document("q", {"verbs": ["zzz", "zzz", "zzz", "open"], "nouns": ["yyy", "yyy", "yyy", "fridge"]})
    scores_free = build_sampler("similar", {}).select([q], POOL, 5, seed=0)[0]
    assert sorted(scores_free) == [0, 1, 2, 3, 4]  # all tie at 0: no preference for doc 1 from the target


def test_ties_broken_by_seed_deterministically():
    s = build_sampler("similar", {})
    a = s.select([QUERY], POOL, 2, seed=1)
    assert a == s.select([QUERY], POOL, 2, seed=1)
    orders = {tuple(s.select([QUERY], POOL, 2, seed=k)[0]) for k in range(20)}
    assert orders == {(0, 3), (3, 0)}


def test_query_never_among_its_shots():
    for name in ("similar", "random", "first"):
        picks = build_sampler(name, {}).select(POOL, POOL, 4, seed=0)
        for i, row in enumerate(picks):
            assert i not in row and len(set(row)) == 4


def test_random_and_first_and_none():
    r = build_sampler("random", {})
    assert r.select([QUERY], POOL, 3, seed=5) == r.select([QUERY], POOL, 3, seed=5)
    assert {tuple(r.select([QUERY], POOL, 3, seed=k)[0]) for k in range(10)} != {(0, 1, 2)}
    assert build_sampler("first", {}).select([QUERY], POOL, 2, seed=0) == [[0, 1]]
    assert build_sampler("none", {}).select([QUERY], POOL, 3, seed=0) == [[]]


def test_errors():
    with pytest.raises(UserError, match="larger than the few-shot pool"):
        build_sampler("similar", {}).select([QUERY], POOL, 6, seed=0)
    with pytest.raises(UserError, match="the query excluded"):
        build_sampler("random", {}).select(POOL, POOL, 5, seed=0)
    with pytest.raises(UserError, match="did you mean 'similar'"):
        build_sampler("simlar", {})
    with pytest.raises(UserError, match="no field 'nouns'"):
        build_sampler("similar", {}).select([Document("x", {"verbs": []})], POOL, 1, seed=0)


# ---------------------------------------------------------------- what "similar" scores


def ctx_doc(name, verbs, nouns, target_verb="TARGET_VERB", target_noun="TARGET_NOUN"):
    return Document(name, {"verbs": [*verbs, target_verb], "nouns": [*nouns, target_noun]})


def test_similar_sums_noun_and_verb_set_intersections():
    """Each rival reading of E.3.2 ranks this pool differently; only |N_q & N_p| + |V_q & V_p| gives x, y, z, r, w."""
    query = ctx_doc("q", ["take", "cut", "mix"], ["knife", "onion", "bowl"])
    pool = [
        ctx_doc("w", ["open", "stir", "dry"], ["take", "cut", "mix"]),      # 0: the query's verbs, but as nouns
        ctx_doc("r", ["cut", "cut", "cut"], ["pan", "pan", "pan"]),         # 1: 1 verb (3 as a multiset)
        ctx_doc("z", ["take", "mix", "dry"], ["pan", "spoon", "lid"]),      # 2: 2 verbs + 0 nouns
        ctx_doc("y", ["open", "close", "put"], ["knife", "onion", "bowl"]),  # 3: 0 verbs + 3 nouns
        ctx_doc("x", ["take", "cut", "stir"], ["knife", "onion", "lid"]),   # 4: 2 verbs + 2 nouns
    ]
    # sum of both: x 4, y 3, z 2, r 1, w 0.  nouns only: y first.  verbs only: y behind z.
    # multiset counts: r 3.  nouns and verbs in one unprefixed set: w 3.  max instead of sum: y first.
    picks = build_sampler("similar", {}).select([query], pool, 5, seed=0)[0]
    assert [pool[i].id for i in picks] == ["x", "y", "z", "r", "w"]


def test_similar_compares_context_clips_of_the_shot_too():
    """A pool window whose *target* clip matches the query's context scores 0 by default, 2 with clips: all."""
    query = ctx_doc("q", ["take", "cut", "mix"], ["knife", "onion", "bowl"])
    pool = [ctx_doc("t", ["open", "dry", "put"], ["pan", "lid", "towel"], target_verb="cut", target_noun="knife"),
            ctx_doc("c", ["take", "dry", "put"], ["pan", "lid", "towel"], target_verb="wipe", target_noun="cloth")]
    assert build_sampler("similar", {}).select([query], pool, 1, seed=0) == [[1]]
    assert build_sampler("similar", {"clips": "all"}).select([query], pool, 1, seed=0) == [[0]]


@pytest.mark.parametrize("seed, expected", [(0, [3, 4, 0, 2, 1]), (1, [1, 2, 3, 4, 0]), (7, [1, 3, 0, 4, 2])])
def test_similar_tie_break_is_the_seeded_permutation(seed, expected):
    """All five tie (score 0): the order is argsort(default_rng(seed).permutation(5)), pinned here."""
    query = ctx_doc("q", ["zzz", "zzz", "zzz"], ["yyy", "yyy", "yyy"])
    picks = build_sampler("similar", {}).select([query], POOL, 5, seed=seed)[0]
    assert picks == expected
    assert picks == np.argsort(np.random.default_rng(seed).permutation(len(POOL))).tolist()


def test_similar_tie_break_applies_within_a_score_only():
    # Scores against QUERY: docs 0 and 3: 4, doc 2: 2, docs 1 and 4: 0. Permutations:
    # seed 0 [2 4 3 0 1] ranks 3 before 0 and 4 before 1; seed 6 [2 4 0 3 1] ranks 0 before 3;
    # seed 1 [4 0 1 2 3] ranks 1 before 4. Doc 2 stays third whatever the seed.
    s = build_sampler("similar", {})
    assert s.select([QUERY], POOL, 5, seed=0) == [[3, 0, 2, 4, 1]]
    assert s.select([QUERY], POOL, 5, seed=6) == [[0, 3, 2, 4, 1]]
    assert s.select([QUERY], POOL, 5, seed=1) == [[3, 0, 2, 1, 4]]


@pytest.mark.parametrize("name", ["similar", "first"])
def test_a_querys_shots_do_not_depend_on_the_other_queries(name):
    queries = [WINDOWS[i] for i in (1, 4, 2)]
    together = build_sampler(name, {}).select(queries, WINDOWS, 2, seed=3)
    alone = [build_sampler(name, {}).select([q], WINDOWS, 2, seed=3)[0] for q in queries]
    assert together == alone


@pytest.mark.parametrize("name", ["similar", "random", "first"])
def test_dropping_later_queries_keeps_the_shots_of_earlier_ones(name):
    """What --limit does: ``random`` draws a row per query position, so only this weaker property holds for it."""
    queries = [WINDOWS[i] for i in (1, 4, 2, 0)]
    full = build_sampler(name, {}).select(queries, WINDOWS, 2, seed=3)
    assert build_sampler(name, {}).select(queries[:2], WINDOWS, 2, seed=3) == full[:2]


# ---------------------------------------------------------------- shots never share a clip with the query


def window(name, video, first, verbs=("take", "cut", "mix"), nouns=("knife", "onion", "bowl")):
    """A CompAct-like window of 4 clips: narration ids first .. first + 3 of ``video``."""
    return Document(name, {"video_id": video, "narration_ids": [f"{video}_{first + i}" for i in range(4)],
                           "verbs": [*verbs, "v"], "nouns": [*nouns, "n"]})


WINDOWS = [
    window("a", "P01_01", 0),                     # 0: shares clip 3 with b
    window("b", "P01_01", 3),                     # 1: the query below
    window("c", "P01_01", 6),                     # 2: shares clip 6 (b's target) with b
    window("d", "P01_02", 3, verbs=("take", "cut", "stir")),  # 3: same numbers, another video: no shared clip
    window("e", "P01_01", 10, verbs=("open", "dry", "put")),                   # 4: P01_01 but disjoint
    window("f", "P02_01", 0, verbs=("open", "dry", "put"), nouns=("pan", "lid", "towel")),  # 5: nothing shared
]


def test_every_sampler_excludes_windows_sharing_a_clip():
    query = WINDOWS[1]
    for name in ("similar", "random", "first"):
        for seed in range(5):
            selection = build_sampler(name, {}).choose([query], WINDOWS, 3, seed=seed)
            assert sorted(selection.picks[0]) == [3, 4, 5], name  # the only three allowed
            assert selection.exclusion.as_dict() | {"rule": None} == {
                "rule": None, "option": "fewshot.options.exclude_shared_clips", "status": "applied",
                "excluded_pairs": 2, "queries_affected": 1, "max_excluded_per_query": 2}


def test_exclusion_off_lets_the_most_similar_overlapping_windows_in():
    """The rule is what keeps a and c out: without it the similar sampler takes them first."""
    off = build_sampler("similar", {"exclude_shared_clips": False}).choose([WINDOWS[1]], WINDOWS, 3, seed=0)
    assert sorted(off.picks[0][:2]) == [0, 2] and off.picks[0][2] == 3
    assert off.exclusion.status == "off" and off.exclusion.excluded_pairs == 0
    assert build_sampler("first", {"exclude_shared_clips": False}).select([WINDOWS[1]], WINDOWS, 2, 0) == [[0, 2]]


def test_exclusion_counts_over_many_queries_and_the_query_itself():
    selection = build_sampler("first", {}).choose(WINDOWS, WINDOWS, 2, seed=0)
    # a-b, b-a, b-c, c-b share a clip (the query itself is excluded but not counted)
    assert selection.exclusion == ShotExclusion("applied", excluded_pairs=4, queries_affected=3, max_excluded_per_query=2)
    assert selection.picks == [[2, 3], [3, 4], [0, 3], [0, 1], [0, 1], [0, 1]]


def test_documents_without_clip_fields_are_recorded_not_applicable():
    selection = build_sampler("similar", {}).choose([QUERY], POOL, 2, seed=0)
    assert selection.exclusion.status == "not_applicable"
    assert sorted(selection.picks[0]) == [0, 3]
    assert build_sampler("random", {}).choose([QUERY], POOL, 0, seed=0).exclusion.status == "no_shots"


def test_too_few_candidates_after_exclusion_is_a_clear_error():
    pool = WINDOWS[:3]  # for b both others share a clip
    with pytest.raises(UserError) as err:
        build_sampler("random", {}).select([WINDOWS[1]], pool, 1, seed=0)
    message = str(err.value)
    assert "--shots 1: query b has only 0 few-shot candidates" in message
    assert "exclude_shared_clips: false" in message and "\n" not in message
    assert build_sampler("random", {"exclude_shared_clips": False}).select([WINDOWS[1]], pool, 2, 0) != []


@pytest.mark.parametrize("docs, message", [
    ([Document("x", {"video_id": "P01_01", "verbs": [], "nouns": []})], "document x has no field 'narration_ids'"),
    ([Document("x", {"video_id": "P01_01", "narration_ids": "P01_01_3", "verbs": [], "nouns": []})],
     "document x has narration_ids 'P01_01_3'; expected a list"),
])
def test_bad_clip_fields_are_one_line_errors(docs, message):
    with pytest.raises(UserError, match=message):
        build_sampler("first", {}).select(docs, WINDOWS, 1, seed=0)


def test_clip_fields_on_one_side_only_is_an_error():
    with pytest.raises(UserError, match="the query documents have no 'video_id' / 'narration_ids' fields"):
        build_sampler("first", {}).select([QUERY], WINDOWS, 1, seed=0)


def test_exclusion_option_is_checked_and_survives_a_sampler_override():
    with pytest.raises(UserError, match="exclude_shared_clips is 'no'; expected true or false"):
        build_sampler("random", {"exclude_shared_clips": "no"})
    with pytest.raises(UserError, match="has no option 'exclude_shared_clip' \\(did you mean 'exclude_shared_clips'"):
        build_sampler("first", {"exclude_shared_clip": False})
    task_options = {"noun_field": "nouns", "exclude_shared_clips": False}
    assert sampler_options("similar", "similar", task_options) == task_options
    assert sampler_options("random", "similar", task_options) == {"exclude_shared_clips": False}


def test_a_clip_is_a_video_and_a_narration_id():
    """Ids that repeat across videos (here plain numbers) are different clips; within a video they are one."""
    def numbered(name, video, ids):
        return Document(name, {"video_id": video, "narration_ids": ids, "verbs": ["v"] * 4, "nouns": ["n"] * 4})

    query = numbered("q", "v1", [3, 4, 5, 6])
    pool = [numbered("same_video", "v1", [6, 7, 8, 9]), numbered("other_video", "v2", [3, 4, 5, 6])]
    selection = build_sampler("first", {}).choose([query], pool, 1, seed=0)
    assert selection.picks == [[1]]
    assert selection.exclusion.excluded_pairs == 1


# ---------------------------------------------------------------- end to end: what results.json records


def test_results_json_records_the_exclusion_and_the_option_turns_it_off(tiny_llama_dir, tmp_path, capsys):
    tasks = make_user_tasks(tmp_path)
    (tasks / "docs.jsonl").write_text("".join(
        json.dumps({"id": w.id, "word": w.id, "answer": w.id, "video_id": w["video_id"],
                    "narration_ids": w["narration_ids"]}) + "\n" for w in WINDOWS))
    (tasks / "echo_overlap.yaml").write_text(USER_TASK.replace("task: echo_task", "task: echo_overlap").replace(
        "fewshot: {sampler: first, k: 2}", "fewshot: {sampler: first, k: 2, options: {exclude_shared_clips: false}}"))
    for sampler in ("first", "random"):
        out = tmp_path / sampler
        rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}",
                             "--tasks", "echo_task,echo_overlap", "--include-path", str(tasks), "--sampler", sampler,
                             "--output-path", str(out), "--no-progress")
        assert rc == 0, err
        records = json.loads((out / "results.json").read_text())["tasks"]
        applied, off = records["echo_task"]["fewshot_exclusion"], records["echo_overlap"]["fewshot_exclusion"]
        assert applied["status"] == "applied" and applied["option"] == "fewshot.options.exclude_shared_clips"
        assert (applied["excluded_pairs"], applied["queries_affected"], applied["max_excluded_per_query"]) == (4, 3, 2)
        assert off["status"] == "off" and off["excluded_pairs"] == 0  # the option survives --sampler random
        shots = {(s["task"], s["doc_id"]): s["shot_ids"] for s in map(json.loads, (out / "samples.jsonl").open())}
        assert not {"a", "c"} & set(shots["echo_task", "b"])
        if sampler == "first":
            assert shots["echo_task", "b"] == ["d", "e"] and shots["echo_overlap", "b"] == ["a", "c"]
    rc, _, err = run_cli(capsys, "--model", "hf", "--model-args", f"pretrained={tiny_llama_dir}", "--tasks", "echo_task",
                         "--include-path", str(tasks), "--shots", "4", "--no-progress")
    assert rc == 2 and "Traceback" not in err
    assert "task echo_task: --shots 4: query b has only 3 few-shot candidates" in err
