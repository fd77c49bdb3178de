"""The reward of the sort task, with verl's signature: 1.0 when the last line
that holds numbers lists them sorted, else 0.0."""

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    expected = [int(n) for n in re.findall(r"\d+", ground_truth)]
    lines = [line for line in solution_str.splitlines() if re.search(r"\d", line)]
    if not lines:
        return 0.0
    return float([int(n) for n in re.findall(r"\d+", lines[-1])] == expected)
