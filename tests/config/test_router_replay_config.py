"""Router replay's keys: verl's two spellings as one setting, and what it
cannot run with refused key by key."""

from __future__ import annotations

import pytest

from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.config.moe_checks import router_replay_mode
from thinkrl.errors import UserError

A = "actor_rollout_ref.actor.router_replay.mode"
M = "actor_rollout_ref.actor.megatron.router_replay.mode"


@pytest.mark.parametrize("overrides, mode", [([], "disabled"), ([f"{A}=R3"], "R3"), ([f"{M}=R2"], "R2"),
                                             ([f"{A}=R3", f"{M}=R3"], "R3")])
def test_either_spelling_sets_the_mode(overrides, mode):
    cfg = load_config("tiny", overrides)
    validate(cfg)
    assert router_replay_mode(cfg) == mode


@pytest.mark.parametrize("overrides, said", [
    ([f"{A}=R4"], "use one of disabled, R2, R3"),
    ([f"{A}=R2", f"{M}=R3"], "they are one setting"),
    ([f"{A}=R3", "actor_rollout_ref.rollout.name=vllm"], "records the rollout's experts in its native engine only"),
    ([f"{M}=R2", "actor_rollout_ref.rollout.enable_rollout_routing_replay=True"], "verl refuses both at once"),
    ([f"{A}=R3", "async_training.mode=one_step_off"], "synchronous single-turn rollouts"),
    ([f"{A}=R2", "actor_rollout_ref.actor.use_rollout_log_probs=True"], "old log-probs the trainer computes"),
])
def test_what_it_cannot_run_with_is_refused(overrides, said):
    with pytest.raises(UserError) as caught:
        validate(load_config("tiny", overrides))
    assert said in str(caught.value), str(caught.value)


def test_the_model_must_be_a_replayable_mixture_with_two_experts_a_token():
    from transformers import MixtralConfig, Qwen2Config, Qwen3MoeConfig

    from thinkrl.errors import SetupError
    from thinkrl.preflight import check_replayable

    check_replayable(Qwen3MoeConfig(num_experts=8, num_experts_per_tok=2), "m", "R3")
    for config, said in ((Qwen2Config(), "has no experts"), (MixtralConfig(), "is not one of them"),
                         (Qwen3MoeConfig(num_experts=8, num_experts_per_tok=1), "one expert per token")):
        with pytest.raises(SetupError, match=said):
            check_replayable(config, "m", "R3")
