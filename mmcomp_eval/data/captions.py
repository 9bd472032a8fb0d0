"""Video-caption datasets for retrieval: MSRVTT, MSVD, DiDeMo, VATEX, Charades, LSMDC.

Every loader returns a :class:`CaptionDataset`: the gallery of videos, the
captions, and which video each caption describes. The files are the ones the
retrieval literature (CLIP4Clip, X-Pool, CLIP2Video) passes around; the
reference copies are laid out in ``$MMCOMP_DATA_DIR/<dataset>/`` and users
point ``data_dir`` at their own copy of the same files. LSMDC is not public:
users supply the LSMDC16 challenge files themselves.

The same loaders are registered as task dataset loaders (``dataset: {name:
msrvtt}``), one document per caption (or per video with ``unit: video``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from mmcomp_eval import paths
from mmcomp_eval import textfiles
from mmcomp_eval.errors import UserError, did_you_mean


@dataclass(frozen=True)
class CaptionDataset:
    """Videos, captions and the caption -> video mapping of one split.

    Captions are grouped by video in gallery order (``caption_video`` never
    decreases); a caption's id is ``<video id>#<k>``, ``k`` its 0-based order
    among that video's captions in the source file. Every video has at least
    one caption; videos listed by a split file without any caption are left
    out and counted in ``notes``.
    """

    name: str
    split: str
    #: gallery video ids, unique, in the split's order
    videos: tuple[str, ...]
    #: caption texts (whitespace-stripped)
    captions: tuple[str, ...]
    #: unique caption ids, aligned with ``captions``
    caption_ids: tuple[str, ...]
    #: index into ``videos`` of each caption's video
    caption_video: tuple[int, ...]
    #: files read
    sources: tuple[str, ...] = ()
    #: what was left out or assumed, for reports
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        n = len(self.captions)
        if len(self.caption_ids) != n or len(self.caption_video) != n:
            raise ValueError(f"{self.name}/{self.split}: captions, caption_ids and caption_video differ in length")
        if len(set(self.videos)) != len(self.videos):
            raise ValueError(f"{self.name}/{self.split}: duplicate video ids")
        if len(set(self.caption_ids)) != n:
            raise ValueError(f"{self.name}/{self.split}: duplicate caption ids")
        if any(not 0 <= j < len(self.videos) for j in self.caption_video):
            raise ValueError(f"{self.name}/{self.split}: caption_video index out of range")
        if len(set(self.caption_video)) != len(self.videos):
            raise ValueError(f"{self.name}/{self.split}: a video has no caption")

    def __len__(self) -> int:
        return len(self.captions)

    @cached_property
    def video_captions(self) -> tuple[tuple[int, ...], ...]:
        """For each video (gallery order), the indices of its captions."""
        out: list[list[int]] = [[] for _ in self.videos]
        for i, j in enumerate(self.caption_video):
            out[j].append(i)
        return tuple(tuple(c) for c in out)

    def video_of(self, caption_index: int) -> str:
        return self.videos[self.caption_video[caption_index]]

    def with_captions(self, captions: Sequence[str], split: str | None = None) -> CaptionDataset:
        """The same videos and mapping with new caption texts (e.g. a perturbation's output)."""
        if len(captions) != len(self.captions):
            raise ValueError(f"{len(captions)} captions for a dataset of {len(self.captions)}")
        return replace(self, captions=tuple(captions), split=split or self.split)

    def rows(self, unit: str = "caption") -> list[dict]:
        """Task documents: one per caption, or one per video with all its captions."""
        if unit == "caption":
            return [{"id": cid, "video_id": self.videos[j], "caption": text}
                    for cid, text, j in zip(self.caption_ids, self.captions, self.caption_video)]
        return [{"id": v, "video_id": v, "caption": self.captions[idx[0]],
                 "captions": [self.captions[i] for i in idx]} for v, idx in zip(self.videos, self.video_captions)]


def build(name: str, split: str, pairs: Iterable[tuple[str, str]], order: Sequence[str] | None = None,
          sources: Sequence[Path] = (), notes: Sequence[str] = ()) -> CaptionDataset:
    """A dataset from (video id, caption) pairs in file order; ``order`` lists the split's videos."""
    by_video: dict[str, list[str]] = defaultdict(list)
    for video, caption in pairs:
        caption = " ".join(caption.split())
        if caption:
            by_video[video].append(caption)
    notes = list(notes)
    if order is not None:
        listed = list(dict.fromkeys(order))
        videos = [v for v in listed if by_video.get(v)]
        if len(videos) < len(listed):
            notes.append(f"{len(listed) - len(videos)} of {len(listed)} listed videos have no caption; left out")
    else:
        videos = list(by_video)
    if not videos:
        raise UserError(f"{name} split '{split}': no captions found in {', '.join(map(str, sources))}")
    captions, ids, mapping = [], [], []
    for j, v in enumerate(videos):
        for k, text in enumerate(by_video[v]):
            captions.append(text)
            ids.append(f"{v}#{k}")
            mapping.append(j)
    return CaptionDataset(name, split, tuple(videos), tuple(captions), tuple(ids), tuple(mapping),
                          tuple(str(s) for s in sources), tuple(notes))


# ---------------------------------------------------------------- file helpers


def dataset_dir(name: str, data_dir: Path | str | None) -> Path:
    """``data_dir`` (or its ``<name>/`` subfolder), else ``$MMCOMP_DATA_DIR/<name>``."""
    if data_dir is None:
        root = paths.data_dir()
        if root is None:
            raise UserError(f"no data folder for {name}: pass --data-dir (dataset option data_dir) or set "
                            f"MMCOMP_DATA_DIR to a folder holding {name}/")
        data_dir = root / name
    d = Path(data_dir).expanduser()
    if not d.is_dir():
        raise UserError(f"{d}: not a folder; point data_dir at the {name} annotation files")
    return d


def find(d: Path, name: str, *candidates: str, why: str = "") -> Path:
    """The first of ``candidates`` in ``d`` or ``d/<name>``; a one-line error naming them otherwise."""
    for base in (d, d / name):
        for c in candidates:
            if (base / c).is_file():
                return base / c
    need = " or ".join(candidates)
    raise UserError(f"{d}: no {need}{f' ({why})' if why else ''}; put the file there or pass another data_dir")


def read_lines(path: Path) -> list[str]:
    return [line.strip() for line in textfiles.read_text(path).splitlines() if line.strip()]


def read_csv(path: Path, required: Sequence[str]) -> list[dict]:
    return [row for _, row in textfiles.read_csv(path, required)]


# ---------------------------------------------------------------- formats


def _msrvtt_test(d: Path, split: str) -> CaptionDataset:
    """1k-A test (JSFusion, CLIP4Clip): 1,000 videos, one caption each (``test_full`` is the official split)."""
    path = find(d, "msrvtt", "MSRVTT_JSFUSION_test.csv")
    rows = read_csv(path, ("video_id", "sentence"))
    return build("msrvtt", split, ((r["video_id"], r["sentence"]) for r in rows), sources=[path])


def msrvtt_train_list(size: str, data_dir: Path | str | None = None) -> tuple[str, ...]:
    """Video ids of the ``9k`` (CLIP4Clip) or ``7k`` (JSFusion) MSRVTT training list."""
    if size not in ("9k", "7k"):
        raise UserError(f"MSRVTT training list {size!r} is not one of 9k, 7k")
    path = find(dataset_dir("msrvtt", data_dir), "msrvtt", f"MSRVTT_train.{size}.csv")
    return tuple(r["video_id"] for r in read_csv(path, ("video_id",)))


#: MSR-VTT splits given as a list of video ids, captions from ``MSRVTT_data.json``: split -> list file
MSRVTT_LISTS = {
    "train_9k": "MSRVTT_train.9k.csv",   # CLIP4Clip's training list
    "train_7k": "MSRVTT_train.7k.csv",   # JSFusion's
    "test_full": "MSRVTT_test.full.csv",  # the official 2,990-video test split (SAVE's MSRVTT-7k test)
    "val_full": "MSRVTT_val.full.csv",    # the official 497-video validation split
    "train_full": "MSRVTT_train.full.csv",  # the official 6,513-video training split
}


def _msrvtt_listed(d: Path, split: str) -> CaptionDataset:
    """The listed videos with all their captions (about 20 each) from ``MSRVTT_data.json``."""
    ids_path = find(d, "msrvtt", MSRVTT_LISTS[split])
    ids = tuple(r["video_id"] for r in read_csv(ids_path, ("video_id",)))
    data_path = find(d, "msrvtt", "MSRVTT_data.json",
                     why=f"the full MSR-VTT caption file with a 'sentences' list, as in CLIP4Clip's msrvtt_data "
                         f"folder; {ids_path.name} only names the {len(ids):,} videos of split {split}")
    wanted = set(ids)
    pairs = ((v, c) for v, c in msrvtt_sentences(data_path) if v in wanted)
    return build("msrvtt", split, pairs, order=ids, sources=[ids_path, data_path])


def msrvtt_sentences(path: Path) -> list[tuple[str, str]]:
    """(video id, caption) of every sentence in ``MSRVTT_data.json`` (all 10,000 videos)."""
    data = textfiles.read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("sentences"), list):
        raise UserError(f"{path}: expected an object with a 'sentences' list of {{video_id, caption}}")
    return [(s.get("video_id"), str(s.get("caption", ""))) for s in data["sentences"] if isinstance(s, dict)]


def _msvd(d: Path, split: str) -> CaptionDataset:
    """A split list (test: 670 videos) with every caption of each video (about 40 each)."""
    list_path = find(d, "msvd", f"{split}_list.txt")
    caps_path = find(d, "msvd", "captions_msvd.json")
    captions = textfiles.read_json(caps_path)
    if not isinstance(captions, dict):
        raise UserError(f"{caps_path}: expected an object mapping video id -> list of captions")
    ids = read_lines(list_path)
    pairs = ((v, c) for v in ids for c in captions.get(v, ()))
    return build("msvd", split, pairs, order=ids, sources=[list_path, caps_path])


def didemo_descriptions(path: Path) -> list[tuple[str, str]]:
    """(video, description) pairs of a DiDeMo ``<split>_data.json``, in file order."""
    items = textfiles.read_json(path)
    if not isinstance(items, list):
        raise UserError(f"{path}: expected a list of {{video, description}} objects")
    pairs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "video" not in item or "description" not in item:
            raise UserError(f"{path}: item {i} has no 'video' or 'description'")
        pairs.append((item["video"], " ".join(str(item["description"]).split())))
    return pairs


def _didemo(d: Path, split: str) -> CaptionDataset:
    """Paragraph-to-video (as CLIP4Clip): a video's descriptions joined in file order, one caption per video."""
    path = find(d, "didemo", f"{split}_data.json")
    items = didemo_descriptions(path)
    sentences: dict[str, list[str]] = defaultdict(list)
    for video, description in items:
        sentences[video].append(description)
    pairs = ((v, " ".join(s for s in sents if s)) for v, sents in sentences.items())
    return build("didemo", split, pairs, sources=[path],
                 notes=[f"{len(items)} descriptions joined into one paragraph per video"])


def _vatex(d: Path, split: str) -> CaptionDataset:
    """English captions from ``<part>.en`` with ids ``<video>&<k>`` in ``<part>.id``.

    ``test`` is the 1,500-video retrieval list (CLIP2Video) over the validation captions.
    """
    part = "val" if split == "test" else split
    en, ids = find(d, "vatex", f"{part}.en"), find(d, "vatex", f"{part}.id")
    texts, keys = textfiles.read_text(en).splitlines(), read_lines(ids)
    while texts and not texts[-1].strip():
        texts.pop()
    if len(texts) != len(keys):
        raise UserError(f"{en}: {len(texts)} captions but {ids} has {len(keys)} ids; the two files must align")
    pairs = [(k.rsplit("&", 1)[0], t) for k, t in zip(keys, texts)]
    order, sources = None, [en, ids]
    if split == "test":
        list_path = find(d, "vatex", "retrieval_test_list.txt")
        order, sources = read_lines(list_path), [list_path, en, ids]
    return build("vatex", split, pairs, order=order, sources=sources)


def _charades(d: Path, split: str) -> CaptionDataset:
    """Each ';'-separated entry of a video's ``descriptions`` is one caption."""
    path = find(d, "charades", f"Charades_v1_{split}.csv")
    rows = read_csv(path, ("id", "descriptions"))
    pairs = ((r["id"], text) for r in rows for text in r["descriptions"].split(";"))
    return build("charades", split, pairs, order=[r["id"] for r in rows], sources=[path])


LSMDC_FILES = {"test": "LSMDC16_challenge_1000_publictect", "val": "LSMDC16_annos_val",
               "train": "LSMDC16_annos_training"}


def _lsmdc(d: Path, split: str) -> CaptionDataset:
    """LSMDC16 files: tab-separated ``clip_id, start/end aligned, start/end extracted, sentence``."""
    stem = LSMDC_FILES[split]
    path = find(d, "lsmdc", f"{stem}.csv", f"{stem}.tsv",
                why="LSMDC is not public: request it from MPII and copy the LSMDC16 challenge files")
    return build("lsmdc", split, lsmdc_pairs(path), sources=[path])


def lsmdc_pairs(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for line_no, line in enumerate(textfiles.read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 6:
            raise UserError(f"{path}:{line_no}: {len(fields)} tab-separated fields, expected 6 (clip_id, "
                            f"start_aligned, end_aligned, start_extracted, end_extracted, sentence)")
        pairs.append((fields[0], fields[5]))
    return pairs


Loader = Callable[[Path, str], CaptionDataset]
#: dataset -> split -> loader
DATASETS: dict[str, dict[str, Loader]] = {
    "msrvtt": {"test": _msrvtt_test, **{split: _msrvtt_listed for split in MSRVTT_LISTS}},
    "msvd": {"test": _msvd, "val": _msvd, "train": _msvd},
    "didemo": {"test": _didemo, "val": _didemo, "train": _didemo},
    "vatex": {"test": _vatex, "val": _vatex, "train": _vatex},
    "charades": {"test": _charades, "train": _charades},
    "lsmdc": {"test": _lsmdc, "val": _lsmdc, "train": _lsmdc},
}
#: split aliases: a task's default ``train`` few-shot split means MSRVTT's 9k list
SPLIT_ALIASES = {"msrvtt": {"train": "train_9k", "9k": "train_9k", "7k": "train_7k", "full": "test_full",
                            "test_1ka": "test"}}


def load_caption_dataset(name: str, split: str = "test", data_dir: Path | str | None = None) -> CaptionDataset:
    """Load ``split`` of dataset ``name`` from ``data_dir`` (see :func:`dataset_dir`)."""
    if name not in DATASETS:
        raise UserError(f"unknown caption dataset '{name}'{did_you_mean(name, DATASETS)}; "
                        f"known: {', '.join(sorted(DATASETS))}")
    splits, aliases = DATASETS[name], SPLIT_ALIASES.get(name, {})
    canonical = aliases.get(split, split)
    if canonical not in splits:
        known = sorted([*splits, *aliases])
        raise UserError(f"{name} has no split '{split}'{did_you_mean(split, known)}; known: {', '.join(known)}")
    return splits[canonical](dataset_dir(name, data_dir), canonical)


# ---------------------------------------------------------------- task loaders

UNITS = ("caption", "video")


def register_task_loaders(registry) -> None:
    """Add every caption dataset to the task dataset registry (``documents.LOADERS``).

    Options: ``data_dir`` (relative to the task file; default
    ``$MMCOMP_DATA_DIR/<name>``) and ``unit`` (``caption``: a document per
    caption, id ``<video>#<k>``; ``video``: a document per video with
    ``captions``, the first one as ``caption``).
    """
    for name in DATASETS:
        registry.add(name, _task_loader(name))


def task_data_dir(task) -> Path | None:
    """A caption-dataset task's ``data_dir`` option, relative to the task file; None for the default folder."""
    data_dir = task.dataset.options.get("data_dir")
    if data_dir is not None and not Path(data_dir).is_absolute() and task.source:
        data_dir = Path(task.source).parent / data_dir
    return data_dir


def _task_loader(name: str):
    def load(task, split: str, ctx) -> list[dict]:
        opts = dict(task.dataset.options)
        for key in opts:
            if key not in ("data_dir", "unit"):
                raise UserError(f"{task.source}: dataset '{name}' has no option '{key}'"
                                f"{did_you_mean(key, ['data_dir', 'unit'])}")
        unit = opts.get("unit", "caption")
        if unit not in UNITS:
            raise UserError(f"{task.source}: dataset option unit {unit!r} is not one of {', '.join(UNITS)}")
        return load_caption_dataset(name, split, task_data_dir(task)).rows(unit)

    load.__doc__ = f"Task documents from the {name} caption dataset."
    return load
