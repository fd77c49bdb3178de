"""Geometry3K in its Hugging Face layout (hiyouga/geometry3k): parquet files
with `images` (a list of {"bytes", "path"}), `problem` (the question, with an
`<image>` mark where the diagram goes) and `answer`. Rows are written as
verl's examples/data_preprocess/geo3k.py writes them: data_source
`hiyouga/geometry3k`, the problem followed by verl's instruction, the images
in the `images` column, answer and problem in extra_info."""

from __future__ import annotations

from pathlib import Path

from thinkrl.data.images import PLACEHOLDER
from thinkrl.data.prep.examples import Example
from thinkrl.data.prep.reading import InputRecord, read_records, text_field
from thinkrl.errors import UserError

DATA_SOURCE = "hiyouga/geometry3k"
ABILITY = "math"
INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide "
    "the final answer. The reasoning process MUST BE enclosed within <think> </think> tags. "
    "The final answer MUST BE put in \\boxed{}.")
"""verl's `instruction_following` of its geo3k preprocessing."""


def image_bytes(record: InputRecord) -> tuple[bytes, ...]:
    """The encoded images of a record: {"bytes": ...} cells (or raw bytes)."""
    cells = record.value.get("images")
    if not isinstance(cells, list) or not cells:
        raise UserError(f"{record.where}: the field 'images' should list the problem's images "
                         f"({{'bytes': ...}} each), found {cells!r:.80}")
    out = []
    for cell in cells:
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        if not isinstance(data, (bytes, bytearray)) or not data:
            raise UserError(f"{record.where}: an image in 'images' has no bytes; re-download "
                             "the parquet files (Hugging Face stores images as bytes)")
        out.append(bytes(data))
    return tuple(out)


def read(path: Path, *, data_source: str | None = None) -> list[Example]:
    examples = []
    for record in read_records(path):
        problem, answer = text_field(record, "problem"), text_field(record, "answer")
        images = image_bytes(record)
        question = problem
        marks = problem.count(PLACEHOLDER)
        if marks == 0:  # the diagram goes first, where the data set usually puts it
            question = PLACEHOLDER * len(images) + problem
        elif marks != len(images):
            raise UserError(f"{record.where}: the problem has {marks} {PLACEHOLDER} marks but "
                             f"{len(images)} images")
        examples.append(Example(question=question, ground_truth=answer,
                                data_source=data_source or DATA_SOURCE, ability=ABILITY,
                                original={"answer": answer, "question": problem},
                                images=images))
    return examples
