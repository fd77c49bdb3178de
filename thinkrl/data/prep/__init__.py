"""Public data sets → verl RL parquet files (`thinkrl prep`).

One module per source reads its raw files into `Example`s; `prepare` turns
them into rows (`examples.to_verl_rows`) and writes `<output>/<split>.parquet`.

Sources and the data_source each writes (the reward registry maps these):

    gsm8k    openai/gsm8k
    math     HuggingFaceH4/MATH-500 (MATH-500 records), else
             DigitalLearningGmbH/MATH-lighteval
    orz      orz/math (ORZ training files), orz/<file stem> (ORZ eval files:
             orz/aime2024, orz/math500, orz/gpqa_diamond)
    jsonl    --data-source (required)
    builtin  thinkrl/arith
    geo3k    hiyouga/geometry3k (images in the `images` column)

With `template="chat"` the source's instruction sentence follows each
question (verl's preprocessing does the same); with `qwen_r1` the template
carries the instruction, so the question is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from thinkrl.data.prep import builtin_arith, competition_math, generic, geo3k, gsm8k, orz
from thinkrl.data.prep.examples import Example, to_verl_rows, write_rows
from thinkrl.data.prep.reading import SPLITS, find_inputs
from thinkrl.data.templates import TEMPLATES
from thinkrl.errors import SetupError, UserError

SOURCES = ("gsm8k", "math", "orz", "jsonl", "builtin", "geo3k")
_FILE_READERS = {"gsm8k": gsm8k.read, "math": competition_math.read, "orz": orz.read,
                 "geo3k": geo3k.read}
_INSTRUCTIONS = {"gsm8k": gsm8k.INSTRUCTION, "math": competition_math.INSTRUCTION,
                 "orz": orz.INSTRUCTION, "builtin": builtin_arith.INSTRUCTION,
                 "geo3k": geo3k.INSTRUCTION}


@dataclass(frozen=True)
class PrepRequest:
    """What `thinkrl prep` was asked to do."""

    source: str
    """One of SOURCES."""
    output: Path
    """Folder that receives <split>.parquet."""
    inputs: list[str] = field(default_factory=list)
    """Files or folders (none for `builtin`)."""
    template: str = "chat"
    """The prompt template the rows are meant for (see thinkrl.data.templates)."""
    splits: list[str] | None = None
    """Split of each input file (one for all, or one per file); None: from the names."""
    data_source: str | None = None
    """Overrides the source's data_source (required for `jsonl`)."""
    ability: str = "math"
    """`jsonl` only: the rows' ability label."""
    instruction: str | None = None
    """`jsonl` only: sentence appended to each question under the chat template."""
    fields: generic.FieldNames | None = None
    """`jsonl` (default question/answer) and flat `orz` records (default
    problem/answer): which fields hold the question and the answer."""
    overwrite: bool = False
    """Replace <split>.parquet files that exist already (`--overwrite`); otherwise refuse."""


@dataclass(frozen=True, slots=True)
class SplitWritten:
    split: str
    rows: int
    path: Path


def prepare(request: PrepRequest) -> list[SplitWritten]:
    """Read, convert and write every split; returns what was written, train first."""
    _check(request)
    examples_by_split = _examples_by_split(request)
    instruction = _instruction(request) if request.template == "chat" else None
    return write_splits({split: to_verl_rows(examples, split=split, instruction=instruction)
                         for split, examples in examples_by_split.items()},
                        output=request.output, overwrite=request.overwrite)


def write_splits(rows_by_split: dict[str, list[dict]], *, output: Path | str,
                 overwrite: bool) -> list[SplitWritten]:
    """`<output>/<split>.parquet` for each split (train first); refuses to
    replace existing files unless `overwrite`, checked before anything is written."""
    splits = sorted((s for s, rows in rows_by_split.items() if rows), key=SPLITS.index)
    paths = {split: Path(output).expanduser() / f"{split}.parquet" for split in splits}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not overwrite:
        raise SetupError(f"--output {output}: {', '.join(existing)} exist(s) already and "
                         "would be overwritten", "pass --overwrite to replace them, or choose "
                         "another --output folder")
    written = []
    for split in splits:
        write_rows(rows_by_split[split], paths[split])
        written.append(SplitWritten(split=split, rows=len(rows_by_split[split]), path=paths[split]))
    return written


def _check(request: PrepRequest) -> None:
    if request.source not in SOURCES:
        raise UserError(f"unknown source {request.source!r}; known sources: {', '.join(SOURCES)}")
    if request.template not in TEMPLATES:
        raise UserError(f"--template {request.template}: known templates: {', '.join(TEMPLATES)}")
    for split in request.splits or ():
        if split not in SPLITS:
            raise UserError(f"--split {split}: use one of {', '.join(SPLITS)}")
    if request.source == "builtin" and request.inputs:
        raise UserError("thinkrl prep builtin makes its data itself; drop --input")
    if request.source != "builtin" and not request.inputs:
        raise UserError(f"thinkrl prep {request.source} needs --input FILE_OR_FOLDER")


def _examples_by_split(request: PrepRequest) -> dict[str, list[Example]]:
    if request.source == "builtin":
        made = builtin_arith.splits(data_source=request.data_source)
        return {s: made[s] for s in (request.splits or SPLITS)}
    by_split: dict[str, list[Example]] = {}
    for split, paths in find_inputs(request.inputs, request.splits).items():
        for path in paths:
            by_split.setdefault(split, []).extend(_read(request, path))
    return by_split


def _read(request: PrepRequest, path: Path) -> list[Example]:
    if request.source == "jsonl":
        return generic.read(path, data_source=request.data_source, ability=request.ability,
                            fields=request.fields or generic.FieldNames())
    if request.source == "orz":
        return orz.read(path, data_source=request.data_source, fields=request.fields)
    return _FILE_READERS[request.source](path, data_source=request.data_source)


def _instruction(request: PrepRequest) -> str | None:
    if request.source == "jsonl":
        return request.instruction
    return _INSTRUCTIONS[request.source]
