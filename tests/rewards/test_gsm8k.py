"""GSM8K answer extraction and scoring, the data-source registry, and every
reference solution of the real GSM8K test set scored against its own answer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from thinkrl.rewards import SCORERS, compute_score, get_scorer
from thinkrl.rewards import gsm8k
from thinkrl.rewards.gsm8k import extract_answer, parse_number

GSM8K_TEST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k" / "test.jsonl"


# ---------------------------------------------------------------- extraction

@pytest.mark.parametrize("response, strict, flexible", [
    ("5 + 3 = 8.\n#### 8", "8", "8"),
    ("####8", "8", "8"),
    ("#### $72", "72", "72"),
    ("#### $ 72", "72", "72"),
    ("#### 1,000", "1,000", "1,000"),
    ("#### -3", "-3", "-3"),
    ("#### 7.50.", "7.50", "7.50"),
    ("#### 1 then I fixed it #### 2", "2", "2"),  # the last `####` wins
    ("She has 5, then 8. The answer is 8.", None, "8"),  # no `####`: flexible takes the last number
    ("#### eight", None, None),
    ("", None, None),
])
def test_extract(response, strict, flexible):
    assert extract_answer(response, method="strict") == strict
    assert extract_answer(response, method="flexible") == flexible


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="'strict' or 'flexible'"):
        extract_answer("#### 1", method="lenient")


@pytest.mark.parametrize("text, value", [
    ("72", 72.0), ("72.0", 72.0), ("$72", 72.0), ("1,000", 1000.0), (" -5 ", -5.0),
    ("7.50.", 7.5), ("", None), ("seven", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


# ---------------------------------------------------------------- scoring

@pytest.mark.parametrize("response, truth", [
    ("#### 72", "72"),
    ("#### 72.0", "72"),
    ("#### $72", "72"),
    ("#### 1,000", "1000"),
    ("#### 1000", "1,000"),
    ("#### -12", "-12"),
    ("#### 0.5", "0.5"),
    ("work... #### 18", "Janet sells 16 - 3 - 4 = 9 ... #### 18"),  # a full GSM8K answer as truth
])
def test_right_answers_score_one(response, truth):
    assert gsm8k.compute_score(response, truth) == 1.0


def test_wrong_missing_and_format_scores():
    # found but wrong -> format_score; not found -> 0 whatever format_score is
    assert gsm8k.compute_score("#### 71", "72") == 0.0
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("#### 12", "-12", format_score=0.1) == 0.1  # sign matters
    assert gsm8k.compute_score("the answer is 72", "72", format_score=0.1) == 0.0
    assert gsm8k.compute_score("#### 72", "72", score=2.0) == 2.0
    # an unreadable ground truth never matches
    assert gsm8k.compute_score("#### 72", "", format_score=0.1) == 0.1


def test_strict_versus_flexible():
    response = "5 + 3 = 8. So she has 72 shells."
    assert gsm8k.compute_score(response, "72", method="strict") == 0.0
    assert gsm8k.compute_score(response, "72", method="flexible") == 1.0
    # with a `####` answer, flexible does not fall back to a later number
    assert gsm8k.compute_score("#### 72 (checked with 3 + 4)", "72", method="flexible") == 1.0


def test_multiple_answers_last_one_counts():
    assert gsm8k.compute_score("#### 72\nWait, no.\n#### 70", "70") == 1.0
    assert gsm8k.compute_score("#### 70\nWait, no.\n#### 72", "70") == 0.0


def test_unicode_and_empty():
    assert gsm8k.compute_score("Ответ: 🍎 × 9 — ✓\n#### 72 🎉", "72") == 1.0
    assert gsm8k.compute_score("答案是七十二", "72", method="flexible") == 0.0
    # full-width digits are not ASCII digits: no answer is read
    assert gsm8k.compute_score("#### ７２", "72") == 0.0
    assert gsm8k.compute_score("", "72") == 0.0
    assert gsm8k.compute_score("", "", method="flexible") == 0.0


HUGE_RESPONSES = """
from thinkrl.rewards import gsm8k
assert gsm8k.compute_score("blah " * 200_000 + "#### 72", "72") == 1.0  # 1 MB
assert gsm8k.compute_score("7 " * 500_000, "72", method="flexible") == 0.0
assert gsm8k.compute_score("1," * 500_000, "72", method="flexible") == 0.0
# `####` followed by a long run of whitespace: adjacent `\\s*\\$?\\s*` in the
# pattern used to backtrack quadratically here (~3 s a pass; a linear scan: ~1 ms).
for _ in range(40):
    assert gsm8k.compute_score("#### " + " \\n" * 9_500 + "x", "72", method="flexible") == 0.0
    assert gsm8k.compute_score("#### $" + " " * 19_000 + "x", "72") == 0.0
print("finished")
"""


def test_huge_responses_finish():
    # A guard against catastrophic backtracking, not a speed target: the 40
    # passes take well under a second when scans are linear and minutes with
    # the old quadratic pattern, so a generous timeout separates the two even
    # on a loaded 2-core machine. A subprocess can be stopped mid-regex; a
    # thread cannot (the regex engine holds the GIL).
    try:
        done = subprocess.run([sys.executable, "-c", HUGE_RESPONSES], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("scoring huge responses did not finish in 30 s: a regex in "
                    "thinkrl/rewards/gsm8k.py backtracks catastrophically")
    assert done.returncode == 0 and done.stdout.strip() == "finished", done.stderr


# ---------------------------------------------------------------- registry

def test_known_data_sources():
    assert set(SCORERS) >= {"openai/gsm8k", "thinkrl/arith"}
    for source in ("openai/gsm8k", "thinkrl/arith"):
        scorer = get_scorer(source)
        assert scorer("#### 4", "4", None) == 1.0
        assert scorer("#### 5", "4", {}) == 0.0


def test_unknown_data_source_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_scorer("my/dataset")
    message = str(err.value)
    assert "'my/dataset'" in message
    assert "openai/gsm8k" in message and "thinkrl/arith" in message
    assert "custom_reward_function.path" in message and "reward.scorer=" in message


def test_compute_score_has_verl_signature():
    # verl's reward manager calls default_compute_score by keyword and may pass more.
    assert compute_score(data_source="openai/gsm8k", solution_str="#### 3", ground_truth="3",
                         extra_info={"split": "test"}) == 1.0
    assert compute_score("openai/gsm8k", "#### 3", "4") == 0.0
    assert compute_score("openai/gsm8k", "#### 3", "3", None, sandbox_fusion_url=None,
                         concurrent_semaphore=None, memory_limit_mb=None) == 1.0
    with pytest.raises(ValueError, match="known data sources"):
        compute_score("nope", "#### 3", "3")


# ---------------------------------------------------------------- real GSM8K

def test_every_gsm8k_reference_answer_scores_one():
    if not GSM8K_TEST.exists():
        pytest.skip(f"{GSM8K_TEST} is absent")
    rows = [json.loads(line) for line in GSM8K_TEST.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 1319
    failures = []
    for index, row in enumerate(rows):
        final = row["answer"].split("####")[-1].strip()
        scores = (compute_score("openai/gsm8k", row["answer"], final),
                  gsm8k.compute_score(row["answer"], final, method="flexible"))
        if scores != (1.0, 1.0):
            failures.append((index, scores, row["answer"][-60:]))
    assert not failures, failures[:5]
