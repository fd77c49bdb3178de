"""The multi-turn tool loop with a scripted engine: the response layout (the
sampled ids, the template's tool turn, the next sampled ids), its masks and
log-probs, and every limit (length, turns, calls per turn)."""

from __future__ import annotations

import pytest
import torch

from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts, Sample
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.tool_loop import ToolRollout, TurnLimits
from thinkrl.rollout.tool_turns import ToolTurnTokens
from thinkrl.tools.calculator import Calculator
from thinkrl.tools.calls import hermes_call
from thinkrl.tools.registry import Tool, ToolRunner

CALL = hermes_call("calculator", {"expression": "1234 + 4321"})


class ScriptedEngine:
    """Answers each context with the text `script(context text)`; token k of a
    turn gets log-prob -(k + 1) / 100. Records every context it was given."""

    version = 0

    def __init__(self, tokenizer, script) -> None:
        self.tokenizer, self.script, self.contexts, self.turns = tokenizer, script, [], []

    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        rows, eos = [], self.tokenizer.eos_token_id
        for ids, mask in zip(prompts.input_ids.tolist(), prompts.attention_mask.tolist()):
            context = [t for t, m in zip(ids, mask) if m]
            for _ in range(params.n):
                self.contexts.append(context)
                text = self.script(self.tokenizer.decode(context))
                turn = (self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])[:params.max_tokens]
                self.turns.append(turn)
                rows.append(turn)
        width = max(len(r) for r in rows)
        n = len(rows)
        out = torch.full((n, width), self.tokenizer.pad_token_id)
        mask = torch.zeros((n, width), dtype=torch.long)
        logprobs = torch.zeros((n, width))
        for k, row in enumerate(rows):
            out[k, :len(row)] = torch.tensor(row)
            mask[k, :len(row)] = 1
            logprobs[k, :len(row)] = -(torch.arange(len(row)) + 1) / 100
        g = params.n
        return Rollouts(prompts.input_ids.repeat_interleave(g, 0), prompts.attention_mask.repeat_interleave(g, 0),
                        out, mask, logprobs, [FINISH_STOP] * n, torch.arange(len(prompts)).repeat_interleave(g),
                        [s for s in prompts.samples for _ in range(g)])


@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def loop(tokenizer, script, **limits):
    engine = ScriptedEngine(tokenizer, script)
    calculator = Calculator()
    runner = ToolRunner([Tool("calculator", calculator.schema, calculator.execute)], concurrency=4,
                        timeout_s=5)
    turns = ToolTurnTokens(tokenizer, end_of_turn_ids=[tokenizer.eos_token_id])
    return engine, turns, ToolRollout(engine, tokenizer=tokenizer, runner=runner, turn_tokens=turns,
                                      limits=TurnLimits(**limits), eos_token_ids=[tokenizer.eos_token_id])


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
    tool = list(turns.ids(("5555",)))
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
    assert out.turns.assistant_turns.tolist() == [2] * 4 and out.turns.tool_calls.tolist() == [1] * 4
    assert out.turns.tool_errors.tolist() == [0] * 4
    assert out.response_lengths.tolist() == [len(expected)] * 4


def test_a_tool_message_that_does_not_fit_ends_the_response_before_it(tokenizer):
    engine, turns, rollout = loop(tokenizer, calculator_script)
    first_len = len(tokenizer(CALL, add_special_tokens=False)["input_ids"]) + 1
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=first_len + 3))
    assert out.finish_reasons == [FINISH_LENGTH]
    assert out.response_mask.sum().item() == first_len == out.response_attention.sum().item()
    assert out.turns.tool_calls.tolist() == [1] and out.turns.assistant_turns.tolist() == [1]
    assert out.turns.tool_turns.tolist() == [0]  # the dropped tool message is not a turn


def test_a_turn_is_cut_at_the_responses_remaining_length(tokenizer):
    engine, turns, rollout = loop(tokenizer, lambda c: CALL if "5555" not in c.split("add 1234")[-1]
                                  else "the answer is " * 20 + "#### 5555")
    budget = 80
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=budget))
    assert out.response_attention.sum().item() == budget and out.finish_reasons == [FINISH_LENGTH]


def test_turn_limits_and_calls_per_turn(tokenizer):
    _, _, rollout = loop(tokenizer, calculator_script, max_assistant_turns=1)
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=200))
    assert out.turns.assistant_turns.tolist() == [1] and out.turns.tool_calls.tolist() == [0]

    _, _, rollout = loop(tokenizer, lambda c: CALL, max_user_turns=2)
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=400))
    assert out.turns.tool_turns.tolist() == [2] and out.turns.assistant_turns.tolist() == [3]

    engine, turns, rollout = loop(tokenizer, lambda c: CALL + CALL if "5555" not in c.split("add 1234")[-1]
                                  else "#### 5555", max_parallel_calls=1)
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=400))
    assert out.turns.tool_calls.tolist() == [2] and out.turns.tool_errors.tolist() == [1]
    assert "only 1 tool call(s) run per turn" in tokenizer.decode(engine.contexts[-1])


def test_a_malformed_call_is_answered_with_its_error(tokenizer):
    engine, _, rollout = loop(tokenizer, lambda c: "<tool_call>{oops</tool_call>"
                              if "error" not in c else "#### 0")
    out = rollout.generate(prompts(tokenizer), SamplingParams(n=1, max_tokens=200))
    assert out.turns.tool_errors.tolist() == [1]
    assert "error: the tool call is not valid JSON" in tokenizer.decode(engine.contexts[-1])


def test_qwen25_tool_turns_are_its_templates_user_turn_with_tool_responses():
    from pathlib import Path

    from transformers import AutoTokenizer

    from thinkrl.tools.calculator import SCHEMA

    folder = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tokenizers" / "qwen2.5"
    if not (folder / "vocab.json").is_file():
        pytest.skip("../shared/data (the Qwen2.5 tokenizer) is absent")
    qwen = AutoTokenizer.from_pretrained(folder)
    turns = ToolTurnTokens(qwen, end_of_turn_ids=[qwen.convert_tokens_to_ids("<|im_end|>")],
                           chat_kwargs={"tools": [SCHEMA]})
    assert qwen.decode(list(turns.ids(("42", "error: x")))) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\nerror: x\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")
