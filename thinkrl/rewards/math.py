"""MATH-style scoring: read the final answer, check it against the ground
truth with math-verify (so `\\frac{1}{2}`, `\\dfrac12`, `0.5` and `1/2` all
match, as do intervals, tuples and sets written differently).

The final answer is the content of the last `\\boxed{...}` (balanced braces;
also `\\boxed 5` and `\\fbox{...}`), else the content of the last
`<answer>...</answer>`. A response without either has no answer and scores 0;
one with a readable but wrong answer scores `format_score`.

math-verify guards its own parsing with `signal.alarm`, which only works in
the main thread of the main interpreter. We turn that off (`parsing_timeout=None`,
`timeout_seconds=None`) so scoring works from any thread or process, and rely
on the reward pool's per-sample timeout (`reward.timeout_s`) to stop a
comparison that never ends.
"""

from __future__ import annotations

import functools

import math_verify.grader
import math_verify.parser
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# math-verify warns once per process that its timeout is off; that is our
# choice (the pool times out instead), so the warning would only mislead.
math_verify.parser.TIMEOUT_WARNING_SHOWN = True
math_verify.grader.TIMEOUT_WARNING_SHOWN = True

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# An answer longer than this is a degenerate generation, not a number or a
# formula: parsing it with sympy could take minutes (or hit Python's
# int-string limit), so it is scored as having no answer.
MAX_ANSWER_CHARS = 1_000
# Bare nested braces (`{{{{2}}}}`) make math-verify's parser exponential in the
# depth (12 levels: seconds). Real answers nest 0-2 deep (MATH-500's deepest
# is 2); deeper ones are scored as having no answer.
MAX_BRACE_DEPTH = 8
_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` / `\\boxed x`, or None.

    `\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`; `\\boxed 5$` -> `5`; escaped braces
    (`\\{1, 2\\}`) are not counted. An unclosed
    last box (a response cut off mid-answer) gives None. Linear in len(text).
    """
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = start + len(command)
    if text.startswith(" ", rest):  # `\boxed 5`: the token up to a space or `$`
        token = text[rest + 1:].lstrip(" ")
        end = min((i for i in (token.find("$"), token.find(" "), token.find("\n")) if i >= 0),
                  default=len(token))
        return token[:end] or None
    if not text.startswith("{", rest):
        return None
    depth, i = 0, rest
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
                return text[rest + 1:i]
        i += 1
    return None


def last_answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>`, or None."""
    close = text.rfind("</answer>")
    if close < 0:
        return None
    open_ = text.rfind("<answer>", 0, close)
    if open_ < 0:
        return None
    return text[open_ + len("<answer>"):close]


def extract_answer(response: str) -> str | None:
    """The final answer as written: the last box, else the last `<answer>` tag."""
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    return last_answer_tag(response)


@functools.lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str) -> tuple:
    # G responses to one prompt share a ground truth: parse it once.
    return tuple(_parse(ground_truth))


def _parse(answer: str) -> list:
    # Wrapping in \boxed makes math-verify read the whole string as one LaTeX answer.
    return parse(f"\\boxed{{{answer}}}", extraction_config=_EXTRACTION,
                 parsing_timeout=None)


def brace_depth(text: str) -> int:
    """Deepest `{` nesting in `text`: `a{b{c}}` -> 2."""
    depth = deepest = 0
    for char in text:
        if char == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif char == "}":
            depth -= 1
    return deepest


def readable(answer: str | None) -> bool:
    """An answer worth parsing: not empty, not absurdly long or deep."""
    return (answer is not None and bool(answer.strip()) and len(answer) <= MAX_ANSWER_CHARS
            and brace_depth(answer) <= MAX_BRACE_DEPTH)


def is_equivalent(answer: str, ground_truth: str) -> bool:
    """Is `answer` the same value as `ground_truth`? Equal strings are;
    otherwise math-verify decides (`verify_with_math_verify`)."""
    answer, ground_truth = answer.strip(), str(ground_truth).strip()
    if not readable(answer) or not ground_truth:
        return False
    if answer == ground_truth:  # the common right answer: skip sympy
        return True
    return verify_with_math_verify(answer, ground_truth)


def verify_with_math_verify(answer: str, ground_truth: str) -> bool:
    """math-verify's verdict alone, without the equal-string shortcut."""
    gold = _parse_gold(ground_truth)
    if not gold:
        return False
    return verify(list(gold), _parse(answer), timeout_seconds=None)


def compute_score(response: str, ground_truth: str, *, format_score: float = 0.0,
                  score: float = 1.0) -> float:
    """`score` for a right answer, `format_score` for a wrong one that was
    found, 0 when no answer could be read (or it is absurdly long or deep)."""
    answer = extract_answer(response)
    if not readable(answer):
        return 0.0
    return score if is_equivalent(answer, ground_truth) else format_score
