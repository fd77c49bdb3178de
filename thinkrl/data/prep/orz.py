"""Open-Reasoner-Zero's JSON files, in any of three layouts (told apart by
the first item):

- training sets (`orz_math_57k_collected.json`, ...): a JSON array of
  two-turn dialogues,
  `[{"from": "human", "value": Q}, {"from": "assistant", "ground_truth": {"value": A}}]`;
- eval sets (`data/eval_data/aime2024.json`, ...): a JSON array of
  `{"prompt": [{"from": "user", "value": Q}], "final_answer": A}`;
- flat records `{"problem": Q, "answer": A}` (the layout MindSpeed-RL's ORZ
  dataset config reads through `map_keys`; other field names with
  `--question-field` / `--answer-field`), written as training rows.

data_source: `orz/math` for training files; `orz/<file stem>` for eval
files (`orz/aime2024`, `orz/math500`, `orz/gpqa_diamond`), so validation
metrics come out per benchmark. Every name starts with `orz/`.
"""

from __future__ import annotations

from pathlib import Path

import thinkrl.data.prep.competition_math as competition_math
from thinkrl.data.prep.generic import FieldNames
from thinkrl.data.prep.examples import Example
from thinkrl.data.prep.reading import InputRecord, read_records, text_field
from thinkrl.errors import UserError

TRAIN_SOURCE = "orz/math"
EVAL_SOURCE_PREFIX = "orz/"
ABILITY = "math"
# ORZ sets are competition math with \boxed answers: the same sentence as MATH.
INSTRUCTION = competition_math.INSTRUCTION
FLAT_FIELDS = FieldNames(question="problem", answer="answer")
"""Fields of flat records, as MindSpeed-RL's r1_zero dataset config maps them."""


def _is_dialogue(value) -> bool:
    return isinstance(value, list)


def _train_example(record: InputRecord, data_source: str) -> Example:
    turns = record.value
    if not (isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns)):
        raise UserError(f"{record.where}: expected a dialogue [{{'from': 'human', 'value': ...}}, "
                         "{'from': 'assistant', 'ground_truth': {'value': ...}}] like the "
                         "file's first item")
    question = text_field(InputRecord(turns[0], f"{record.where}, turn 0"), "value")
    answer = text_field(InputRecord(turns[1], f"{record.where}, turn 1"), "ground_truth.value")
    return Example(question=question, ground_truth=answer, data_source=data_source,
                   ability=ABILITY, original={"question": question, "answer": answer})


def _eval_example(record: InputRecord, data_source: str) -> Example:
    value = record.value
    prompt = value.get("prompt") if isinstance(value, dict) else None
    if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)):
        raise UserError(f"{record.where}: expected {{'prompt': [{{'from': 'user', 'value': ...}}], "
                         "'final_answer': ...}} like the file's first item")
    question = text_field(InputRecord(prompt[0], f"{record.where}, prompt[0]"), "value")
    answer = text_field(record, "final_answer")
    return Example(question=question, ground_truth=answer, data_source=data_source,
                   ability=ABILITY, original={"question": question, "answer": answer})


def _flat_example(record: InputRecord, data_source: str, fields: FieldNames) -> Example:
    question, answer = text_field(record, fields.question), text_field(record, fields.answer)
    return Example(question=question, ground_truth=answer, data_source=data_source,
                   ability=ABILITY, original={"question": question, "answer": answer})


def read(path: Path, *, data_source: str | None = None,
         fields: FieldNames | None = None) -> list[Example]:
    """`fields` names the question and answer of flat records (default
    `FLAT_FIELDS`); the two ORZ layouts ignore it."""
    records = read_records(path)
    first = records[0].value
    if _is_dialogue(first):
        source = data_source or TRAIN_SOURCE
        return [_train_example(r, source) for r in records]
    if isinstance(first, dict) and "prompt" not in first:
        source = data_source or TRAIN_SOURCE
        return [_flat_example(r, source, fields or FLAT_FIELDS) for r in records]
    source = data_source or EVAL_SOURCE_PREFIX + path.stem.lower()
    return [_eval_example(r, source) for r in records]
