"""Any question/answer file (`thinkrl prep jsonl`): the fields are named on
the command line; `--data-source` is required, since it decides which
reward function scores the responses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from thinkrl.data.prep.examples import Example
from thinkrl.data.prep.reading import read_records, text_field
from thinkrl.errors import UserError


@dataclass(frozen=True, slots=True)
class FieldNames:
    question: str = "question"
    """Field holding the question (dotted for nested objects: `a.b`)."""
    answer: str = "answer"
    """Field holding the final answer, written as the ground truth."""


def read(path: Path, *, data_source: str | None, ability: str,
         fields: FieldNames = FieldNames()) -> list[Example]:
    if not data_source:
        raise UserError("thinkrl prep jsonl needs --data-source NAME: the reward registry picks "
                         "the scorer by it (e.g. openai/gsm8k for '#### 42' answers)")
    examples = []
    for record in read_records(path):
        question, answer = text_field(record, fields.question), text_field(record, fields.answer)
        examples.append(Example(question=question, ground_truth=answer, data_source=data_source,
                                ability=ability,
                                original={"question": question, "answer": answer}))
    return examples
