"""Scoring rows of reasoning-gym tasks with the package's own scorer.

Rows written by `thinkrl prep reasoning-gym` have ``data_source``
``reasoning_gym/<task>`` and keep the generated entry (question, answer and
the metadata its scorer reads) as JSON in ``extra_info["entry"]``, with the
task's generator settings in ``extra_info["config"]``. The answer is what the
response writes between the last ``<answer>`` and ``</answer>``
(`reasoning_gym.utils.extract_answer`, as the package's own evaluations read
it); the score is the task's ``score_answer(answer, entry)``: 1.0 right, 0.0
wrong, and for some tasks partial credit in between.

Parts reported beside the score: ``format`` (1 when the response has an
answer between the tags) and ``accuracy`` (1 when the score is 1), so a
run's metrics tell a policy that learns the tags from one that learns the
answers.

reasoning-gym is an optional dependency (``pip install -e '.[envs]' (in thinkrl's checkout)``);
`check_installed` says so at start.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from thinkrl.errors import UserError

DATA_SOURCE_PREFIX = "reasoning_gym/"
INSTALL = "pip install -e '.[envs]' (in thinkrl's checkout) (or pip install reasoning-gym==0.1.25)"


def check_installed() -> None:
    """ValueError saying how to install reasoning-gym when it is missing."""
    try:
        import reasoning_gym  # noqa: F401
    except ImportError as err:
        raise UserError(f"reasoning-gym rows need the reasoning-gym package ({err}): {INSTALL}") from None


def task_of(data_source: str) -> str:
    """``reasoning_gym/chain_sum`` -> ``chain_sum``."""
    return data_source[len(DATA_SOURCE_PREFIX):] if data_source.startswith(DATA_SOURCE_PREFIX) else data_source


@functools.lru_cache(maxsize=256)
def _scorer(task: str, config_json: str):
    """The `score_answer` of `task`'s dataset built with the row's settings
    (a task's scorer may read them: tolerances, formats)."""
    import reasoning_gym

    config = {k: v for k, v in json.loads(config_json).items() if k not in ("seed", "size")}
    return reasoning_gym.create_dataset(task, size=1, seed=0, **config).score_answer


def compute_score(response: str, ground_truth: str, extra_info: dict | None = None) -> dict[str, float]:
    """reasoning-gym's score of `response` for the row whose entry is in
    `extra_info` ({"task", "entry", "config"}, as prep writes them)."""
    from reasoning_gym.utils import extract_answer

    info = extra_info or {}
    if "entry" not in info or "task" not in info:
        raise UserError("a reasoning_gym row needs extra_info.task and extra_info.entry (the "
                         "generated item as JSON); write the data with thinkrl prep reasoning-gym")
    entry = json.loads(info["entry"]) if isinstance(info["entry"], str) else dict(info["entry"])
    config = info.get("config") or "{}"
    answer = extract_answer(response)
    score = float(_scorer(str(info["task"]), config if isinstance(config, str) else json.dumps(config))(
        answer, entry))
    return {"score": score, "format": float(answer is not None), "accuracy": float(score >= 1.0)}


def rows_answer(entry: dict[str, Any]) -> str:
    """What a worked example's assistant turn shows: the working when the
    generator records an arithmetic expression (``metadata.expression``:
    chain_sum, basic_arithmetic, products, ...), then the answer between the
    tags the scorer reads."""
    expression = (entry.get("metadata") or {}).get("expression")
    working = f"{str(expression).strip()} = {entry['answer']}\n" if expression else ""
    return f"{working}<answer>{entry['answer']}</answer>"
