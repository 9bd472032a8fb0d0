"""Reading the user's text files: UTF-8, strict CSV rows, and errors that say where.

A stray Latin-1 byte, a row cut short by a truncated download or a control
character inside a JSON string otherwise surfaces as a traceback from deep in
the codec, csv or json modules -- or, worse, as a padded row that is read
with the wrong numbers. Every reader here fails with one line naming the
file, the line (and column or byte offset) and what to do about it.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmcomp_eval.errors import UserError, did_you_mean


def read_text(path: Path | str) -> str:
    """The whole file as text (UTF-8; a leading byte-order mark is dropped).

    A missing file raises FileNotFoundError so each caller can say which
    file it expected; other OS errors and undecodable bytes are UserErrors.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc}); check the path and its permissions") from None
    return decode(path, data)


def decode(path: Path | str, data: bytes) -> str:
    try:
        # utf-8-sig: spreadsheet programs save CSVs with a BOM, which would otherwise stick to the first column name
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{path}:{line}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8 "
                        f"({exc.reason}); save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def json_error(path: Path | str, exc: json.JSONDecodeError, line: int | None = None) -> UserError:
    """A JSON parse error with its position; ``line`` is the file's line when ``exc`` came from that line alone."""
    line = exc.lineno if line is None else line
    # exc.msg alone is cut short ("Invalid control character at"): the position completes it
    return UserError(f"{path}:{line}:{exc.colno}: not valid JSON ({exc.msg}: line {line} column {exc.colno}); "
                     "fix the file there")


def read_json(path: Path | str) -> Any:
    path = Path(path)
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise json_error(path, exc) from None


def read_csv(path: Path | str, required: Sequence[str] = ()) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) for every row of a CSV with a header.

    Every row must have exactly the header's number of fields: a short row is
    what a truncated file ends with, and padding it with empty cells (as
    ``csv.DictReader`` does) would read a cut-off ``46`` as ``4``. Blank lines
    are skipped; columns beyond ``required`` are kept and may be ignored.
    """
    path = Path(path)
    reader = csv.reader(io.StringIO(read_text(path), newline=""), strict=True)
    rows: list[tuple[int, dict[str, str]]] = []
    try:
        header = next(reader, None)
        if header is None:
            raise UserError(f"{path}: empty file; expected a CSV header with columns {', '.join(required)}")
        missing = [c for c in required if c not in header]
        if missing:
            raise UserError(f"{path}: missing column(s) {', '.join(missing)}{did_you_mean(missing[0], header)}; "
                            f"expected the columns {', '.join(required)}")
        end = reader.line_num
        for fields in reader:
            start, end = end + 1, reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise UserError(f"{path}:{start}: {len(fields)} fields but the header has {len(header)}; the row is "
                                "cut short (a truncated file?) or has a stray comma -- fix or re-download the file")
            rows.append((start, dict(zip(header, fields))))
    except csv.Error as exc:
        raise UserError(f"{path}:{reader.line_num}: malformed CSV ({exc}); fix the quoting on that line") from None
    return rows
