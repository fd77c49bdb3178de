"""verl's simulated users run unchanged: an interaction file in verl's
format, a class written against verl's BaseInteraction (importable without
verl), rows choosing it with extra_info.interaction_kwargs.name, the
interaction's reply as the next user turn, its scores reaching the reward
function as turn_scores, num_turns counted as verl counts them."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from scripted_engine import ScriptedEngine
from thinkrl.envs.loop import EnvRollout, LoopLimits
from thinkrl.envs.routing import EnvRouter, build_entry, read_entries
from thinkrl.envs.turn_tokens import TurnTokens
from thinkrl.records import SINGLE_TURN, PromptBatch, Sample
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rewards.scoring import decode_responses, score_rollouts
from thinkrl.rollout.base import SamplingParams

CONFIG = """\
interaction:
  - name: "sums"
    class_name: "verl_style_interaction.SumsInteraction"
    config: {}
"""


@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def router(tmp_path):
    path = tmp_path / "interaction_config.yaml"
    path.write_text(CONFIG)
    named = {e.name: build_entry(e, default_timeout_s=10, concurrency=4) for e in read_entries(path)}
    router = EnvRouter(named=named, by_data_source={}, default=SINGLE_TURN, wrap_tools=None, builtins={})
    yield router
    router.close()


def sum_rows(tokenizer, answers) -> PromptBatch:
    messages = ({"role": "user", "content": "What is 2 + 3? Write the answer after ####."},)
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]] * len(answers))
    samples = [Sample("openai/gsm8k", str(a), text, index=i, messages=messages,
                      extra_info={"interaction_kwargs": {"name": "sums", "query": "2 + 3", "ground_truth": str(a)}})
               for i, a in enumerate(answers)]
    return PromptBatch(ids, torch.ones_like(ids), samples)


def second_try_is_right(context: str) -> str:
    return "#### 5" if "incorrect" in context else "#### 4"


def test_the_file_reads_as_verl_reads_it_and_imports_without_verl(router):
    if importlib.util.find_spec("verl") is None:
        assert "verl" not in sys.modules  # the stand-in base class was only there for the import
    interaction = router.named["sums"].interaction
    assert interaction.name == "sums" and interaction.config == {"name": "sums"}
    assert type(interaction).__mro__[1].__name__ == "BaseInteraction"


def test_a_wrong_answer_gets_the_users_reply_and_a_second_turn(tokenizer, router):
    engine = ScriptedEngine(tokenizer, second_try_is_right)
    turns = TurnTokens(tokenizer, end_of_turn_ids=[tokenizer.eos_token_id])
    rollout = EnvRollout(engine, tokenizer=tokenizer, router=router, turn_tokens=turns,
                         limits=LoopLimits(max_user_turns=5), eos_token_ids=[tokenizer.eos_token_id])
    out = rollout.generate(sum_rows(tokenizer, [5, 7]), SamplingParams(n=1, max_tokens=300))
    assert out.turns.environments == ["sums", "sums"]
    # row 0: "#### 4" (wrong), reply, "#### 5" (right), "correct" reply written, done: 1 + 2 + 2 turns;
    # row 1 is never right: 5 user turns, and (as in verl) the turn after the last one
    assert (out.turns.assistant_turns + out.turns.env_turns + 1).tolist() == [5, 12]
    assert out.turns.turn_rewards == [[0.0, 1.0], [0.0] * 5]
    text = tokenizer.decode(out.response_ids[0, :int(out.response_lengths[0])])
    assert "<|im_start|>user\nYour response is incorrect! Try again.<|im_end|>" in text
    assert text.rstrip().endswith("<|im_start|>user\nYour response is correct!<|im_end|>\n<|im_start|>assistant")
    assert out.response_mask[0].sum() < out.response_attention[0].sum()  # the user turns are masked
    assert len(router.named["sums"].interaction.finalized) == 2  # every conversation finalized

    seen = []

    def reward_fn(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info)
        return 1.0 if f"#### {ground_truth}" in solution_str else 0.0
    scored = score_rollouts(RewardScorer.from_function(reward_fn), out, decode_responses(out, tokenizer))
    assert scored.scores.tolist() == [1.0, 0.0]  # verl: the reward function scores, not the turn scores
    assert seen[0]["turn_scores"] == [0.0, 1.0] and seen[0]["num_turns"] == 5
    assert seen[0]["interaction_kwargs"]["query"] == "2 + 3"


def test_a_row_naming_an_unknown_interaction_is_refused_with_the_closest_name(tokenizer, router):
    batch = sum_rows(tokenizer, [5])
    sample = batch.samples[0]
    wrong = Sample(sample.data_source, "5", sample.prompt_text, index=3,
                   extra_info={"interaction_kwargs": {"name": "sum"}})
    with pytest.raises(ValueError, match=r"row 3 .*'sum'.*did you mean 'sums'"):
        router.check([wrong], key="data.train_files")


def test_entries_are_checked_when_read(tmp_path):
    cases = {"interaction: []": "non-empty",
             "interaction:\n  - config: {}": "needs class_name",
             "interaction:\n  - {class_name: a.B}\n  - {class_name: c.B}": "duplicate interaction name 'b'",
             "interaction:\n  - {class_name: a.B, workers: -1}": "workers=-1",
             "interaction:\n  - {name: tool_agent, class_name: a.B}": "built-in environment"}
    for text, message in cases.items():
        path = tmp_path / "f.yaml"
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_entries(path)
    # verl's default name: the class name without "Interaction", lower case
    path = tmp_path / "g.yaml"
    path.write_text("interaction:\n  - class_name: verl_style_interaction.SumsInteraction\n    config: {}\n")
    assert [e.name for e in read_entries(path)] == ["sums"]
    with pytest.raises(ValueError, match="cannot import nowhere.Thing"):
        build_entry(read_entries(path)[0].__class__("x", "nowhere.Thing", where="here"), default_timeout_s=1, concurrency=1)
