"""Checks of `reward.verifiers` / `reward.verifier_weights` (MindSpeed-RL's rule
verifiers, `thinkrl.rewards.verifiers`).

The names live here, not beside the functions, so that config checks do not
import the math checker (sympy takes seconds to load); a test pins the two
lists equal.
"""

from __future__ import annotations

import difflib

VERIFIER_NAMES = ("format", "strict_format", "base_acc", "acc")
"""The verifiers thinkrl implements, by MindSpeed-RL's names."""
MINDSPEED_ONLY = ("step", "math_17k_acc", "acc_for_dapo", "acc_for_ppo", "math_verify_reward",
                  "retool_reward")
"""MindSpeed-RL verifiers thinkrl does not implement."""


def verifier_problems(names: list[str], weights: list[float]) -> list[str]:
    """What is wrong with these verifier names and weights, one line each."""
    problems = []
    if len(names) != len(weights):
        problems.append(f"reward.verifiers has {len(names)} name(s) but reward.verifier_weights "
                        f"has {len(weights)} weight(s); give one weight per verifier, e.g. "
                        f"reward.verifier_weights=[{', '.join(['1.0'] * len(names))}]")
    for name in names:
        if name in VERIFIER_NAMES:
            continue
        close = difflib.get_close_matches(name, VERIFIER_NAMES, n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        missing = (" (a MindSpeed-RL verifier thinkrl does not implement; a file in "
                   "custom_reward_function.path can hold your own)") if name in MINDSPEED_ONLY else ""
        problems.append(f"reward.verifiers: unknown verifier {name!r}{missing}; {hint}known: "
                        f"{', '.join(VERIFIER_NAMES)}")
    return problems


def reward_verifier_problems(reward, custom_path: str | None) -> list[str]:
    """`verifier_problems` of a `RewardConfig`, plus settings the verifiers would override."""
    if not reward.verifiers and not reward.verifier_weights:
        return []
    problems = verifier_problems(list(reward.verifiers), list(reward.verifier_weights))
    if reward.scorer != "auto":
        problems.append(f"reward.verifiers={list(reward.verifiers)} and reward.scorer="
                        f"{reward.scorer}: the verifiers score every row; remove one of them")
    if custom_path:
        problems.append(f"reward.verifiers={list(reward.verifiers)} and custom_reward_function."
                        f"path={custom_path}: the custom function scores every row; remove one")
    return problems
