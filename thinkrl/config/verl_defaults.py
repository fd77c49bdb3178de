"""Where thinkrl's defaults differ from verl's, and why: said at start when a
verl line runs on thinkrl's defaults (no recipe), so a verl user is not
surprised by a key they never set.

verl's values: `verl/trainer/config/ppo_trainer.yaml` and the fully-async
recipe's `fully_async_ppo_trainer.yaml`.
"""

from __future__ import annotations

from collections.abc import Sequence

DIFFERENCES = {
    "algorithm.adv_estimator": ("gae", "grpo", "the critic-free recipes thinkrl runs (verl's default "
                                "is PPO with a critic)"),
    "trainer.n_gpus_per_node": (8, 1, "one device unless told: the same line runs on a laptop"),
    "trainer.device": ("cuda", "auto", "CUDA, else an Ascend NPU, else the CPU: the same line runs on "
                       "each"),
    "async_training.partial_rollout": (True, None, "off in batch mode, on with streaming: a seeded run repeats "
                                       "and a resume is exact (in batch mode, which decoding chunk a weight "
                                       "sync lands on depends on timing)"),
}
"""dotted key -> (verl's default, thinkrl's, why)."""


def differences_note(overrides: Sequence[str]) -> str | None:
    """One line naming the differences the overrides leave in force; None when they set them all."""
    given = {item.partition("=")[0].lstrip("+~") for item in overrides}
    asynchronous = any(key.startswith("async_training.") for key in given)
    left = [f"{key}={_shown(ours)} (verl: {_shown(theirs)}; {why})"
            for key, (theirs, ours, why) in DIFFERENCES.items()
            if key not in given and (asynchronous or not key.startswith("async_training."))]
    if not left:
        return None
    return "thinkrl's defaults that differ from verl's, in force here: " + "; ".join(left)


def _shown(value) -> str:
    return "unset" if value is None else str(value)
