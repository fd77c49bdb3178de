"""Multi-turn rollouts with tools (``rollout.multi_turn.enable``), around any
rollout role: the engine generates a turn for every live response, the tool
calls in each turn run (concurrently, with deadlines), their answers go in
as the chat template's tool messages, and the engine continues every
response that called a tool, until none does, a turn limit is reached or the
response is ``max_tokens`` long.

Token in, token out: a response is the ids the engine sampled with their
log-probs, and between turns the ids of the tool messages from
`ToolTurnTokens`; nothing is decoded and encoded again. `response_mask` is
1 on sampled tokens and 0 on tool tokens (no loss, no KL there);
`response_attention` is 1 on both (the model reads them).

Limits, as verl's agent loop applies them: a turn is cut at the response's
remaining length; a tool message that would not fit ends the response
before it (finish reason "length"); ``max_assistant_turns`` and
``max_user_turns`` (tool turns) end it after the turn that reaches them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts, TurnStats
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.tool_turns import ToolTurnTokens
from thinkrl.tools.calls import ToolCall, parse_tool_calls
from thinkrl.tools.registry import ToolRunner, truncated
from thinkrl.workers.roles import RolloutRole


@dataclass(frozen=True)
class TurnLimits:
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    truncate_side: str = "middle"
    format: str = "hermes"


@dataclass
class Trajectory:
    """One response as it grows: sampled and inserted ids side by side."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # 1 sampled, 0 inserted (tool turns)
    logprobs: list[float] = field(default_factory=list)
    finish: str = FINISH_STOP
    assistant_turns: int = 0
    tool_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    pending: list[ToolCall] = field(default_factory=list)
    """The calls of the last turn, waiting for their answers."""

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.sampled += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


class ToolRollout:
    """A `RolloutRole` that runs the tool loop around `engine` (another
    `RolloutRole`: one process's engine, or the ray ranks' engines); weight
    syncs and generator state go to `engine` unchanged."""

    def __init__(self, engine: RolloutRole, *, tokenizer, runner: ToolRunner, turn_tokens: ToolTurnTokens,
                 limits: TurnLimits, eos_token_ids: list[int]) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.runner = runner
        self.turn_tokens = turn_tokens
        self.limits = limits
        self.eos = set(eos_token_ids)

    @property
    def version(self) -> int:
        return self.engine.version

    def sync_weights(self, version: int) -> dict[str, float]:
        return self.engine.sync_weights(version)

    def generator_state(self):
        return self.engine.generator_state()

    def set_generator_state(self, state) -> None:
        self.engine.set_generator_state(state)

    def __getattr__(self, name: str):  # the wrapped role's other calls (close, served, ...)
        return getattr(self.engine, name)

    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        if prompts.model_inputs is not None:
            raise ValueError("multi_turn: prompts with images are not supported in tool rollouts; "
                             "use text prompts or set actor_rollout_ref.rollout.multi_turn.enable=False")
        first = self.engine.generate(prompts, params)
        rows = [Trajectory(prompt=_unpadded(ids, mask)) for ids, mask
                in zip(first.prompt_ids.tolist(), first.prompt_mask.tolist())]
        live = self._take_turn(rows, range(len(rows)), first, params.max_tokens)
        while live:
            live = self._answer_tools(rows, live, params.max_tokens)
            if not live:
                break
            contexts = _context_batch(rows, live, [first.samples[i] for i in live],
                                      pad_token_id=self.tokenizer.pad_token_id)
            budget = max(params.max_tokens - len(rows[i].ids) for i in live)
            turn = self.engine.generate(contexts, dataclasses.replace(params, n=1, max_tokens=budget))
            live = self._take_turn(rows, live, turn, params.max_tokens)
        return _rollouts(first, rows, width=max([len(r.ids) for r in rows] + [1]),
                         pad_token_id=self.tokenizer.pad_token_id)

    def _take_turn(self, rows: list[Trajectory], index, turn: Rollouts, max_tokens: int) -> list[int]:
        """Append the turn each row in `index` generated (row k of `turn`);
        the rows that go on to a tool turn."""
        going_on = []
        for k, i in enumerate(index):
            row = rows[i]
            length = int(turn.response_mask[k].sum())
            room = max_tokens - len(row.ids)
            ids = turn.response_ids[k, :min(length, room)].tolist()
            row.add(ids, turn.rollout_logprobs[k, :len(ids)].tolist())
            row.assistant_turns += 1
            ended = bool(ids) and ids[-1] in self.eos
            row.finish = FINISH_STOP if ended else FINISH_LENGTH
            if not ended or len(row.ids) >= max_tokens or self._at_turn_limit(row):
                continue
            row.pending = parse_tool_calls(self.tokenizer.decode(ids, skip_special_tokens=False),
                                           format=self.limits.format)
            if row.pending:
                going_on.append(i)
        return going_on

    def _at_turn_limit(self, row: Trajectory) -> bool:
        a, u = self.limits.max_assistant_turns, self.limits.max_user_turns
        return (a is not None and row.assistant_turns >= a) or (u is not None and row.tool_turns >= u)

    def _answer_tools(self, rows: list[Trajectory], live: list[int], max_tokens: int) -> list[int]:
        """Run the calls of the `live` rows (all at once, bounded) and append
        each row's tool messages; the rows with room to continue."""
        cap = self.limits.max_parallel_calls
        calls: list[ToolCall] = []
        owners: list[int] = []
        for i in live:
            pending = rows[i].pending
            calls += pending[:cap] + [ToolCall(c.name, error=f"only {cap} tool call(s) run per turn; "
                                               "this one was not run") for c in pending[cap:]]
            owners += [i] * len(pending)
        outcomes = self.runner.run(calls)
        answers: dict[int, list[str]] = {i: [] for i in live}
        for i, outcome in zip(owners, outcomes):
            answers[i].append(truncated(outcome.text, self.limits.max_tool_response_length,
                                        self.limits.truncate_side))
            rows[i].tool_calls += 1
            rows[i].tool_errors += int(outcome.failed)
            rows[i].tool_seconds += outcome.seconds
        going_on = []
        for i in live:
            row = rows[i]
            ids = list(self.turn_tokens.ids(tuple(answers[i])))
            if len(row.ids) + len(ids) >= max_tokens:  # verl: the response ends before it
                row.finish = FINISH_LENGTH
                continue
            row.add(ids, None)
            row.tool_turns += 1
            going_on.append(i)
        return going_on


def _unpadded(ids: list[int], mask: list[int]) -> list[int]:
    return [t for t, m in zip(ids, mask) if m]


def _context_batch(rows: list[Trajectory], live: list[int], samples: list, *, pad_token_id: int) -> PromptBatch:
    """Prompt + response so far of each live row, left-padded, as the next turn's prompts."""
    contexts = [rows[i].prompt + rows[i].ids for i in live]
    width = max(len(c) for c in contexts)
    ids = torch.full((len(live), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(live), width), dtype=torch.long)
    for k, context in enumerate(contexts):
        ids[k, width - len(context):] = torch.tensor(context)
        mask[k, width - len(context):] = 1
    return PromptBatch(ids, mask, samples)


def _rollouts(first: Rollouts, rows: list[Trajectory], *, width: int, pad_token_id: int) -> Rollouts:
    n = len(rows)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    sampled = torch.zeros((n, width), dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    logprobs = torch.zeros((n, width), dtype=torch.float32)
    for k, row in enumerate(rows):
        length = len(row.ids)
        ids[k, :length] = torch.tensor(row.ids, dtype=torch.long)
        sampled[k, :length] = torch.tensor(row.sampled, dtype=torch.long)
        attention[k, :length] = 1
        logprobs[k, :length] = torch.tensor(row.logprobs, dtype=torch.float32)
    turns = TurnStats(*(torch.tensor([getattr(r, name) for r in rows],
                                     dtype=torch.float32 if name == "tool_seconds" else torch.long)
                        for name in TurnStats.__slots__))
    return Rollouts(prompt_ids=first.prompt_ids, prompt_mask=first.prompt_mask, response_ids=ids,
                    response_mask=sampled, rollout_logprobs=logprobs,
                    finish_reasons=[r.finish for r in rows], group_ids=first.group_ids,
                    samples=first.samples, model_inputs=None, response_attention=attention,
                    turns=turns)

