"""`thinkrl prep reasoning-gym`: procedural reasoning tasks from the
reasoning-gym package, as verl parquet rows scored by the package's own
scorers (no reward file).

    thinkrl prep reasoning-gym --tasks chain_sum,leg_counting --size 500 --test-size 50 \\
        --seed 1 --config '{"chain_sum": {"max_terms": 3}}' --output data/rg

Each task's generator is seeded (train with --seed, test and worked
examples with seeds far from it: reasoning-gym seeds item i with seed + i,
so seeds 1 and 2 would give the same items shifted by one), and a test
question never appears in train. Rows: ``data_source`` = ``reasoning_gym/<task>``, the question with
the answer-format instruction, ``reward_model.ground_truth`` = the task's
answer, and in ``extra_info`` the task, its generator settings and the
generated entry as JSON (its scorer reads the entry's metadata).

``--config`` holds the generators' difficulty settings (each task's config
dataclass, e.g. chain_sum's ``min_terms``/``max_terms``/``min_digits``): a
JSON object, or a path to a JSON/YAML file, keyed by task name; an object
whose keys are not all task names applies to every task.

A worked example (``--shots``) shows the working when the generator records
an arithmetic expression (``metadata.expression``: ``9 - 6 = 3``), then the
answer between the tags.

``--shots K`` puts K worked examples of the same task before each question,
as earlier user/assistant turns whose answers are written between the tags:
small instruct models follow a shown format far more often than a described
one (``--config smol``'s sums showed the same).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from thinkrl.data.prep.examples import Example, to_verl_row
from thinkrl.errors import UserError
from thinkrl.rewards.reasoning_gym import DATA_SOURCE_PREFIX, check_installed, rows_answer

INSTRUCTION = "Give your final answer between <answer> and </answer>."
"""On a line after each question: the tags are what reasoning-gym's
scorers read the answer from."""
_SPLIT_SEED_OFFSET = 100_000_007
"""Test items use seed + this, worked examples seed + twice this: streams that
cannot overlap for fewer than this many items."""
_MAX_DRAWS = 20
"""A generator with few distinct questions cannot fill a split without
repeats: after this many items per wanted row, prep stops with an error."""


@dataclass(frozen=True)
class GymRequest:
    """What `thinkrl prep reasoning-gym` was asked for."""

    tasks: tuple[str, ...]
    size: int = 1000
    """Training rows per task."""
    test_size: int = 100
    """Held-out rows per task."""
    seed: int = 1
    config: dict[str, dict] = field(default_factory=dict)
    """Task name -> its generator's settings."""
    shots: int = 0
    """Worked examples of the task before each question."""


def task_names() -> list[str]:
    """Every task the installed reasoning-gym registers."""
    check_installed()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def parse_tasks(text: str) -> tuple[str, ...]:
    """``"a,b"`` -> ("a", "b"); ValueError naming the closest name of an unknown task."""
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    if not tasks:
        raise UserError("--tasks: name at least one reasoning-gym task, e.g. --tasks chain_sum,leg_counting")
    known = task_names()
    for task in tasks:
        if task not in known:
            close = difflib.get_close_matches(task, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"known tasks: {', '.join(known)}"
            raise UserError(f"--tasks: reasoning-gym has no task {task!r}; {hint}")
    if len(set(tasks)) != len(tasks):
        raise UserError(f"--tasks {text}: a task is named twice")
    return tasks


def parse_config(text: str | None, tasks: tuple[str, ...]) -> dict[str, dict]:
    """--config: JSON text or a JSON/YAML file; per task, or one object for all."""
    if not text:
        return {}
    path = Path(text).expanduser()
    try:
        value = yaml.safe_load(path.read_text()) if path.is_file() else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise UserError(f"--config {text[:80]}: neither a JSON object nor a readable file ({err})") from None
    if not isinstance(value, dict):
        raise UserError(f"--config: expected a JSON object (task -> settings), got {type(value).__name__}")
    known = set(task_names())
    if value and all(key in known for key in value):  # keyed by task
        extra = sorted(set(value) - set(tasks))
        if extra:
            raise UserError(f"--config has settings for {', '.join(extra)}, which --tasks does not "
                             "name; add them to --tasks or drop their settings")
        return {task: dict(value.get(task) or {}) for task in tasks}
    return {task: dict(value) for task in tasks}


def generate(request: GymRequest) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: each task's rows in turn, indexed from 0 per split."""
    if request.size < 1 or request.test_size < 0:
        raise UserError(f"--size {request.size} / --test-size {request.test_size}: give >= 1 / >= 0 rows per task")
    if request.shots < 0:
        raise UserError(f"--shots {request.shots}: give a count >= 0")
    rows: dict[str, list[dict]] = {"train": [], "test": []}
    for task in request.tasks:
        settings = request.config.get(task, {})
        test = _draw(task, settings, seed=request.seed + _SPLIT_SEED_OFFSET, count=request.test_size,
                     avoid=set())
        held_out = {entry["question"] for entry in test}
        shots = _draw(task, settings, seed=request.seed + 2 * _SPLIT_SEED_OFFSET, count=request.shots,
                      avoid=held_out)
        train = _draw(task, settings, seed=request.seed, count=request.size,
                      avoid=held_out | {entry["question"] for entry in shots})
        demonstration = [message for entry in shots for message in (
            {"role": "user", "content": _asked(entry)},
            {"role": "assistant", "content": rows_answer(entry)})]
        for split, entries in (("train", train), ("test", test)):
            for entry in entries:
                rows[split].append(to_verl_row(_example(task, settings, entry), split=split,
                                               index=len(rows[split]), instruction=None,
                                               demonstration=demonstration))
    return rows


def _asked(entry: dict[str, Any]) -> str:
    """The question, then the instruction on a line of its own (many questions
    end in "=" or a list, which a sentence run on after them would blur)."""
    return f"{entry['question'].rstrip()}\n{INSTRUCTION}"


def _example(task: str, settings: dict, entry: dict[str, Any]) -> Example:
    return Example(question=_asked(entry), ground_truth=str(entry["answer"]),
                   data_source=DATA_SOURCE_PREFIX + task, ability="reasoning",
                   original={"task": task, "config": json.dumps(settings, sort_keys=True),
                             "entry": json.dumps(entry, default=str)})


def _draw(task: str, settings: dict, *, seed: int, count: int, avoid: set[str]) -> list[dict]:
    """`count` entries of `task` with distinct questions none of which is in `avoid`."""
    import reasoning_gym

    if count == 0:
        return []
    budget = count * _MAX_DRAWS
    try:
        dataset = reasoning_gym.create_dataset(task, seed=seed, size=budget, **settings)
    except (TypeError, ValueError, AssertionError) as err:
        raise UserError(f"--config for {task}: reasoning-gym refuses {settings} "
                         f"({type(err).__name__}: {err})") from None
    entries, seen = [], set(avoid)
    for index in range(budget):
        entry = dataset[index]
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        entries.append(entry)
        if len(entries) == count:
            return entries
    raise UserError(f"reasoning-gym task {task} with {settings or 'its default settings'} gave only "
                     f"{len(entries)} distinct questions of the {count} wanted (after {budget} draws); "
                     "ask for fewer rows or widen its settings in --config")
