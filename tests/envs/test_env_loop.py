"""The environment loop with a scripted engine and small environments: the
conversation's layout (sampled turns, the environment's user turns masked),
rewards and scores, a mixed batch, turn limits, and every fault (raise,
hang, garbage, a worker process that exits or hangs) ending only its own
conversation, with reward 0, counted by kind, within the deadline."""

from __future__ import annotations

import re
import time

import pytest
import torch

from scripted_engine import ScriptedEngine
from toy_envs import Guess, Misbehaving
from thinkrl.envs.loop import EnvRollout, LoopLimits
from thinkrl.envs.routing import EnvEntry, EnvRouter
from thinkrl.envs.server import ServedEnvironment
from thinkrl.envs.turn_tokens import TurnTokens
from thinkrl.records import FINISH_STOP, SINGLE_TURN, PromptBatch, Sample
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rewards.scoring import decode_responses, score_rollouts
from thinkrl.rollout.base import SamplingParams

@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def bisect(context: str) -> str:
    """Guess 1..20 by halving, from the hints so far in the conversation."""
    low, high = 1, 20
    for guess, hint in re.findall(r"I say (\d+)\D*?(higher|lower)", context, re.S):
        if hint == "higher":
            low = int(guess) + 1
        else:
            high = int(guess) - 1
    return f"I say {(low + high) // 2}"


def rows(tokenizer, secrets, *, source="toy/guess") -> PromptBatch:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "guess my number, 1 to 20"}],
                                         tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]] * len(secrets))
    return PromptBatch(ids, torch.ones_like(ids),
                       [Sample(source, str(s), text, index=i) for i, s in enumerate(secrets)])


def loop(tokenizer, env, *, script=bisect, by_data_source=None, **limits):
    engine = ScriptedEngine(tokenizer, script)
    router = EnvRouter(named={"guess": env}, by_data_source=by_data_source or {"toy/guess": "guess"},
                       default=SINGLE_TURN, wrap_tools=None, builtins={})
    turns = TurnTokens(tokenizer, end_of_turn_ids=[tokenizer.eos_token_id])
    return engine, turns, EnvRollout(engine, tokenizer=tokenizer, router=router, turn_tokens=turns,
                                     limits=LoopLimits(**limits), eos_token_ids=[tokenizer.eos_token_id])


def test_a_game_is_played_turn_by_turn_with_its_messages_masked(tokenizer):
    env = Guess()
    engine, turns, rollout = loop(tokenizer, env)
    out = rollout.generate(rows(tokenizer, [10, 7]), SamplingParams(n=2, max_tokens=400))
    # secret 10: the first guess (10) wins at once; secret 7: 10 lower, 4 higher, 7 right
    assert out.turns.assistant_turns.tolist() == [1, 1, 3, 3]
    assert out.turns.env_turns.tolist() == [0, 0, 2, 2]
    assert out.turns.env_rewards.tolist() == [1.0] * 4 and out.turns.env_scored.all()
    assert out.turns.turn_rewards[2] == [1.0] and out.turns.failures == [None] * 4  # hints give no reward
    assert out.finish_reasons == [FINISH_STOP] * 4 and env.closed == 4
    # row 2: sampled turn, the game's "lower" user turn (mask 0), sampled, "higher", sampled
    lower = list(turns.ids((("user", "lower"),)))
    first = engine.turns[2]  # the first turn of row 2 (the first call generates rows 0-3 in order)
    n = len(first)
    assert out.response_ids[2, n:n + len(lower)].tolist() == lower
    assert out.response_mask[2, n:n + len(lower)].tolist() == [0] * len(lower)
    assert out.response_attention[2, :out.response_lengths[2]].tolist() == [1] * int(out.response_lengths[2])
    assert tokenizer.decode(lower).startswith("\n<|im_start|>user\nlower<|im_end|>")
    scored = score_rollouts(RewardScorer.from_function(lambda **_: pytest.fail("the game scores")),
                            out, decode_responses(out, tokenizer))
    assert scored.scores.tolist() == [1.0] * 4


def test_done_with_a_message_writes_it_and_stops(tokenizer):
    _, turns, rollout = loop(tokenizer, Guess({"say_right": True}))
    out = rollout.generate(rows(tokenizer, [10]), SamplingParams(n=1, max_tokens=400))
    right = list(turns.ids((("user", "right"),)))
    length = int(out.response_lengths[0])
    assert out.response_ids[0, length - len(right):length].tolist() == right
    assert out.turns.env_turns.tolist() == [1] and out.turns.assistant_turns.tolist() == [1]


def test_single_turn_rows_beside_a_game_take_one_turn_and_the_reward_function(tokenizer):
    _, _, rollout = loop(tokenizer, Guess())
    batch = rows(tokenizer, [7, 7])
    batch.samples[1] = Sample("toy/other", "7", batch.samples[1].prompt_text, index=1)
    out = rollout.generate(batch, SamplingParams(n=1, max_tokens=400))
    assert out.turns.environments == ["guess", SINGLE_TURN]
    assert out.turns.assistant_turns.tolist() == [3, 1] and out.turns.env_turns.tolist() == [2, 0]
    seen = []

    def reward_fn(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, extra_info))
        return 0.25
    scored = score_rollouts(RewardScorer.from_function(reward_fn), out, decode_responses(out, tokenizer))
    assert scored.scores.tolist() == [1.0, 0.25]
    assert seen == [("toy/other", {"turn_scores": [], "num_turns": 2})]  # verl's additions, one turn

    alone = rows(tokenizer, [7])
    alone.samples[0] = Sample("toy/other", "7", alone.samples[0].prompt_text)
    plain = rollout.generate(alone, SamplingParams(n=1, max_tokens=50))
    assert plain.turns is None  # a batch with no environment is the engine's own output


def test_turn_limits_end_a_game(tokenizer):
    _, _, rollout = loop(tokenizer, Guess(), max_assistant_turns=2)
    out = rollout.generate(rows(tokenizer, [7]), SamplingParams(n=1, max_tokens=400))
    assert out.turns.assistant_turns.tolist() == [2] and out.turns.env_rewards.tolist() == [0.0]
    _, _, rollout = loop(tokenizer, Guess(), max_user_turns=1)
    out = rollout.generate(rows(tokenizer, [7]), SamplingParams(n=1, max_tokens=400))
    assert out.turns.env_turns.tolist() == [1] and out.turns.assistant_turns.tolist() == [2]


@pytest.mark.parametrize("how,at,kind", [("raise", "step", "raised"), ("raise", "reset", "raised"),
                                         ("garbage", "step", "invalid"), ("hang", "step", "timeout")])
def test_a_failing_environment_ends_only_its_conversation(tokenizer, caplog, how, at, kind):
    bad = Misbehaving({"how": how, "at": at, "seconds": 30})
    _, _, rollout = loop(tokenizer, bad, by_data_source={"toy/bad": "guess", "toy/guess": "good"},
                         step_timeout_s=0.5)
    rollout.router.named["good"] = Guess()
    batch = rows(tokenizer, [7, 7])
    batch.samples[0] = Sample("toy/bad", "7", batch.samples[0].prompt_text)
    start = time.monotonic()
    out = rollout.generate(batch, SamplingParams(n=2, max_tokens=400))
    assert time.monotonic() - start < 10  # the hung step was abandoned at its deadline
    assert out.turns.failures == [kind, kind, None, None]
    assert out.turns.env_rewards.tolist()[2:] == [1.0, 1.0]
    scored = score_rollouts(RewardScorer.from_function(lambda **_: 1.0), out, decode_responses(out, tokenizer))
    assert scored.scores.tolist() == [0.0, 0.0, 1.0, 1.0]
    warnings = [r for r in caplog.records if "env/guess/errors/" + kind in r.getMessage()]
    assert len(warnings) == 1  # one line per environment and kind


def test_an_environment_in_worker_processes_survives_its_crash_and_hang(tokenizer):
    entry = EnvEntry("guess", "toy_envs.Misbehaving", {"how": "exit", "at": "step"}, workers=2,
                     step_timeout_s=2.0, where="test")
    served = ServedEnvironment(entry, default_timeout_s=60, concurrency=32)
    try:
        assert served.scores is True
        _, _, rollout = loop(tokenizer, served)
        out = rollout.generate(rows(tokenizer, [7, 7]), SamplingParams(n=1, max_tokens=400))
        assert out.turns.failures == ["crashed", "crashed"]
        # the crashed workers are replaced: the next batch resets and fails the same way
        out = rollout.generate(rows(tokenizer, [7]), SamplingParams(n=1, max_tokens=400))
        assert out.turns.failures == ["crashed"]
    finally:
        served.shutdown()
    served = ServedEnvironment(EnvEntry("guess", "toy_envs.Misbehaving", {"how": "hang", "seconds": 60},
                                        workers=1, step_timeout_s=1.0, where="test"),
                               default_timeout_s=60, concurrency=32)
    try:
        _, _, rollout = loop(tokenizer, served)
        start = time.monotonic()
        out = rollout.generate(rows(tokenizer, [7]), SamplingParams(n=1, max_tokens=400))
        assert out.turns.failures == ["timeout"] and time.monotonic() - start < 15
        assert served._workers[0] is None  # its worker killed, not left running
    finally:
        served.shutdown()


def test_a_served_game_plays_like_the_in_process_one(tokenizer):
    served = ServedEnvironment(EnvEntry("guess", "toy_envs.Guess", {}, workers=2, where="test"),
                               default_timeout_s=60, concurrency=32)
    try:
        _, _, local = loop(tokenizer, Guess())
        _, _, remote = loop(tokenizer, served)
        params = SamplingParams(n=2, max_tokens=400)
        a = local.generate(rows(tokenizer, [3, 15]), params)
        b = remote.generate(rows(tokenizer, [3, 15]), params)
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
        assert a.turns.env_rewards.tolist() == b.turns.env_rewards.tolist() == [1.0] * 4
    finally:
        served.shutdown()


def test_the_retry_user_asks_again_and_the_last_answer_counts(tokenizer):
    pytest.importorskip("reasoning_gym")
    from thinkrl.data.prep.reasoning_gym import GymRequest, generate
    from thinkrl.envs.users import REPLY, RetryUser

    row = generate(GymRequest(tasks=("chain_sum",), size=1, test_size=0,
                              config={"chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}))["train"][0]
    answer = row["reward_model"]["ground_truth"]
    engine = ScriptedEngine(tokenizer, lambda c: f"<answer>{answer}</answer>" if REPLY in c
                            else "<answer>999</answer>")
    router = EnvRouter(named={}, by_data_source={"reasoning_gym/*": "retry_user"}, default=SINGLE_TURN,
                       wrap_tools=None, builtins={"retry_user": RetryUser})
    rollout = EnvRollout(engine, tokenizer=tokenizer, router=router,
                         turn_tokens=TurnTokens(tokenizer, end_of_turn_ids=[tokenizer.eos_token_id]),
                         limits=LoopLimits(), eos_token_ids=[tokenizer.eos_token_id])
    text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    sample = Sample(row["data_source"], answer, text, extra_info=row["extra_info"])
    out = rollout.generate(PromptBatch(ids, torch.ones_like(ids), [sample]), SamplingParams(n=1, max_tokens=200))
    assert out.turns.assistant_turns.tolist() == [2] and out.turns.metrics == [{"solved": 1.0}]
    assert out.turns.turn_rewards == [[0.0, 1.0]]
    scored = score_rollouts(RewardScorer.from_config(_config()), out, decode_responses(out, tokenizer))
    assert scored.scores.tolist() == [1.0]  # reasoning-gym reads the last <answer>
    with pytest.raises(ValueError, match="no reward function for data_source 'toy/none'"):
        RetryUser().check(Sample("toy/none", "1", "p"))


def _config():
    from thinkrl.config import load_config
    return load_config(None, ["reward.num_workers=0"])
