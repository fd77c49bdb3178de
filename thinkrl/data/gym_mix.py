"""The reasoning-gym mix of `--config gym` (``builtin:gym/train``, ``/test``):
three tasks of the reasoning-gym package at a difficulty where
SmolLM2-135M-Instruct is right between 5 % and 50 % of the time before
training, each shown two worked examples of its own (docs/benchmarks.md:
how the tasks and settings were chosen, and what else was measured).

- basic_arithmetic: sums and differences of two numbers of one or two
  digits, the working shown (``35 + 8 = 43``);
- word_sequence_reversal: a list of two to four words, reversed;
- needle_haystack: two to five statements, then "who <does what>?".
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata

from thinkrl.data.prep.reasoning_gym import GymRequest

REQUEST = GymRequest(
    tasks=("basic_arithmetic", "word_sequence_reversal", "needle_haystack"),
    size=500, test_size=48, seed=31, shots=2,
    config={"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                 "operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False},
            "word_sequence_reversal": {"min_words": 2, "max_words": 4},
            "needle_haystack": {"min_num_statements": 2, "max_num_statements": 5}})


def cache_key() -> str:
    """Changes with the request and the installed reasoning-gym (whose generators make the rows)."""
    try:
        version = metadata.version("reasoning-gym")
    except metadata.PackageNotFoundError:
        version = "missing"
    text = json.dumps([REQUEST.tasks, REQUEST.size, REQUEST.test_size, REQUEST.seed, REQUEST.shots,
                       REQUEST.config, version], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]
