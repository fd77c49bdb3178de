"""GSM8K-style scoring: the answer is the number written after `####`.

`strict` reads only `#### N` (the format the prompt asks for); `flexible`
falls back to the last number in the response. Numbers compare as numbers,
so `72`, `72.0`, `$72` and `1,000` / `1000` match their value.
"""

from __future__ import annotations

import re

from thinkrl.errors import UserError

# `\s*(?:\$\s*)?`, not `\s*\$?\s*`: two adjacent `\s*` backtrack quadratically, and
# "####" followed by a long run of whitespace took seconds.
_STRICT = re.compile(r"####\s*(?:\$\s*)?(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_ANY_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
# Beyond this many characters a response is not searched backwards for a
# fallback number: a degenerate generation must not cost a regex scan per token.
_MAX_SCAN_CHARS = 20_000


def parse_number(text: str) -> float | None:
    """`'1,000'` -> 1000.0, `'$7.50'` -> 7.5; None when it is not a number."""
    cleaned = text.strip().replace(",", "").lstrip("$").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def extract_answer(response: str, *, method: str = "strict") -> str | None:
    """The final answer as written, or None when there is none."""
    if method not in ("strict", "flexible"):
        raise UserError(f"gsm8k extraction method {method!r}: use 'strict' or 'flexible'")
    matches = _STRICT.findall(response[-_MAX_SCAN_CHARS:])
    if matches:
        return matches[-1]
    if method == "flexible":
        numbers = _ANY_NUMBER.findall(response[-_MAX_SCAN_CHARS:])
        return numbers[-1] if numbers else None
    return None


def compute_score(response: str, ground_truth: str, *, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
    """`score` for a right answer, `format_score` for a wrong one that was
    found, 0 when no answer could be read."""
    answer = extract_answer(response, method=method)
    if answer is None:
        return 0.0
    truth = parse_number(str(ground_truth).split("####")[-1])
    value = parse_number(answer)
    if truth is not None and value is not None and abs(value - truth) < 1e-9:
        return score
    return format_score
