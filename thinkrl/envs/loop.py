"""The environment loop: every rollout is a conversation between the policy
and the environment its data row picks (`thinkrl.envs.routing`), around any
rollout role (one process's engine, or the ray ranks' engines).

    reset every response's environment (concurrently, each call with a deadline)
    the engine writes the first turn of every response
    while some conversations go on:
        their environments read the last turn (concurrently, deadlines) and
        answer with messages, a reward and done
        the messages go in as the chat template writes them (mask 0)
        the engine writes the next turn of every conversation still going
    close every environment state

A single-turn row's conversation ends after its first turn: a batch with no
environment is generated exactly as without this loop.

Token in, token out: a response is the ids the engine sampled with their
log-probs, and between turns the ids of the environment's messages from
`TurnTokens`; nothing is decoded and encoded again. `response_mask` is 1 on
sampled tokens and 0 on environment tokens (no loss, no KL there);
`response_attention` is 1 on both (the model reads them).

Limits, as verl's agent loop applies them: a turn is cut at the response's
remaining length; messages that would not fit end the response before them
(finish reason "length", unless the environment said done);
``max_assistant_turns`` and ``max_user_turns`` (environment turns) end it
after the turn that reaches them.

Faults: an environment call that raises, misses its deadline, returns a
malformed step, writes messages the chat template cannot render, or whose
worker process dies ends that conversation; the response keeps what it
has, scores 0 and is counted under the failure's kind
(`TurnStats.failures`); one warning line per environment and kind. A close
that fails is counted but does not undo a finished conversation.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from thinkrl.config.schema_env import EnvConfig
from thinkrl.config.schema_multi_turn import MultiTurnConfig
from thinkrl.deadline import Finished, run_all
from thinkrl.envs.base import EnvError, EnvStep, checked_step
from thinkrl.envs.routing import EnvRouter
from thinkrl.envs.turn_tokens import TurnTokens
from thinkrl.errors import UserError
from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts, TurnStats
from thinkrl.rollout.base import SamplingParams
from thinkrl.workers.roles import RolloutRole

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopLimits:
    # the defaults are the config's (MultiTurnConfig, EnvConfig), not copies
    max_assistant_turns: int | None = MultiTurnConfig.max_assistant_turns
    max_user_turns: int | None = MultiTurnConfig.max_user_turns
    """Environment turns per response (verl counts tool rounds and user replies)."""
    step_timeout_s: float = EnvConfig.step_timeout_s
    """Deadline of each reset / step / close call."""
    concurrency: int = EnvConfig.concurrency
    """Environment calls of a batch running at once."""


@dataclass
class Conversation:
    """One response as it grows: sampled and inserted ids side by side."""

    prompt: list[int]
    environment: str
    env: Any = None
    """The `Environment` (None: one turn, no environment)."""
    state: Any = None
    opened: bool = False
    ids: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # 1 sampled, 0 inserted (environment turns)
    logprobs: list[float] = field(default_factory=list)
    finish: str = FINISH_STOP
    assistant_turns: int = 0
    env_turns: int = 0
    reply: str = ""
    """The last turn's text, waiting for the environment."""
    turn_rewards: list[float] = field(default_factory=list)
    failure: str | None = None
    seconds: float = 0.0
    wall: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.sampled += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


class EnvRollout:
    """A `RolloutRole` that runs the environment loop around `engine`; weight
    syncs and generator state go to `engine` unchanged."""

    def __init__(self, engine: RolloutRole, *, tokenizer, router: EnvRouter, turn_tokens: TurnTokens,
                 limits: LoopLimits, eos_token_ids: list[int]) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.router = router
        self.turn_tokens = turn_tokens
        self.limits = limits
        self.eos = set(eos_token_ids)
        self._warned: set[tuple[str, str]] = set()

    @property
    def version(self) -> int:
        return self.engine.version

    def sync_weights(self, version: int) -> dict[str, float]:
        return self.engine.sync_weights(version)

    def generator_state(self):
        return self.engine.generator_state()

    def set_generator_state(self, state) -> None:
        self.engine.set_generator_state(state)

    def __getattr__(self, name: str):  # the wrapped role's other calls (served, ...)
        return getattr(self.engine, name)

    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        names = [self.router.name_for(s) for s in prompts.samples]
        if all(name == self.router.single_turn for name in names):
            return self.engine.generate(prompts, params)  # no environment: one plain turn
        if prompts.model_inputs is not None:
            raise UserError("environments: prompts with images are not supported in multi-turn "
                             "rollouts; use text prompts, or single-turn rows")
        rows = [Conversation(prompt=[], environment=name, env=self.router.env(name))
                for name in names for _ in range(params.n)]
        samples = [s for s in prompts.samples for _ in range(params.n)]
        try:
            self._call(rows, [i for i, r in enumerate(rows) if r.env is not None],
                       lambda row, i: functools.partial(row.env.reset, samples[i]), self._opened)
            first = self.engine.generate(prompts, params)
            for row, ids, mask in zip(rows, first.prompt_ids.tolist(), first.prompt_mask.tolist()):
                row.prompt = [t for t, m in zip(ids, mask) if m]
            live = self._take_turn(rows, range(len(rows)), first, params.max_tokens)
            while live:
                live = self._answer(rows, live, params.max_tokens)
                if not live:
                    break
                contexts = _context_batch(rows, live, [first.samples[i] for i in live],
                                          pad_token_id=self.tokenizer.pad_token_id)
                budget = max(params.max_tokens - len(rows[i].ids) for i in live)
                turn = self.engine.generate(contexts, dataclasses.replace(params, n=1, max_tokens=budget))
                live = self._take_turn(rows, live, turn, params.max_tokens)
        finally:  # every opened conversation is closed, whatever happened above
            self._call(rows, [i for i, r in enumerate(rows) if r.opened],
                       lambda row, i: functools.partial(row.env.close, row.state), lambda row, value: None,
                       closing=True)
        return _rollouts(first, rows, width=max([len(r.ids) for r in rows] + [1]),
                         pad_token_id=self.tokenizer.pad_token_id)

    def _take_turn(self, rows: list[Conversation], index, turn: Rollouts, max_tokens: int) -> list[int]:
        """Append the turn each row in `index` generated (row k of `turn`);
        the rows whose environment reads it next."""
        going_on = []
        for k, i in enumerate(index):
            row = rows[i]
            length = int(turn.response_mask[k].sum())
            ids = turn.response_ids[k, :min(length, max_tokens - len(row.ids))].tolist()
            row.add(ids, turn.rollout_logprobs[k, :len(ids)].tolist())
            row.assistant_turns += 1
            ended = bool(ids) and ids[-1] in self.eos
            row.finish = FINISH_STOP if ended else FINISH_LENGTH
            if (row.env is None or row.failure is not None or not ended or len(row.ids) >= max_tokens
                    or self._at_turn_limit(row)):
                continue
            while ids and ids[-1] in self.eos:
                ids = ids[:-1]
            row.reply = self.tokenizer.decode(ids, skip_special_tokens=False)
            going_on.append(i)
        return going_on

    def _at_turn_limit(self, row: Conversation) -> bool:
        a, u = self.limits.max_assistant_turns, self.limits.max_user_turns
        return (a is not None and row.assistant_turns >= a) or (u is not None and row.env_turns >= u)

    def _answer(self, rows: list[Conversation], live: list[int], max_tokens: int) -> list[int]:
        """The environments of the `live` rows read their last turn (all at
        once, each with a deadline); their messages are appended. The rows
        that go on."""
        answered: dict[int, EnvStep] = {}
        self._call(rows, live, lambda row, i: functools.partial(row.env.step, row.state, row.reply),
                   lambda row, value: answered.__setitem__(id(row), checked_step(value)))
        going_on = []
        for i in live:
            row, step = rows[i], answered.get(id(rows[i]))
            if step is None:  # the call failed: the conversation ends here
                continue
            if step.reward is not None:  # verl keeps the scores that were given
                row.turn_rewards.append(float(step.reward))
            for name, value in step.metrics.items():
                row.metrics[name] = row.metrics.get(name, 0.0) + float(value)
            if not step.messages:
                if not step.done:
                    self._fail(row, EnvError("invalid", "step said not done but gave no message "
                                                        "for the model to answer"))
                continue
            try:
                ids = list(self.turn_tokens.ids(tuple((m["role"], m["content"]) for m in step.messages)))
            except Exception as err:  # a template that cannot write these messages
                self._fail(row, EnvError("invalid", f"the chat template cannot write its messages "
                                                    f"({type(err).__name__}: {str(err)[:200]})"))
                continue
            if len(row.ids) + len(ids) >= max_tokens:  # verl: the response ends before them
                row.finish = FINISH_STOP if step.done else FINISH_LENGTH
                continue
            row.add(ids, None)
            row.env_turns += 1
            if not step.done:
                going_on.append(i)
        return going_on

    def _call(self, rows: list[Conversation], index: list[int],
              call: Callable[[Conversation, int], Callable[[], Any]],
              take: Callable[[Conversation, Any], None], *, closing: bool = False) -> None:
        """Run `call(row)` for the rows at `index` under their deadlines; `take`
        each result; a failure (or a `take` that raises EnvError) fails its
        row, except when `closing`: a conversation that ended is not undone by
        a failing close, which is counted (env/<name>/close_errors/mean)."""
        if not index:
            return
        start = time.perf_counter()
        deadlines = [self._deadline(rows[i]) for i in index]
        results = run_all([call(rows[i], i) for i in index], concurrency=self.limits.concurrency,
                          timeout_s=deadlines, name="env")
        share = (time.perf_counter() - start) / len(index)
        for i, deadline, result in zip(index, deadlines, results):
            row = rows[i]
            row.seconds += result.seconds
            row.wall += share
            error = None
            if not isinstance(result, Finished):
                error = EnvError("timeout", f"no answer within {deadline:g} s (env.step_timeout_s)")
            elif result.error is not None:
                error = result.error if isinstance(result.error, EnvError) else EnvError(
                    "raised", f"{type(result.error).__name__}: {result.error}")
            else:
                try:
                    take(row, result.value)
                except EnvError as err:
                    error = err
            if error is not None and closing:
                row.metrics["close_errors"] = row.metrics.get("close_errors", 0.0) + 1.0
                self._warn(row.environment, f"close_{error.kind}", f"close failed: {error}; the "
                           f"response keeps its score, counted in env/{row.environment}/close_errors/mean")
            elif error is not None:
                self._fail(row, error)

    def _deadline(self, row: Conversation) -> float:
        """An environment that bounds its own calls (worker processes, tools) says
        how long one may take with queueing; any other gets env.step_timeout_s."""
        return float(getattr(row.env, "deadline_s", None) or self.limits.step_timeout_s)

    def _opened(self, row: Conversation, state: Any) -> None:
        row.state, row.opened = state, True

    def _fail(self, row: Conversation, error: EnvError) -> None:
        if row.failure is None:
            row.failure = error.kind
        self._warn(row.environment, error.kind, f"{error} ({error.kind}); the response ends here and "
                   f"scores 0, counted in env/{row.environment}/errors/{error.kind}")

    def _warn(self, environment: str, kind: str, what: str) -> None:
        if (environment, kind) not in self._warned:  # one line per environment and kind
            self._warned.add((environment, kind))
            log.warning("environment %s: %s (reported once per kind)", environment, what)


def _context_batch(rows: list[Conversation], live: list[int], samples: list, *,
                   pad_token_id: int) -> PromptBatch:
    """Prompt + response so far of each live row, left-padded, as the next turn's prompts."""
    contexts = [rows[i].prompt + rows[i].ids for i in live]
    width = max(len(c) for c in contexts)
    ids = torch.full((len(live), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(live), width), dtype=torch.long)
    for k, context in enumerate(contexts):
        ids[k, width - len(context):] = torch.tensor(context)
        mask[k, width - len(context):] = 1
    return PromptBatch(ids, mask, samples)


def _rollouts(first: Rollouts, rows: list[Conversation], *, width: int, pad_token_id: int) -> Rollouts:
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
    turns = TurnStats(
        environments=[r.environment for r in rows],
        assistant_turns=torch.tensor([r.assistant_turns for r in rows], dtype=torch.long),
        env_turns=torch.tensor([r.env_turns for r in rows], dtype=torch.long),
        env_seconds=torch.tensor([r.seconds for r in rows], dtype=torch.float32),
        env_wall=torch.tensor([r.wall for r in rows], dtype=torch.float32),
        env_rewards=torch.tensor([sum(r.turn_rewards) for r in rows], dtype=torch.float32),
        env_scored=torch.tensor([r.env is not None and bool(r.env.scores) for r in rows], dtype=torch.bool),
        turn_rewards=[list(r.turn_rewards) for r in rows], failures=[r.failure for r in rows],
        metrics=[dict(r.metrics) for r in rows])
    return Rollouts(prompt_ids=first.prompt_ids, prompt_mask=first.prompt_mask, response_ids=ids,
                    response_mask=sampled, rollout_logprobs=logprobs,
                    finish_reasons=[r.finish for r in rows], group_ids=first.group_ids,
                    samples=first.samples, model_inputs=first.model_inputs, response_attention=attention,
                    turns=turns)
