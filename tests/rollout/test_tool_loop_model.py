"""Token in, token out with a real model and engine: a small model pretrained
to call the calculator runs the tool loop in the native engine; at every turn
boundary the response holds exactly the ids and log-probs the engine sampled,
and a teacher-forced forward over the whole response (tool turns included)
gives those log-probs back. A re-tokenised conversation, or a separator
token dropped at a boundary, shifts the context and breaks the match."""

from __future__ import annotations

import pytest
import torch

from thinkrl.data import calc
from thinkrl.models.forward import response_logprobs
from thinkrl.records import PromptBatch, Sample
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine
from thinkrl.envs.loop import EnvRollout, LoopLimits
from thinkrl.envs.routing import TOOL_AGENT, EnvRouter
from thinkrl.envs.tool_env import ToolEnvironment, ToolLimits
from thinkrl.envs.turn_tokens import TurnTokens
from thinkrl.tools.calculator import Calculator
from thinkrl.tools.registry import Tool, ToolRunner


@pytest.fixture(scope="module")
def calc_model(calc_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(calc_model_dir).eval(),
            AutoTokenizer.from_pretrained(calc_model_dir))


class Recording:
    """The native engine, remembering what each generate call returned."""

    def __init__(self, engine: NativeEngine) -> None:
        self.engine, self.calls, self.version = engine, [], 0

    def generate(self, prompts, params):
        out = self.engine.generate(prompts, params)
        self.calls.append(out)
        return out


def test_sampled_ids_and_logprobs_survive_every_turn_boundary(calc_model):
    model, tokenizer = calc_model
    eos = tokenizer.eos_token_id
    engine = Recording(NativeEngine(model, eos_token_ids=[eos], pad_token_id=tokenizer.pad_token_id, seed=3))
    calculator = Calculator()
    runner = ToolRunner([Tool("calculator", calculator.schema, calculator.execute)], concurrency=4, timeout_s=5)
    router = EnvRouter(named={}, by_data_source={}, default=TOOL_AGENT, builtins={},
                       wrap_tools=lambda inner: ToolEnvironment(runner, ToolLimits(), inner=inner))
    rollout = EnvRollout(engine, tokenizer=tokenizer, router=router,
                         turn_tokens=TurnTokens(tokenizer, end_of_turn_ids=[eos]),
                         limits=LoopLimits(max_assistant_turns=3), eos_token_ids=[eos])
    _, problems = calc.split_problems(train=10, test=6)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": calc.prompt_text(p)}],
                                           tokenize=False, add_generation_prompt=True) for p in problems]
    batch = tokenizer(texts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
    prompts = PromptBatch(batch.input_ids, batch.attention_mask,
                          [Sample(calc.DATA_SOURCE, str(p.answer), t) for p, t in zip(problems, texts)])
    out = rollout.generate(prompts, SamplingParams(n=2, max_tokens=96, temperature=0.7))

    assert (out.turns.assistant_turns >= 2).sum() >= 4, out.turns  # the loop did go round
    # Each row's sampled stretches are, in order, the engine's turns for that row.
    live = list(range(len(out)))
    stretches = [_stretches(out.response_mask[i]) for i in range(len(out))]
    for k, call in enumerate(engine.calls):
        for j, row in enumerate(live):
            start, end = stretches[row][k]
            n = end - start
            assert out.response_ids[row, start:end].tolist() == call.response_ids[j, :n].tolist()
            assert torch.equal(out.rollout_logprobs[row, start:end], call.rollout_logprobs[j, :n])
        live = [row for row in live if len(stretches[row]) > k + 1]
    # A forward over prompt + whole response gives the sampled log-probs back.
    input_ids, attention_mask, position_ids = out.sequences()
    with torch.no_grad():
        forward, _ = response_logprobs(model, input_ids, attention_mask, position_ids,
                                       response_length=out.response_ids.shape[1], temperature=0.7)
    sampled = out.response_mask.bool()
    torch.testing.assert_close(forward[sampled], out.rollout_logprobs[sampled], atol=2e-4, rtol=1e-4)
    # The tools answered: every second turn follows a tool message with the right sum.
    decoded = tokenizer.decode(out.response_ids[0][out.response_attention[0].bool()])
    assert "<|im_start|>tool\n" in decoded, decoded


def _stretches(mask: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in `mask`."""
    runs, start = [], None
    for t, m in enumerate(mask.tolist() + [0]):
        if m and start is None:
            start = t
        if not m and start is not None:
            runs.append((start, t))
            start = None
    return runs
