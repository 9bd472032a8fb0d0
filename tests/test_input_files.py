"""Strict reading of the user's files: UTF-8, whole CSV rows, JSON positions, EK-100 checksums."""

from __future__ import annotations

import logging
import shutil

import pytest

from conftest import annotation_row, write_annotations, write_classes
from mmcomp_eval import paths
from mmcomp_eval.data import ek100
from mmcomp_eval.data.compact_build import BuildParams, build_compact
from mmcomp_eval.data.vocab import CategoryIndex
from mmcomp_eval.errors import UserError
from mmcomp_eval.textfiles import read_csv, read_json, read_text


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------- shared readers


def test_non_utf8_byte_names_file_line_and_offset(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_bytes("first line\ncaf\u00e9 ok\nna\xefve".encode("utf-8").replace(b"\xc3\xaf", b"\xef"))
    with pytest.raises(UserError) as err:
        read_text(f)
    msg = one_line(err)
    offset = len("first line\ncafé ok\nna".encode())
    assert msg.startswith(f"{f}:3: byte 0xef at offset {offset} is not UTF-8")
    assert "save the file as UTF-8" in msg


def test_byte_order_mark_is_dropped(tmp_path):
    f = tmp_path / "t.csv"
    f.write_bytes(b"\xef\xbb\xbfid,key\n0,take\n")
    assert read_csv(f, ("id", "key")) == [(2, {"id": "0", "key": "take"})]


@pytest.mark.parametrize("body, fragment", [
    ("a,b,c\n1,2\n", "t.csv:2: 2 fields but the header has 3"),
    ("a,b,c\n1,2,3\n4,5,6,7\n", "t.csv:3: 4 fields but the header has 3"),
    ('a,b,c\n1,2,"3\n', "t.csv:2: malformed CSV (unexpected end of data)"),
])
def test_csv_rows_must_match_the_header(tmp_path, body, fragment):
    f = tmp_path / "t.csv"
    f.write_text(body)
    with pytest.raises(UserError) as err:
        read_csv(f, ("a",))
    assert fragment in one_line(err)


def test_csv_keeps_line_numbers_across_blank_and_multiline_rows(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text('a,b\n1,x\n\n2,"two\nlines"\n3,y\n')
    assert [(line, r["a"]) for line, r in read_csv(f, ("a", "b"))] == [(2, "1"), (4, "2"), (6, "3")]


def test_json_error_has_line_and_column(tmp_path):
    f = tmp_path / "d.json"
    f.write_text('{\n  "a": "x\ty"\n}\n')   # a raw tab inside a string
    with pytest.raises(UserError) as err:
        read_json(f)
    assert one_line(err).startswith(f"{f}:2:10: not valid JSON (Invalid control character at: line 2 column 10)")


def test_data_dir_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MMCOMP_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(UserError) as err:
        paths.data_dir()
    assert one_line(err).startswith(f"MMCOMP_DATA_DIR={tmp_path / 'nope'}: no such folder")
    with pytest.raises(UserError, match="MMCOMP_DATA_DIR"):
        ek100.locate(None, offline=True)  # used to fall through to "not cached and offline"
    monkeypatch.setenv("MMCOMP_DATA_DIR", str(tmp_path))
    assert paths.data_dir() == tmp_path
    monkeypatch.delenv("MMCOMP_DATA_DIR")
    assert paths.data_dir() is None


# ---------------------------------------------------------------- EK-100 rows


def _build(d):
    return build_compact(d, BuildParams(target_size=3))


def test_row_cut_inside_a_number_is_an_error_not_another_class(tiny_ek100):
    """The issue's case: the last line ends '...,knife,1' instead of '...,knife,1,['knife'],[1]'."""
    f = tiny_ek100 / "EPIC_100_train.csv"
    text = f.read_text()
    cut = text.rstrip("\n").rsplit(",", 2)[0]
    assert cut.endswith(",knife,1")
    f.write_text(cut)
    with pytest.raises(UserError) as err:
        _build(tiny_ek100)
    assert one_line(err).startswith(f"{f}:7: 13 fields but the header has 15")


def test_row_cut_inside_the_last_column_is_an_error(tiny_ek100):
    f = tiny_ek100 / "EPIC_100_validation.csv"
    f.write_text(f.read_text().rstrip("\n")[:-1])  # "[3]" -> "[3"
    with pytest.raises(UserError) as err:
        _build(tiny_ek100)
    assert one_line(err).startswith(f"{f}:5: column 'all_noun_classes' is '[3'")


def test_long_row_and_unknown_class_in_all_noun_classes(tiny_ek100):
    f = tiny_ek100 / "EPIC_100_train.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join([*lines[:3], lines[3] + ",extra", *lines[4:]]) + "\n")
    with pytest.raises(UserError, match=r"EPIC_100_train.csv:4: 16 fields but the header has 15"):
        _build(tiny_ek100)
    lines[1] = lines[1].rsplit(",", 1)[0] + ',"[1, 77]"'
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"EPIC_100_train.csv:2: column 'all_noun_classes' is 77, which is not"):
        _build(tiny_ek100)


def test_reconstructed_train_file_with_empty_cells_and_extra_columns_reads(tmp_path):
    d = tmp_path / "ek"
    d.mkdir()
    write_classes(d)
    columns = ["narration_id", "participant_id", "video_id", "narration_timestamp", "start_timestamp",
               "stop_timestamp", "start_frame", "stop_frame", "narration", "verb", "verb_class", "noun",
               "noun_class", "all_nouns", "all_noun_classes", "id_source", "text_source", "class_conflict"]
    rows = [annotation_row("P01_01", 0, "take knife", None, 0, None, 1),
            annotation_row("P01_01", 1, None, None, 2, None, 1)]
    rows[1]["narration_id"] = ""
    write_annotations(d / "EPIC_100_train_reconstructed.csv", rows, columns)
    index = CategoryIndex.from_dir(d)
    clips = ek100.read_clips(d / "EPIC_100_train_reconstructed.csv", set(index.verbs), set(index.nouns))
    assert [(c.narration_id, c.narration, c.verb, c.noun_class) for c in clips] == [
        ("P01_01_0", "take knife", None, 1), (None, None, None, 1)]


# ---------------------------------------------------------------- EK-100 checksums


@pytest.fixture
def pinned(tiny_ek100, monkeypatch):
    """The tiny folder's validation file pinned as if it were the official one; modified copies not allowed."""
    monkeypatch.delenv(ek100.ALLOW_MODIFIED_ENV)
    table = {name: None for name in ek100.OFFICIAL_SHA256}
    table["EPIC_100_validation.csv"] = ek100.file_sha256(tiny_ek100 / "EPIC_100_validation.csv")
    monkeypatch.setattr(ek100, "OFFICIAL_SHA256", table)
    return tiny_ek100


def test_pinned_file_that_differs_is_an_error_naming_the_way_out(pinned, monkeypatch, caplog):
    ek100.locate(pinned)  # unchanged: passes
    f = pinned / "EPIC_100_validation.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:-1]) + "\n")  # cut at a line boundary: every row is whole
    with pytest.raises(UserError) as err:
        ek100.locate(pinned)
    msg = one_line(err)
    assert msg.startswith(f"{f}: SHA-256 {ek100.file_sha256(f)} differs from the pinned")
    assert "MMCOMP_EK100_ALLOW_MODIFIED=1" in msg
    monkeypatch.setenv(ek100.ALLOW_MODIFIED_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="mmcomp_eval.data.ek100"):
        ek100.locate(pinned)
        ek100.locate(pinned)
    warned = [r.getMessage() for r in caplog.records if "EPIC_100_validation.csv" in r.getMessage()]
    assert len(warned) == 1 and "reading it anyway because MMCOMP_EK100_ALLOW_MODIFIED is set" in warned[0]
    monkeypatch.delenv(ek100.ALLOW_MODIFIED_ENV)
    with pytest.raises(UserError, match="differs from the pinned"):
        ek100.locate(pinned)  # allowing it once does not allow it for good


def test_file_without_a_pinned_hash_warns_once(pinned, caplog):
    with caplog.at_level(logging.WARNING, logger="mmcomp_eval.data.ek100"):
        ek100.locate(pinned)
        ek100.locate(pinned)
    warned = [r.getMessage() for r in caplog.records]
    train = pinned / "EPIC_100_train.csv"
    assert [m for m in warned if str(train) in m] == [
        f"{train}: no official SHA-256 to check it against (its SHA-256 is {ek100.file_sha256(train)}); "
        "a truncated or edited copy would go unnoticed"]
    assert not [m for m in warned if "EPIC_100_validation.csv" in m]


def test_recorded_hash_of_a_download_is_checked(pinned):
    train = pinned / "EPIC_100_train.csv"
    (pinned / "EPIC_100_train.sha256").write_text(ek100.file_sha256(train) + "\n")
    ek100.locate(pinned)
    train.write_text(train.read_text() + "\n")
    with pytest.raises(UserError, match="EPIC_100_train.csv: SHA-256 .* differs"):
        ek100.locate(pinned)


def test_hash_is_computed_once_per_file_version(tiny_ek100, monkeypatch):
    calls = []
    real = ek100.file_sha256
    monkeypatch.setattr(ek100, "file_sha256", lambda p: calls.append(p.name) or real(p))
    first = ek100.cached_sha256(tiny_ek100 / "EPIC_100_train.csv")
    again = ek100.cached_sha256(tiny_ek100 / "EPIC_100_train.csv")
    assert first == again == real(tiny_ek100 / "EPIC_100_train.csv")
    assert calls == ["EPIC_100_train.csv"]


@pytest.mark.data
def test_reference_files_verify_and_a_truncated_copy_does_not(reference_ek100, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(ek100.ALLOW_MODIFIED_ENV)
    with caplog.at_level(logging.WARNING, logger="mmcomp_eval.data.ek100"):
        files = ek100.locate(reference_ek100)
    # every reference file is pinned (the reconstructed train file as the project's stand-in): no warning
    assert [r.getMessage() for r in caplog.records] == [] and files.train.name == "EPIC_100_train_reconstructed.csv"
    copy = tmp_path / "ek100"
    shutil.copytree(reference_ek100, copy)
    f = copy / "EPIC_100_validation.csv"
    f.write_bytes(f.read_bytes().rstrip(b"\n")[:-len(",['cooker'],[46]") - 1])  # "...,cooker,46,..." -> ",cooker,4"
    assert f.read_bytes().endswith(b",cooker,4")
    with pytest.raises(UserError, match="EPIC_100_validation.csv: SHA-256 .* differs from the pinned"):
        ek100.locate(copy)
    monkeypatch.setenv(ek100.ALLOW_MODIFIED_ENV, "1")
    with pytest.raises(UserError, match=r"EPIC_100_validation.csv:9669: 13 fields but the header has 15"):
        build_compact(copy, BuildParams(target_size=3), cache_root=tmp_path / "cache")
