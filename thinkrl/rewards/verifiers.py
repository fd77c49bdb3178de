"""MindSpeed-RL's rule verifiers, by its names and with its scores.

MindSpeed-RL (`mindspeed_rl/models/rule_verifier.py`) scores a response as

    reward = sum_i verifier_weight[i] * verifier_function[i](response, label)

and thinkrl does the same when `reward.verifiers` is set (the translation of
`rl_config.verifier_function` / `verifier_weight`; thinkrl's own configs can
say `reward.verifiers=[base_acc] reward.verifier_weights=[1.0]`). Each
verifier's score is also reported as a part (`reward/<name>/mean`).

| name            | scores                                                        |
|-----------------|---------------------------------------------------------------|
| `format`        | 1 if `re.match(r"^<think>.*?</think>\\s*<answer>.*?</answer>$", response, DOTALL|MULTILINE)`, else 0 |
| `strict_format` | 1 if the structure below holds, else -0.5                      |
| `base_acc`      | 1 if the response fully matches `<think>.*</think>.*<answer>.*\\boxed{.*}.*</answer>` (DOTALL) AND the last `\\boxed{...}` equals the label, else 0 |
| `acc`           | 1 boxed and right; -0.5 boxed and wrong; -1 no `boxed` (or an empty one) |

Strict structure (`strict_format`; MindSpeed-RL's `_validate_response_structure`):
exactly one each of `<think>`, `</think>`, `<answer>`, `</answer>` and one
`\\boxed{...}` closed on its own line; in the order think, /think, answer,
boxed, /answer; the response starts with `<think>` and ends with `</answer>`.

Faithful quirks, kept on purpose so scores match MindSpeed-RL's:
- `format` uses MULTILINE, so `$` also matches at a line end: text after the
  closing `</answer>` on a LATER line still scores 1 (on the same line, 0).
- `acc` looks for the text `boxed` anywhere after cutting the response at
  the first stop word (`</s>`, `<|im_end|>`, `<|endoftext|>`); it does not
  need the think/answer tags.

Where thinkrl differs: the label comparison. MindSpeed-RL grades `base_acc`
with mathruler's `grade_answer` and `acc` with its own `math_equal`; thinkrl
uses math-verify for both (`thinkrl.rewards.math.is_equivalent`), one checker
for every math reward. They disagree on a few kinds of answers (see
docs/mindspeed_rl.md, "Where the graders disagree"). A verifier that times
out scores 0 in MindSpeed-RL (1 s each); in thinkrl the reward pool's
`reward.timeout_s` zeroes the response's whole reward. MindSpeed-RL skips an
unknown verifier name silently; thinkrl refuses it at start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from thinkrl.config.verifier_checks import verifier_problems
from thinkrl.errors import UserError
from thinkrl.rewards import math as math_answer

_FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL | re.MULTILINE)
_BASE_ACC_FORMAT = re.compile(r"<think>.*</think>.*<answer>.*\\boxed\{.*\}.*</answer>", re.DOTALL)
_BOXED_TAG = re.compile(r"\\boxed\{.*?\}")  # no DOTALL: the box closes on its own line
_STOP_WORDS = ("</s>", "<|im_end|>", "<|endoftext|>")


def format_reward(response: str, label: str) -> float:
    """`format`: 1.0 or 0.0 (the label is not used)."""
    return 1.0 if _FORMAT.match(response) else 0.0


def has_strict_structure(response: str) -> bool:
    """One of each tag and one box, in order, nothing before `<think>` or after `</answer>`."""
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    if any(response.count(tag) != 1 for tag in tags) or len(_BOXED_TAG.findall(response)) != 1:
        return False
    think, end_think, answer, end_answer = (response.index(tag) for tag in tags)
    boxed = _BOXED_TAG.search(response).start()
    return (think < end_think < answer < boxed < end_answer
            and response.startswith("<think>") and response.endswith("</answer>"))


def strict_format_reward(response: str, label: str) -> float:
    """`strict_format`: 1.0 when `has_strict_structure`, else -0.5."""
    return 1.0 if has_strict_structure(response) else -0.5


def last_boxed_braced(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, braces balanced, stripped; None if absent
    or unclosed. (mathruler's `extract_boxed_content`, which returns "None" then.)"""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    content = text[start + len("\\boxed{"):]
    for i, char in enumerate(content):
        depth += (char == "{") - (char == "}")
        if depth == -1:
            return content[:i].strip()
    return None


def base_acc_reward(response: str, label: str) -> float:
    """`base_acc`: 1.0 when the R1 format with a box holds and the box equals the label."""
    if not _BASE_ACC_FORMAT.fullmatch(response):
        return 0.0
    answer = last_boxed_braced(response)
    return 1.0 if answer is not None and math_answer.is_equivalent(answer, label) else 0.0


def after_last_boxed(text: str) -> str:
    """What MindSpeed-RL's math parser reads after the LAST `boxed`: the braced
    group (`boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`), or the text up to the next `$`
    (`boxed 5$` -> `5`); then newlines with their indentation removed, one leading
    `:` and one trailing `.` or `/` dropped. "" when nothing follows."""
    rest = text.split("boxed")[-1]
    if rest.startswith("{"):
        depth, chars = 1, []
        for char in rest[1:]:
            depth += (char == "{") - (char == "}")
            if depth == 0:
                break
            chars.append(char)
        answer = "".join(chars)
    else:
        answer = rest.split("$")[0].strip()
    answer = re.sub(r"\n\s*", "", answer)
    answer = answer[1:] if answer.startswith(":") else answer
    return answer[:-1] if answer.endswith((".", "/")) else answer


def acc_reward(response: str, label: str) -> float:
    """`acc`: 1.0 boxed and right, -0.5 boxed and wrong, -1.0 without `boxed` or
    with an empty box."""
    output = response
    for stop in _STOP_WORDS:
        if stop in output:
            output = output.split(stop)[0].strip()
    if "boxed" not in output:
        return -1.0
    answer = after_last_boxed(output)
    if not answer:
        return -1.0
    return 1.0 if math_answer.is_equivalent(answer, label) else -0.5


Verifier = Callable[[str, str], float]
VERIFIERS: dict[str, Verifier] = {
    "format": format_reward,
    "strict_format": strict_format_reward,
    "base_acc": base_acc_reward,
    "acc": acc_reward,
}
"""MindSpeed-RL's names -> thinkrl's functions `(response, label) -> score`."""


@dataclass(frozen=True)
class WeightedVerifiers:
    """The run's reward when `reward.verifiers` is set: verl's signature,
    `{"score": sum of weight * verifier, <name>: that verifier's score}`."""

    names: tuple[str, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        problems = verifier_problems(list(self.names), list(self.weights))
        if problems:
            raise UserError("; ".join(problems))

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None, **kwargs: Any) -> dict[str, float]:
        parts = {name: VERIFIERS[name](solution_str, str(ground_truth)) for name in self.names}
        total = sum(w * parts[name] for name, w in zip(self.names, self.weights))
        return {"score": total, **parts}
