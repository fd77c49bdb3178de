"""GSM8K (openai/grade-school-math): `question`, and `answer` = a worked
solution ending in `#### <final answer>`. The ground truth is the text after
the last `####` without thousands commas (`#### 1,080` → `1080`), as verl's
examples/data_preprocess/gsm8k.py writes it."""

from __future__ import annotations

from pathlib import Path

from thinkrl.data import synthetic
from thinkrl.data.prep.examples import Example
from thinkrl.data.prep.reading import InputRecord, read_records, text_field
from thinkrl.errors import UserError

DATA_SOURCE = "openai/gsm8k"
ABILITY = "math"
# verl's sentence, also the built-in task's (they share the GSM8K scorer).
INSTRUCTION = synthetic.INSTRUCTION


def final_answer(record: InputRecord, answer: str) -> str:
    if "####" not in answer:
        raise UserError(f"{record.where}: the field 'answer' has no '#### <final answer>' "
                         "line; GSM8K solutions end with one")
    value = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not value:
        raise UserError(f"{record.where}: the field 'answer' has nothing after '####'")
    return value


def read(path: Path, *, data_source: str | None = None) -> list[Example]:
    examples = []
    for record in read_records(path):
        question, answer = text_field(record, "question"), text_field(record, "answer")
        examples.append(Example(question=question, ground_truth=final_answer(record, answer),
                                data_source=data_source or DATA_SOURCE, ability=ABILITY,
                                original={"answer": answer, "question": question}))
    return examples
