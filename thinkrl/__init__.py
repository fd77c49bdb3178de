"""thinkrl: reinforcement learning from verifiable rewards (GRPO and its relatives).

From Python: `thinkrl.train(recipe, overrides)` and
`thinkrl.resolved_config(...)` (`thinkrl.api`); from the shell: `thinkrl
train` (`thinkrl.cli`)."""


def train(*args, **kwargs):
    """`thinkrl.api.train`: a run from Python, returning its result and metrics."""
    from thinkrl.api import train as _train

    return _train(*args, **kwargs)


def resolved_config(*args, **kwargs):
    """`thinkrl.api.resolved_config`: the resolved, validated config a run would use."""
    from thinkrl.api import resolved_config as _resolved

    return _resolved(*args, **kwargs)
