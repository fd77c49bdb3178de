"""One problem of a source set, and the verl RL row it becomes.

verl's RL parquet schema (as its examples/data_preprocess scripts write it):

    data_source   str                       picks the reward function
    prompt        [*worked example turns, {"role": "user", "content": question [+ " " + instruction]}]
    images        [{"bytes": ...}, ...] (image data sets only; `<image>` marks in the prompt)
    ability       str                       e.g. "math"
    reward_model  {"style": "rule", "ground_truth": str}
    extra_info    {"split": str, "index": int, + the source's own fields}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from thinkrl.atomic import atomic_path


@dataclass(frozen=True, slots=True)
class Example:
    """A problem as the source states it, before any template."""

    question: str
    ground_truth: str
    """What the reward compares the response's final answer with."""
    data_source: str
    ability: str
    original: dict = field(default_factory=dict)
    """The source's own fields (question, full answer, ...) kept in extra_info."""
    images: tuple[bytes, ...] = ()
    """Encoded images (PNG, JPEG) the question's `<image>` marks refer to."""


def to_verl_row(example: Example, *, split: str, index: int, instruction: str | None,
                demonstration: Sequence[dict]) -> dict:
    """The row of `example`; `instruction` (for the chat template; None for
    templates that carry their own) follows the question after a space, as in
    verl's preprocessing scripts. `demonstration`: chat messages placed before
    the question (a few-shot example as earlier user/assistant turns)."""
    content = example.question if instruction is None else f"{example.question} {instruction}"
    row = {
        "data_source": example.data_source,
        # copies: rows must not share (and so edit) the caller's message dicts
        "prompt": [*(dict(message) for message in demonstration), {"role": "user", "content": content}],
        "ability": example.ability,
        "reward_model": {"style": "rule", "ground_truth": example.ground_truth},
        "extra_info": {"split": split, "index": index, **example.original},
    }
    if example.images:  # verl's image column: a list of {"bytes": ...}
        row["images"] = [{"bytes": image} for image in example.images]
    return row


def to_verl_rows(examples: Sequence[Example], *, split: str, instruction: str | None,
                 demonstration: Sequence[dict] = ()) -> list[dict]:
    """The rows of one split, indexed from 0 in order (see `to_verl_row`);
    no worked example unless `demonstration` gives one."""
    return [to_verl_row(example, split=split, index=index, instruction=instruction,
                        demonstration=demonstration)
            for index, example in enumerate(examples)]


def write_rows(rows: list[dict], path: Path) -> None:
    """One parquet file, written atomically: a reader never sees half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
