"""MATH (Hendrycks et al.) and its MATH-500 subset: `problem`, `solution`
(worked, with the result in `\\boxed{...}`) and, in MATH-500, `answer`.
Without an `answer` field the ground truth is the content of the solution's
last `\\boxed{}`, as verl's math preprocessing takes it.

data_source follows verl's names: `HuggingFaceH4/MATH-500` for MATH-500
records (they carry a `unique_id` like `test/precalculus/807.json`), else
`DigitalLearningGmbH/MATH-lighteval`.
"""

from __future__ import annotations

from pathlib import Path

from thinkrl.data.prep.examples import Example
from thinkrl.data.prep.reading import InputRecord, read_records, text_field
from thinkrl.errors import UserError
from thinkrl.rewards.math import last_boxed  # the reward reads answers the same way

MATH500_SOURCE = "HuggingFaceH4/MATH-500"
MATH_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
ABILITY = "math"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
def _ground_truth(record: InputRecord, solution: str) -> str:
    if isinstance(record.value, dict) and record.value.get("answer") not in (None, ""):
        return text_field(record, "answer")
    boxed = last_boxed(solution)
    if boxed is None or not boxed.strip():
        raise UserError(f"{record.where}: no field 'answer' and the field 'solution' has no "
                         "complete \\boxed{...} to take the answer from; add an 'answer' field")
    return boxed.strip()


def read(path: Path, *, data_source: str | None = None) -> list[Example]:
    examples = []
    for record in read_records(path):
        problem, solution = text_field(record, "problem"), text_field(record, "solution")
        answer = _ground_truth(record, solution)
        source = data_source or (MATH500_SOURCE if "unique_id" in record.value else MATH_SOURCE)
        examples.append(Example(question=problem, ground_truth=answer, data_source=source,
                                ability=ABILITY,
                                original={"question": problem, "solution": solution,
                                          "answer": answer}))
    return examples
