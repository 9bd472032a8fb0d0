"""Caption datasets: each format on hand-made files, the task loaders, and the reference copies."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from mmcomp_eval.data.captions import CaptionDataset, load_caption_dataset, msrvtt_train_list
from mmcomp_eval.tasks.loaders import DataContext, load_documents
from mmcomp_eval.errors import UserError
from mmcomp_eval.config.task_config import load_task_file


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_msrvtt_test_and_train_lists(tmp_path):
    d = tmp_path / "msrvtt"
    write(d / "MSRVTT_JSFUSION_test.csv", """
        key,vid_key,video_id,sentence
        ret0,msr9770,video9770,a person is connecting something to system
        ret1,msr9771,video9771,a little  girl does gymnastics
        """)
    ds = load_caption_dataset("msrvtt", "test", d)
    assert ds.videos == ("video9770", "video9771")
    assert ds.captions == ("a person is connecting something to system", "a little girl does gymnastics")
    assert ds.caption_ids == ("video9770#0", "video9771#0") and ds.caption_video == (0, 1)

    write(d / "MSRVTT_train.9k.csv", "video_id\nvideo2\nvideo0\nvideo5\n")
    with pytest.raises(UserError, match=r"no MSRVTT_data.json \(the full MSR-VTT caption file"):
        load_caption_dataset("msrvtt", "train", d)
    sentences = [{"video_id": "video0", "caption": "a dog runs", "sen_id": 0},
                 {"video_id": "video1", "caption": "not in the 9k list", "sen_id": 1},
                 {"video_id": "video2", "caption": "a cat sleeps", "sen_id": 2},
                 {"video_id": "video0", "caption": "a dog is running", "sen_id": 3}]
    (d / "MSRVTT_data.json").write_text(json.dumps({"videos": [], "sentences": sentences}))
    train = load_caption_dataset("msrvtt", "train", d)  # "train" means the 9k list
    assert train.split == "train_9k"
    assert train.videos == ("video2", "video0")  # list order; video5 has no caption
    assert train.captions == ("a cat sleeps", "a dog runs", "a dog is running")
    assert train.caption_ids == ("video2#0", "video0#0", "video0#1")
    assert train.video_captions == ((0,), (1, 2))
    assert train.notes == ("1 of 3 listed videos have no caption; left out",)
    assert msrvtt_train_list("9k", d) == ("video2", "video0", "video5")


def test_msrvtt_full_test_split_needs_msrvtt_data_json(tmp_path):
    """The official 2,990-video test split (SAVE's MSRVTT-7k test): ids in a list, captions in MSRVTT_data.json."""
    d = tmp_path / "msrvtt"
    write(d / "MSRVTT_test.full.csv", "video_id\nvideo7010\nvideo7011\nvideo7012\n")
    with pytest.raises(UserError, match=r"no MSRVTT_data.json \(the full MSR-VTT caption file .* "
                                        r"MSRVTT_test.full.csv only names the 3 videos of split test_full\)"):
        load_caption_dataset("msrvtt", "test_full", d)
    sentences = [{"video_id": f"video{v}", "caption": f"clip {v} caption {k}", "sen_id": 100 * v + k}
                 for k in range(3) for v in (7011, 7010, 5, 7012)]  # interleaved, as the real file is
    (d / "MSRVTT_data.json").write_text(json.dumps({"videos": [], "sentences": sentences}))
    full = load_caption_dataset("msrvtt", "full", d)  # alias
    assert full.split == "test_full" and full.videos == ("video7010", "video7011", "video7012")
    assert len(full) == 9 and full.video_captions == ((0, 1, 2), (3, 4, 5), (6, 7, 8))
    assert full.captions[:3] == ("clip 7010 caption 0", "clip 7010 caption 1", "clip 7010 caption 2")
    assert full.caption_ids[3:6] == ("video7011#0", "video7011#1", "video7011#2")
    assert [Path(s).name for s in full.sources] == ["MSRVTT_test.full.csv", "MSRVTT_data.json"]
    write(d / "MSRVTT_val.full.csv", "video_id\nvideo5\n")
    assert load_caption_dataset("msrvtt", "val_full", d).captions == ("clip 5 caption 0", "clip 5 caption 1",
                                                                       "clip 5 caption 2")


def test_msvd_many_captions_per_video(tmp_path):
    d = tmp_path / "msvd"
    write(d / "test_list.txt", "vidB\nvidA\n")
    (d / "captions_msvd.json").write_text(json.dumps({"vidA": ["a", "b", "c"], "vidB": ["d"], "vidC": ["e"]}))
    ds = load_caption_dataset("msvd", "test", tmp_path)  # a root holding msvd/ works too
    assert ds.videos == ("vidB", "vidA") and ds.captions == ("d", "a", "b", "c")
    assert ds.caption_video == (0, 1, 1, 1) and ds.video_of(2) == "vidA"


def test_didemo_paragraphs(tmp_path):
    items = [{"video": "v1.mp4", "description": "a man walks in. "}, {"video": "v2.avi", "description": "rain"},
             {"video": "v1.mp4", "description": "he  sits down"}]
    (tmp_path / "test_data.json").write_text(json.dumps(items))
    ds = load_caption_dataset("didemo", "test", tmp_path)
    assert ds.videos == ("v1.mp4", "v2.avi")
    assert ds.captions == ("a man walks in. he sits down", "rain")


def test_vatex_test_list_and_alignment(tmp_path):
    write(tmp_path / "val.en", " a man runs .\n a man jogs .\n a dog barks .\n")
    write(tmp_path / "val.id", "vidA&0\nvidA&1\nvidB&0\n")
    write(tmp_path / "retrieval_test_list.txt", "vidB\nvidZ\nvidA\n")
    ds = load_caption_dataset("vatex", "test", tmp_path)
    assert ds.videos == ("vidB", "vidA") and ds.captions == ("a dog barks .", "a man runs .", "a man jogs .")
    assert ds.notes == ("1 of 3 listed videos have no caption; left out",)
    assert len(load_caption_dataset("vatex", "val", tmp_path).videos) == 2
    write(tmp_path / "val.id", "vidA&0\nvidA&1\n")
    with pytest.raises(UserError, match=r"val.en: 3 captions but .*val.id has 2 ids"):
        load_caption_dataset("vatex", "val", tmp_path)


def test_charades_descriptions(tmp_path):
    write(tmp_path / "Charades_v1_test.csv", '''
        id,subject,scene,descriptions,length
        YSKX3,CP6Y,Bedroom,"A person looks under a mattress, then pats the bed.;A person is in a bedroom.",16.6
        T5ECU,M7K8,Kitchen,A person drinks water,31.3
        ''')
    ds = load_caption_dataset("charades", "test", tmp_path)
    assert ds.captions == ("A person looks under a mattress, then pats the bed.", "A person is in a bedroom.",
                           "A person drinks water")
    assert ds.caption_video == (0, 0, 1)


def test_lsmdc_user_files(tmp_path):
    with pytest.raises(UserError, match=r"LSMDC is not public"):
        load_caption_dataset("lsmdc", "test", tmp_path)
    rows = ["1001_A_00.00.01-00.00.03\t1\t3\t1\t3\tSOMEONE opens a door.",
            "1001_A_00.00.05-00.00.09\t5\t9\t5\t9\tShe smiles."]
    (tmp_path / "LSMDC16_challenge_1000_publictect.csv").write_text("\n".join(rows) + "\n")
    ds = load_caption_dataset("lsmdc", "test", tmp_path)
    assert ds.videos == ("1001_A_00.00.01-00.00.03", "1001_A_00.00.05-00.00.09")
    assert ds.captions == ("SOMEONE opens a door.", "She smiles.")
    (tmp_path / "LSMDC16_annos_val.tsv").write_text("clip\t1\t2\tonly four\n")
    with pytest.raises(UserError, match=r"LSMDC16_annos_val.tsv:1: 4 tab-separated fields, expected 6"):
        load_caption_dataset("lsmdc", "val", tmp_path)


def test_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("MMCOMP_DATA_DIR", raising=False)
    with pytest.raises(UserError, match=r"no data folder for msvd: pass --data-dir .* or set MMCOMP_DATA_DIR"):
        load_caption_dataset("msvd")
    with pytest.raises(UserError, match=r"unknown caption dataset 'msvdd' \(did you mean 'msvd'\?\)"):
        load_caption_dataset("msvdd", "test", tmp_path)
    with pytest.raises(UserError, match=r"msrvtt has no split 'tset' \(did you mean 'test'\?\)"):
        load_caption_dataset("msrvtt", "tset", tmp_path)
    write(tmp_path / "MSRVTT_JSFUSION_test.csv", "video,sentence\nv,a\n")
    with pytest.raises(UserError, match=r"missing column\(s\) video_id \(did you mean 'video'\?\)"):  # the shared CSV reader's wording
        load_caption_dataset("msrvtt", "test", tmp_path)
    monkeypatch.setenv("MMCOMP_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match=r"msvd: not a folder"):
        load_caption_dataset("msvd")


def test_dataset_invariants():
    ds = CaptionDataset("x", "test", ("v0", "v1"), ("a", "b", "c"), ("v0#0", "v1#0", "v1#1"), (0, 1, 1))
    assert len(ds) == 3 and ds.video_captions == ((0,), (1, 2))
    other = ds.with_captions(["A", "B", "C"], split="test+actrem")
    assert other.captions == ("A", "B", "C") and other.caption_video == ds.caption_video
    with pytest.raises(ValueError, match="a video has no caption"):
        CaptionDataset("x", "test", ("v0", "v1"), ("a",), ("v0#0",), (0,))
    with pytest.raises(ValueError, match="duplicate caption ids"):
        CaptionDataset("x", "test", ("v0",), ("a", "b"), ("v0#0", "v0#0"), (0, 0))


def test_task_loader(tmp_path):
    d = tmp_path / "data"
    write(d / "test_list.txt", "vidA\nvidB\n")
    (d / "captions_msvd.json").write_text(json.dumps({"vidA": ["a dog runs", "a dog is running"], "vidB": ["rain"]}))
    task_file = write(tmp_path / "t.yaml", """
        task: msvd_videos
        dataset: {name: msvd, options: {data_dir: data, unit: video}}
        target_field: caption
        prompt: {template: t.jinja}
        metrics: [bleu]
        """)
    docs = load_documents(load_task_file(task_file), "test", DataContext())
    assert [d.id for d in docs] == ["vidA", "vidB"]
    assert docs[0]["captions"] == ["a dog runs", "a dog is running"] and docs[0]["caption"] == "a dog runs"
    task_file.write_text(task_file.read_text().replace("unit: video", "unit: caption"))
    docs = load_documents(load_task_file(task_file), "test", DataContext())
    assert [d.id for d in docs] == ["vidA#0", "vidA#1", "vidB#0"] and docs[2]["video_id"] == "vidB"
    task_file.write_text(task_file.read_text().replace("unit: caption", "units: caption"))
    with pytest.raises(UserError, match=r"dataset 'msvd' has no option 'units' \(did you mean 'unit'\?\)"):
        load_documents(load_task_file(task_file), "test", DataContext())


@pytest.fixture(scope="module")
def reference() -> Path:
    root = os.environ.get("MMCOMP_DATA_DIR")
    if not root:
        pytest.skip("reference data not configured: set MMCOMP_DATA_DIR=../shared/data to run this test")
    if not (Path(root) / "msrvtt").is_dir():
        pytest.skip(f"MMCOMP_DATA_DIR={root} has no msrvtt/ folder")
    return Path(root)


@pytest.mark.data
def test_reference_datasets(reference):
    sizes = {}
    for name in ("msrvtt", "msvd", "didemo", "vatex", "charades"):
        ds = load_caption_dataset(name, "test", reference / name)
        sizes[name] = (len(ds.videos), len(ds))
    assert sizes == {"msrvtt": (1000, 1000), "msvd": (670, 27763), "didemo": (1037, 1037),
                     "vatex": (1415, 7075), "charades": (1863, 4537)}
    assert len(msrvtt_train_list("9k", reference / "msrvtt")) == 9000
    if not (reference / "msrvtt" / "MSRVTT_data.json").is_file():  # the reference folder has only the id list
        with pytest.raises(UserError, match="only names the 2,990 videos of split test_full"):
            load_caption_dataset("msrvtt", "test_full", reference / "msrvtt")
    assert len(msrvtt_train_list("7k", reference / "msrvtt")) == 7010
