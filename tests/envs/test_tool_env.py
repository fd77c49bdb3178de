"""The tool loop (the tool environment in the environment loop) with a
scripted engine: the response layout (the sampled ids, the template's tool
turn, the next sampled ids), its masks and log-probs, and every limit
(length, turns, calls per turn)."""

from __future__ import annotations

import pytest
import torch

from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts, Sample
from thinkrl.envs.loop import EnvRollout, LoopLimits
from thinkrl.envs.routing import TOOL_AGENT, EnvRouter
from thinkrl.envs.tool_env import ToolEnvironment, ToolLimits
from thinkrl.envs.turn_tokens import TurnTokens
from thinkrl.rollout.base import SamplingParams
from thinkrl.tools.calculator import Calculator
from thinkrl.tools.calls import hermes_call
from thinkrl.tools.registry import Tool, ToolRunner

from scripted_engine import ScriptedEngine

CALL = hermes_call("calculator", {"expression": "1234 + 4321"})


@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def loop(tokenizer, script, *, max_parallel_calls=1, **limits):
    engine = ScriptedEngine(tokenizer, script)
    calculator = Calculator()
    runner = ToolRunner([Tool("calculator", calculator.schema, calculator.execute)], concurrency=4,
                        timeout_s=5)
    tool_limits = ToolLimits(max_parallel_calls=max_parallel_calls)
    router = EnvRouter(named={}, by_data_source={}, default=TOOL_AGENT, builtins={},
                       wrap_tools=lambda inner: ToolEnvironment(runner, tool_limits, inner=inner))
    turns = TurnTokens(tokenizer, end_of_turn_ids=[tokenizer.eos_token_id])
    return engine, turns, EnvRollout(engine, tokenizer=tokenizer, router=router, turn_tokens=turns,
                                     limits=LoopLimits(**limits), eos_token_ids=[tokenizer.eos_token_id])


def tool_counts(out, name: str) -> list[float]:
    return [m.get(name, 0.0) for m in out.turns.metrics]


def prompts(tokenizer, count=1) -> PromptBatch:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "add 1234 and 4321"}],
                                         tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]] * count)
    return PromptBatch(ids, torch.ones_like(ids), [Sample("thinkrl/calc", "5555", text)] * count)


def calculator_script(context: str) -> str:
    return "#### 5555" if "5555" in context.split("add 1234")[-1] else CALL


def test_a_tool_turn_sits_between_the_sampled_turns_token_for_token(tokenizer):
    engine, turns, rollout = loop(tokenizer, calculator_script)
    batch = prompts(tokenizer, 2)
    out = rollout.generate(batch, SamplingParams(n=2, max_tokens=200))
    first, second = engine.turns[0], engine.turns[-1]
    tool = list(turns.tool_ids(("5555",)))
    expected = first + tool + second
    assert len(out) == 4 and out.finish_reasons == [FINISH_STOP] * 4
    for row in range(4):
        n = len(expected)
        assert out.response_ids[row, :n].tolist() == expected
        assert out.response_mask[row, :n].tolist() == [1] * len(first) + [0] * len(tool) + [1] * len(second)
        assert out.response_attention[row, :n].tolist() == [1] * n
        assert out.rollout_logprobs[row, len(first):len(first) + len(tool)].abs().sum() == 0
        assert out.rollout_logprobs[row, :len(first)].tolist() == pytest.approx(
            [-(k + 1) / 100 for k in range(len(first))])
    # The second turn was generated from exactly prompt + first turn + tool turn.
    prompt = batch.input_ids[0].tolist()
    assert engine.contexts[-1] == prompt + first + tool
    # The template's separator after the end-of-turn token is kept (verl #6501).
    text = tokenizer.decode(tool)
    assert text == "\n<|im_start|>tool\n5555<|im_end|>\n<|im_start|>assistant\n", text
    assert out.turns.assistant_turns.tolist() == [2] * 4 and tool_counts(out, "tool_calls") == [1] * 4
    assert tool_counts(out, "tool_errors") == [0] * 4 and out.turns.environments == [TOOL_AGENT] * 4
    assert out.response_lengths.tolist() == [len(expected)] * 4


def test_a_tool_message_that_does_not_fit_ends_the_response_before_it(tokenizer):
    engine, turns, rollout = loop(tokenizer, calculator_script)
    first_len = len(tokenizer(CALL, add_special_tokens=False)["input_ids"]) + 1
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=first_len + 3))
    assert out.finish_reasons == [FINISH_LENGTH]
    assert out.response_mask.sum().item() == first_len == out.response_attention.sum().item()
    assert tool_counts(out, "tool_calls") == [1] and out.turns.assistant_turns.tolist() == [1]
    assert out.turns.env_turns.tolist() == [0]  # the dropped tool message is not a turn


def test_a_turn_is_cut_at_the_responses_remaining_length(tokenizer):
    engine, turns, rollout = loop(tokenizer, lambda c: CALL if "5555" not in c.split("add 1234")[-1]
                                  else "the answer is " * 20 + "#### 5555")
    budget = 80
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=budget))
    assert out.response_attention.sum().item() == budget and out.finish_reasons == [FINISH_LENGTH]


def test_turn_limits_and_calls_per_turn(tokenizer):
    _, _, rollout = loop(tokenizer, calculator_script, max_assistant_turns=1)
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=200))
    assert out.turns.assistant_turns.tolist() == [1] and tool_counts(out, "tool_calls") == [0]

    _, _, rollout = loop(tokenizer, lambda c: CALL, max_user_turns=2)
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=400))
    assert out.turns.env_turns.tolist() == [2] and out.turns.assistant_turns.tolist() == [3]

    engine, turns, rollout = loop(tokenizer, lambda c: CALL + CALL if "5555" not in c.split("add 1234")[-1]
                                  else "#### 5555", max_parallel_calls=1)
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=400))
    assert tool_counts(out, "tool_calls") == [2] and tool_counts(out, "tool_errors") == [1]
    assert "only 1 tool call(s) run per turn" in tokenizer.decode(engine.contexts[-1])


def test_a_malformed_call_is_answered_with_its_error(tokenizer):
    engine, _, rollout = loop(tokenizer, lambda c: "<tool_call>{oops</tool_call>"
                              if "error" not in c else "#### 0")
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=200))
    assert tool_counts(out, "tool_errors") == [1]
    assert "error: the tool call is not valid JSON" in tokenizer.decode(engine.contexts[-1])


def test_qwen25_tool_turns_are_its_templates_user_turn_with_tool_responses():
    from pathlib import Path

    from transformers import AutoTokenizer

    from thinkrl.tools.calculator import SCHEMA

    folder = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tokenizers" / "qwen2.5"
    if not (folder / "vocab.json").is_file():
        pytest.skip("../shared/data (the Qwen2.5 tokenizer) is absent")
    qwen = AutoTokenizer.from_pretrained(folder)
    turns = TurnTokens(qwen, end_of_turn_ids=[qwen.convert_tokens_to_ids("<|im_end|>")],
                       chat_kwargs={"tools": [SCHEMA]})
    assert qwen.decode(list(turns.tool_ids(("42", "error: x")))) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\nerror: x\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")
