"""Reading the raw files of a public data set, keeping where each record came
from, so that every complaint names the file, the line (or row, or item)
and the field.

Formats: `.jsonl` (one JSON object a line; `line N` counts from 1, as an
editor does), `.json` (one JSON array; `item N` counts from 0) and
`.parquet` (`row N` counts from 0, as pyarrow and pandas do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thinkrl.errors import UserError, nearest_files

INPUT_SUFFIXES = (".jsonl", ".json", ".parquet")
SPLITS = ("train", "test")


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One record of an input file and where it is."""

    value: Any
    """A JSON object for jsonl and parquet; any JSON value for a json array's item."""
    where: str
    """`<file>, line 3` / `<file>, item 0` / `<file>, row 0`."""


def read_records(path: Path) -> list[InputRecord]:
    """Every record of one input file, in file order."""
    if path.suffix == ".jsonl":
        records = _read_jsonl(path)
    elif path.suffix == ".json":
        records = _read_json_array(path)
    elif path.suffix == ".parquet":
        records = _read_parquet(path)
    else:
        raise UserError(f"{path}: cannot read a {path.suffix or 'suffix-less'} file; give a "
                         f"{', '.join(INPUT_SUFFIXES)} file")
    if not records:
        raise UserError(f"{path} holds no records; check that it is the file you meant")
    return records


def _read_jsonl(path: Path) -> list[InputRecord]:
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{where}: not valid JSON ({err.msg} at column {err.colno}); "
                                 "a .jsonl file holds one JSON object per line") from None
            records.append(InputRecord(value=value, where=where))
    return records


def _read_json_array(path: Path) -> list[InputRecord]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UserError(f"{path}, line {err.lineno}: not valid JSON ({err.msg}); if the file "
                         "holds one object per line, name it .jsonl") from None
    if not isinstance(value, list):
        raise UserError(f"{path}: expected a JSON array of records, found a "
                         f"{type(value).__name__}")
    return [InputRecord(value=item, where=f"{path}, item {i}") for i, item in enumerate(value)]


def _read_parquet(path: Path) -> list[InputRecord]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise UserError(f"{path} is not a readable parquet file ({err})") from None
    return [InputRecord(value=row, where=f"{path}, row {i}")
            for i, row in enumerate(table.to_pylist())]


def field(record: InputRecord, name: str) -> Any:
    """`record.value[name]`; a dotted name reaches into nested objects
    (`reward_model.ground_truth`). Missing → ValueError naming the field."""
    value = record.value
    for part in name.split("."):
        if not isinstance(value, dict):
            raise UserError(f"{record.where}: expected an object with the field {name!r}, "
                             f"found {_preview(record.value)}")
        if part not in value or value[part] is None:
            raise UserError(f"{record.where}: the field {name!r} is missing; the record has "
                             f"{sorted(record.value)}")
        value = value[part]
    return value


def text_field(record: InputRecord, name: str) -> str:
    """A non-empty string field (numbers are accepted and written as text:
    a ground truth of 72 and "72" are the same answer)."""
    value = field(record, name)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserError(f"{record.where}: the field {name!r} should be text, found "
                         f"{_preview(value)}")
    text = value if isinstance(value, str) else str(value)
    if not text.strip():
        raise UserError(f"{record.where}: the field {name!r} is empty; fix or drop the record")
    return text


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def find_inputs(inputs: list[str], splits: list[str] | None) -> dict[str, list[Path]]:
    """Input files by split, in the order given.

    A folder contributes its files whose names begin with a split name
    (`train.jsonl`, `test-00000-of-00001.parquet`, ...), searched
    recursively as in a Hugging Face `datasets` folder; `splits` then
    selects among them. Single files take their split from `splits`
    (one for all, or one per file) or else from their name.
    """
    if splits and len(splits) not in (1, len(inputs)) and not _all_folders(inputs):
        raise UserError(f"--split: give one split for all inputs or one per input; got "
                         f"{len(splits)} splits for {len(inputs)} inputs")
    by_split: dict[str, list[Path]] = {}
    for position, item in enumerate(inputs):
        path = Path(item).expanduser()
        if path.is_dir():
            for split, files in _split_files_in(path, splits).items():
                by_split.setdefault(split, []).extend(files)
        elif path.is_file():
            split = _split_of_file(path, splits, position)
            by_split.setdefault(split, []).append(path)
        else:
            raise UserError(f"--input: no such file or folder {path}.{nearest_files(path)}")
    return by_split


def _all_folders(inputs: list[str]) -> bool:
    return all(Path(item).expanduser().is_dir() for item in inputs)


def _split_of_file(path: Path, splits: list[str] | None, position: int) -> str:
    if splits:
        return splits[0] if len(splits) == 1 else splits[position]
    named = _split_named_by(path.name)
    if named is None:
        raise UserError(f"--input {path}: its name does not say which split it is; name it "
                         f"with --split {'|'.join(SPLITS)}")
    return named


def _split_named_by(name: str) -> str | None:
    return next((s for s in SPLITS if name.startswith(s)), None)


def _split_files_in(folder: Path, splits: list[str] | None) -> dict[str, list[Path]]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in INPUT_SUFFIXES)
    found: dict[str, list[Path]] = {}
    for path in files:
        split = _split_named_by(path.name)
        if split is not None and (not splits or split in splits):
            found.setdefault(split, []).append(path)
    if not found:
        shown = ", ".join(str(p.relative_to(folder)) for p in files[:8]) or "none"
        wanted = "|".join(splits or SPLITS)
        raise UserError(f"--input {folder}: no file in it is named {wanted}*"
                         f"{{{','.join(INPUT_SUFFIXES)}}} (its data files: {shown}). Give the "
                         "files themselves with --input FILE --split NAME.")
    return found
