"""What an environment is: the other side of a conversation with the policy.

A rollout is a conversation. The prompt comes from a data row; the policy
writes a turn; the environment reads it and answers with the next messages
(a user's reply, tool results, a game's observation), a reward and whether
the conversation is over; the policy writes again, and so on. A single-turn
task is the environment that ends after the first turn (its verifier is the
run's reward function); the tool loop, a simulated user (verl's
interactions) and a game are environments whose steps answer back.

    env = Guess(config)                   # one object serves every rollout
    state = env.reset(sample)             # per-rollout state, from the data row
    step = env.step(state, reply)         # reply: the policy's turn as text
    step.messages, step.reward, step.done
    env.close(state)                      # once the rollout ends (any way)

The loop (`thinkrl.envs.loop`) keeps the conversation token in, token out:
the sampled ids are never decoded and encoded again; the messages an
environment returns are written with the chat template after them, read by
the model and masked out of the loss. Each `reset`/`step`/`close` runs on a
thread of the step runner with a deadline; an environment that raises,
hangs, returns something that is not an `EnvStep`, or dies (one served by
worker processes) ends that rollout with reward 0, counted by kind.

How a rollout is scored: an environment with ``scores = True`` owns the
reward (the sum of its steps' rewards; games, procedural tasks with their
own verifier); one with ``scores = False`` (the tool loop, verl's
interactions, single-turn rows) leaves it to the run's reward function,
which reads the whole response, and its step rewards reach that function as
``extra_info["turn_scores"]`` (verl's name), with ``extra_info["num_turns"]``.

Optional members the loop and the router use when an environment has them:
``deadline_s`` (it bounds its own calls, e.g. in worker processes: the
loop's outer deadline for one call, queueing included), ``tool_turns``
(True: with the run's tools, it answers only the turns without tool calls,
as verl's interactions inside its tool agent), ``record(state, messages)``
(turns it did not answer still belong to its conversation), ``check(sample)``
(ValueError at start for a row it cannot serve), ``shutdown()`` (free what
the object holds when the run ends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from thinkrl.records import Sample

ROLES = ("user", "tool", "system")
"""Roles an environment may write (the assistant's turns are the policy's)."""


@dataclass(frozen=True, slots=True)
class EnvStep:
    """An environment's answer to one turn of the policy."""

    messages: tuple[dict, ...] = ()
    """The next messages, ``{"role": "user" | "tool" | "system", "content": str}``,
    written with the chat template after the policy's turn (masked from the loss)."""
    reward: float | None = None
    """This step's reward; None: none given (verl's interactions may give None,
    and verl keeps only the scores that were given in ``turn_scores``)."""
    done: bool = False
    """The conversation is over (the messages, if any, are still written)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Named counts of this step (tool calls, invalid moves, ...), summed per
    rollout and reported per environment."""


@runtime_checkable
class Environment(Protocol):
    """One kind of conversation partner; one object serves every rollout of
    the run (state lives in what `reset` returns), possibly on several threads
    at once."""

    scores: bool
    """True: the sum of the step rewards is the rollout's score. False: the
    run's reward function scores the whole response."""

    def reset(self, sample: Sample) -> Any:
        """A fresh conversation for `sample` (the data row): its state."""
        ...

    def step(self, state: Any, reply: str) -> EnvStep:
        """Read the policy's turn `reply`: its text, without the end-of-turn
        token (other special tokens, such as Qwen's <tool_call>, are kept)."""
        ...

    def close(self, state: Any) -> None:
        """The rollout is over: free what `state` holds."""
        ...


class EnvError(Exception):
    """An environment did something a rollout cannot go on from; `kind`
    names it in the metrics (env/<name>/errors/<kind>)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def checked_step(value: Any) -> EnvStep:
    """`value` if it is a well-formed `EnvStep`, else EnvError("invalid") saying what is wrong."""
    if not isinstance(value, EnvStep):
        raise EnvError("invalid", f"step returned a {type(value).__name__}, not an EnvStep")
    if not isinstance(value.messages, (tuple, list)):
        raise EnvError("invalid", f"messages is a {type(value.messages).__name__}, not a list of messages")
    for message in value.messages:
        if (not isinstance(message, dict) or message.get("role") not in ROLES
                or not isinstance(message.get("content"), str)):
            raise EnvError("invalid", f"a message must be {{'role': one of {ROLES}, 'content': str}}; "
                                      f"got {str(message)[:120]}")
    if value.reward is not None and (isinstance(value.reward, bool) or not isinstance(value.reward, (int, float))
                                     or not math.isfinite(float(value.reward))):
        raise EnvError("invalid", f"reward {value.reward!r} is not a finite number (or None)")
    if not isinstance(value.done, bool):
        raise EnvError("invalid", f"done {value.done!r} is not True or False")
    if not isinstance(value.metrics, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in value.metrics.items()):
        raise EnvError("invalid", f"metrics must map names to numbers; got {str(value.metrics)[:120]}")
    return value
