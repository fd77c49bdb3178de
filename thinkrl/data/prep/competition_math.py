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

MATH500_SOURCE = "HuggingFaceH4/MATH-500"
MATH_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
ABILITY = "math"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`,
    braces balanced, escaped braces (`\\{`) not counted; `\\boxed 5` (no
    braces) gives the rest of that word. None when there is no box or its
    braces never close."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    position = start + len(command)
    if text.startswith(" ", position):  # `\boxed 5$`: a single unbraced word
        word = text[position:].strip().split()
        return word[0].rstrip("$.") if word else None
    if not text.startswith("{", position):
        return None
    depth, i = 0, position
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # an escaped character, e.g. the literal brace in \{1, 2\}
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[position + 1:i]
        i += 1
    return None


def _ground_truth(record: InputRecord, solution: str) -> str:
    if isinstance(record.value, dict) and record.value.get("answer") not in (None, ""):
        return text_field(record, "answer")
    boxed = last_boxed(solution)
    if boxed is None or not boxed.strip():
        raise ValueError(f"{record.where}: no field 'answer' and the field 'solution' has no "
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
