"""A row's gold answer written the ways rule rewards read it (plain, `#### 72`,
`\\boxed{72}`, `<answer>` tags): what `thinkrl rehearse` scores to check that
a reward pays for the right answer, and what the start-up trial of a custom
reward function calls it with.
"""

from __future__ import annotations

from thinkrl.records import Sample


def formatted(answer: str) -> list[str]:
    """`answer` as plain text and in the formats rule rewards read."""
    return [answer, f"#### {answer}", f"The answer is \\boxed{{{answer}}}.",
            f"<think>\nThe answer is {answer}.\n</think>\n<answer>\\boxed{{{answer}}}</answer>",
            f"<think>\nThe answer is {answer}.\n</think>\n<answer>{answer}</answer>"]


def gold_responses(sample: Sample) -> list[str]:
    """The gold answer of `sample` in every format, and its worked solution when the row has one."""
    written = formatted(sample.ground_truth)
    solution = sample.extra_info.get("answer") if isinstance(sample.extra_info, dict) else None
    if isinstance(solution, str) and solution.strip() and solution not in written:
        written.append(solution)  # e.g. GSM8K's worked solution ending "#### 72"
    return written
