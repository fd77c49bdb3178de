"""The tiny model of the built-in tool task (`thinkrl.data.calc`), made here:
the same tokenizer recipe and Qwen2 shape as `thinkrl.models.tiny`,
pretrained on dialogues where a share of the answers call the calculator
(`<tool_call>` JSON, then the tool's message, then the answer) and the rest
do the sum in the head. Its tool turns are the ids `TurnTokens.tool_ids` makes at
rollout time, so pretraining and RL see the same token layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from thinkrl.data import calc
from thinkrl.models.tiny import TinyModelSpec, build_tokenizer, seeded_build, train_on
from thinkrl.envs.turn_tokens import TurnTokens


@dataclass(frozen=True)
class CalcModelSpec(TinyModelSpec):
    task: str = "calc"
    tool_rate: float = 0.5
    """Share of pretraining answers that call the calculator."""
    pretrain_steps: int = 1500
    build_version: int = 1


def encode_dialogue(tokenizer, turn_tokens: TurnTokens, question: str, turns: list[str],
                    tool_answers: list[str]) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a dialogue: the prompt and tool turns are context
    (0), the assistant turns with their end token are trained on (1)."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    for k, turn in enumerate(turns):
        said = tokenizer(turn + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        ids, mask = ids + said, mask + [1] * len(said)
        if k < len(tool_answers):
            inserted = list(turn_tokens.tool_ids((tool_answers[k],)))
            ids, mask = ids + inserted, mask + [0] * len(inserted)
    return ids, mask


def build_calc_model(out_dir: str | Path, spec: CalcModelSpec = CalcModelSpec(), *, log=print) -> Path:
    """Tokenizer + Qwen2 model + pretraining on calculator dialogues, saved atomically."""
    out_dir = Path(out_dir)
    problems, _ = calc.split_problems(train=spec.pretrain_problems, test=calc.TEST_SIZE)
    dialogues = calc.pretraining_dialogues(problems, tool_rate=spec.tool_rate, seed=spec.seed)
    answers = {calc.prompt_text(p): str(p.answer) for p in problems}
    texts = [q + "\n" + "\n".join(turns) + "\ntool\n" + answers[q] for q, turns in dialogues]
    tokenizer = build_tokenizer(texts, vocab_size=spec.vocab_size)
    turn_tokens = TurnTokens(tokenizer, end_of_turn_ids=[tokenizer.eos_token_id])
    encoded = [encode_dialogue(tokenizer, turn_tokens, q, turns, [answers[q]] * (len(turns) - 1))
               for q, turns in dialogues]
    return seeded_build(spec, tokenizer, out_dir, name="tiny calculator model", log=log,
                        train=lambda model: train_on(model, encoded, spec,
                                                     pad_token_id=tokenizer.pad_token_id, log=log))
