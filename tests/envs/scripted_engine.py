"""A rollout engine that answers from a script, for environment-loop tests:
each context (the prompt, or prompt + conversation so far) gets the text
`script(context text)` then EOS; token k of a turn gets log-prob -(k + 1) / 100."""

from __future__ import annotations

import torch

from thinkrl.records import FINISH_STOP, PromptBatch, Rollouts
from thinkrl.rollout.base import SamplingParams


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
