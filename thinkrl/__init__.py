"""thinkrl: reinforcement learning from verifiable rewards (GRPO and its relatives).

From Python: `thinkrl.train(recipe, overrides)` and
`thinkrl.resolved_config(...)` (`thinkrl.api`, which imports the run's
modules only when called); from the shell: `thinkrl train` (`thinkrl.cli`)."""

from thinkrl.api import resolved_config, train

__all__ = ["resolved_config", "train"]
