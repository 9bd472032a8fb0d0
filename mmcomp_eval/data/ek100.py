"""Reading EPIC-KITCHENS-100 action annotations.

Accepts the official CSVs (``EPIC_100_train.csv``, ``EPIC_100_validation.csv``)
and files with the same columns plus extras and empty cells (the project's
reconstructed train file). Rows are validated as they are read so that a bad
file fails with the file, row and column at fault instead of a wrong split.

A file cut inside its last number still parses (``...,cooker,4`` for class
46), so files with a pinned checksum are also compared against it; a copy
changed on purpose is read after setting ``MMCOMP_EK100_ALLOW_MODIFIED=1``.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval import paths
from mmcomp_eval.errors import UserError
from mmcomp_eval.textfiles import read_csv

log = logging.getLogger(__name__)

OFFICIAL_BASE_URL = "https://raw.githubusercontent.com/epic-kitchens/epic-kitchens-100-annotations/master/"

#: SHA-256 of the official files. The train file's hash is recorded on first
#: download (trust on first use) because no copy of it was available when
#: this table was written; the others are the official files unchanged.
OFFICIAL_SHA256 = {
    "EPIC_100_validation.csv": "35f7932ba0a1127a96cac215a98d35398946f343e3cea9ad6688ed17eee9d75d",
    "EPIC_100_verb_classes.csv": "aab8bf210d0234b6facb9b191ae402c03a5f8965d123586b4762d3468a85033e",
    "EPIC_100_noun_classes.csv": "40f0a81c5bd06b33050df9f0bd17cd3c2fccd759f9581e4e5e04fec7562be893",
    "EPIC_100_train.csv": None,
}
#: Not official: the project's reference stand-in for the train file (rebuilt from public pieces, see
#: the reference data's README; never downloaded), pinned so that the numbers in the docs are
#: checkable and a truncated copy is caught like an official file.
STAND_IN_SHA256 = {
    "EPIC_100_train_reconstructed.csv": "8d5e15b35e6a3c6fafd75d811b54c9a52482720ed7419210a5f13c8b9c44f40d",
}
CLASS_FILES = ("EPIC_100_verb_classes.csv", "EPIC_100_noun_classes.csv")
#: Stand-ins accepted, in order, when the official train file is absent.
TRAIN_CANDIDATES = ("EPIC_100_train.csv", "EPIC_100_train_reconstructed.csv")
VALIDATION_FILE = "EPIC_100_validation.csv"
#: set to 1 to read annotation files whose checksum differs from the official one (a warning instead of an error)
ALLOW_MODIFIED_ENV = "MMCOMP_EK100_ALLOW_MODIFIED"

REQUIRED_COLUMNS = ("narration_id", "video_id", "start_frame", "stop_frame",
                    "narration", "verb", "verb_class", "noun", "noun_class")


@dataclass(frozen=True)
class Clip:
    """One annotated action segment. Text fields are None when the cell is empty."""

    narration_id: str | None
    video_id: str
    participant_id: str
    start_timestamp: str | None
    stop_timestamp: str | None
    start_frame: int
    stop_frame: int
    narration: str | None
    verb: str | None
    verb_class: int
    noun: str | None
    noun_class: int
    all_nouns: tuple[str, ...]
    source_file: str
    row: int


@dataclass(frozen=True)
class EK100Files:
    train: Path
    validation: Path
    verb_classes: Path
    noun_classes: Path

    def all(self) -> tuple[Path, ...]:
        return (self.train, self.validation, self.verb_classes, self.noun_classes)


def locate(ek100_dir: Path | None, *, offline: bool = False) -> EK100Files:
    """Find the annotation files, downloading them when no folder is given."""
    if ek100_dir is None:
        default = paths.data_dir()
        if default is not None and (default / "ek100").is_dir():
            ek100_dir = default / "ek100"
        else:
            ek100_dir = download(offline=offline)
    d = Path(ek100_dir)
    if not d.is_dir():
        raise UserError(f"--ek100-dir {d}: not a folder; point it at the EK-100 annotation CSVs")
    train = next((d / n for n in TRAIN_CANDIDATES if (d / n).is_file()), None)
    if train is None:
        raise UserError(f"{d}: no EPIC_100_train.csv; put the official EK-100 train annotations there")
    files = EK100Files(train, d / VALIDATION_FILE, d / CLASS_FILES[0], d / CLASS_FILES[1])
    for f in files.all():
        if not f.is_file():
            raise UserError(f"{f}: file not found; --ek100-dir must hold the official EK-100 annotation CSVs")
    for f in files.all():
        verify(f)
    return files


#: (path, size, mtime, modified copies allowed) already checked in this process: a run locates the files
#: several times, and should warn once
_checked: set[tuple[str, int, int, bool]] = set()


def verify(path: Path) -> None:
    """Compare a file with its official SHA-256; warn (once) where none is known.

    The reference for a file is the pinned hash of its official name, else the
    hash recorded next to it when it was downloaded (``<name>.sha256``).
    """
    st = path.stat()
    allowed = os.environ.get(ALLOW_MODIFIED_ENV, "").lower() in {"1", "true", "yes"}
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, allowed)
    if key in _checked:
        return
    got = cached_sha256(path)
    expected = OFFICIAL_SHA256.get(path.name) or STAND_IN_SHA256.get(path.name)
    recorded = path.with_suffix(".sha256")
    if expected is None and recorded.is_file():
        expected = recorded.read_text(encoding="utf-8").strip()
    if expected is None:
        log.warning("%s: no official SHA-256 to check it against (its SHA-256 is %s); a truncated or edited copy "
                    "would go unnoticed", path, got)
    elif got != expected:
        differs = f"{path}: SHA-256 {got} differs from the pinned {expected}"
        source = (f"download it again ({OFFICIAL_BASE_URL}{path.name})" if path.name in OFFICIAL_SHA256
                  else "copy it again from the reference data")
        if not allowed:
            raise UserError(f"{differs}, so the copy is truncated or edited; {source}, or set "
                            f"{ALLOW_MODIFIED_ENV}=1 to read a copy you changed on purpose")
        log.warning("%s; reading it anyway because %s is set", differs, ALLOW_MODIFIED_ENV)
    _checked.add(key)


def cached_sha256(path: Path) -> str:
    """Hash of a file, remembered by (path, size, mtime) so later runs skip rehashing 100 MB."""
    st = path.stat()
    memo = paths.cache_dir() / "sha256" / hashlib.sha256(
        f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    if memo.is_file():
        return memo.read_text().strip()
    digest = file_sha256(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(digest)
    except OSError:
        pass  # a read-only cache only costs a rehash
    return digest


def download(*, offline: bool = False, dest: Path | None = None) -> Path:
    """Fetch the official annotations into the user cache (once), verifying checksums."""
    dest = dest or paths.cache_dir() / "ek100"
    wanted = [n for n in OFFICIAL_SHA256 if not (dest / n).is_file()]
    if not wanted:
        return dest
    if offline or paths.is_offline():
        raise UserError("EK-100 annotations are not cached and the run is offline; "
                        "pass --ek100-dir with EPIC_100_train.csv, EPIC_100_validation.csv and the class CSVs")
    dest.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        _download_one(OFFICIAL_BASE_URL + name, dest / name, OFFICIAL_SHA256[name])
    return dest


def _download_one(url: str, target: Path, sha256: str | None) -> None:
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".part") as tmp:
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                shutil.copyfileobj(resp, tmp)
        except (urllib.error.URLError, OSError) as exc:
            Path(tmp.name).unlink(missing_ok=True)
            raise UserError(f"could not download {url} ({exc}); pass --ek100-dir with a local copy") from None
    got = file_sha256(Path(tmp.name))
    if sha256 is not None and got != sha256:
        Path(tmp.name).unlink(missing_ok=True)
        raise UserError(f"{url}: checksum {got} does not match the expected {sha256}; "
                        "the upstream file changed, pass --ek100-dir with a verified copy")
    Path(tmp.name).replace(target)
    if sha256 is None:
        target.with_suffix(".sha256").write_text(got + "\n")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_clips(path: Path, verb_ids: set[int], noun_ids: set[int]) -> list[Clip]:
    path = Path(path)
    return [_parse_row(path, line, row, verb_ids, noun_ids) for line, row in read_csv(path, REQUIRED_COLUMNS)]


def _parse_row(path: Path, row_no: int, row: dict[str, str], verb_ids: set[int], noun_ids: set[int]) -> Clip:
    # Every row has every header column (read_csv checks); optional columns may be absent from the header.
    def text(col: str) -> str | None:
        value = row.get(col, "").strip()
        return value or None

    def known_class(col: str, value: int, known: set[int]) -> int:
        if value not in known:
            raise UserError(f"{path}:{row_no}: column '{col}' is {value}, which is not in the EK-100 class "
                            "table; check that the class CSVs match this annotation file")
        return value

    def integer(col: str, known: set[int] | None = None) -> int:
        raw = row[col].strip()
        try:
            value = int(raw)
        except ValueError:
            raise UserError(f"{path}:{row_no}: column '{col}' is {raw!r}; expected an integer") from None
        return value if known is None else known_class(col, value, known)

    video_id = text("video_id")
    if video_id is None:
        raise UserError(f"{path}:{row_no}: column 'video_id' is empty; every row needs its video id")
    all_nouns: tuple[str, ...] = ()
    raw_nouns = text("all_nouns")
    if raw_nouns is not None:
        try:
            parsed = ast.literal_eval(raw_nouns)
        except (ValueError, SyntaxError):
            raise UserError(f"{path}:{row_no}: column 'all_nouns' is {raw_nouns!r}; expected a list like ['knife']") from None
        all_nouns = tuple(str(n) for n in parsed)
    raw_classes = text("all_noun_classes")
    if raw_classes is not None:  # not kept, but a cut in the last column shows here
        try:
            classes = ast.literal_eval(raw_classes)
            if not isinstance(classes, list) or not all(isinstance(c, int) for c in classes):
                raise ValueError
        except (ValueError, SyntaxError):
            raise UserError(f"{path}:{row_no}: column 'all_noun_classes' is {raw_classes!r}; "
                            "expected a list of class ids like [4, 46]") from None
        for c in classes:
            known_class("all_noun_classes", c, noun_ids)
    return Clip(
        narration_id=text("narration_id"),
        video_id=video_id,
        participant_id=text("participant_id") or video_id.split("_")[0],
        start_timestamp=text("start_timestamp"),
        stop_timestamp=text("stop_timestamp"),
        start_frame=integer("start_frame"),
        stop_frame=integer("stop_frame"),
        narration=text("narration"),
        verb=text("verb"),
        verb_class=integer("verb_class", verb_ids),
        noun=text("noun"),
        noun_class=integer("noun_class", noun_ids),
        all_nouns=all_nouns,
        source_file=path.name,
        row=row_no,
    )
