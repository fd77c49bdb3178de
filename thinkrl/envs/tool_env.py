"""The tool loop as an environment (verl's ``tool_agent``): a turn with tool
calls gets the tools' results as the chat template's tool messages; a turn
without calls ends the conversation, or, when the row also talks to another
environment (a verl interaction: verl's tool agent runs both), goes to it.

Calls are read in the "hermes" format (`thinkrl.tools.calls`); at most
``max_parallel_calls`` run per turn, the rest are answered with an error
saying so; a malformed or unknown call is answered with an error line the
model can learn from; each answer is cut to ``max_tool_response_length``
characters (verl's cut). Step metrics: tool_calls, tool_errors, tool_seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thinkrl.config.schema_multi_turn import MultiTurnConfig
from thinkrl.envs.base import EnvStep
from thinkrl.records import Sample
from thinkrl.tools.calls import ToolCall, parse_tool_calls
from thinkrl.tools.registry import ToolRunner, truncated


@dataclass(frozen=True)
class ToolLimits:
    # the defaults are the config's (MultiTurnConfig), not copies
    max_parallel_calls: int = MultiTurnConfig.max_parallel_calls
    max_tool_response_length: int = MultiTurnConfig.max_tool_response_length
    truncate_side: str = MultiTurnConfig.tool_response_truncate_side
    format: str = MultiTurnConfig.format


@dataclass
class _State:
    inner: Any = None


class ToolEnvironment:
    """Tools, then optionally `inner` for turns without tool calls."""

    def __init__(self, runner: ToolRunner, limits: ToolLimits, *, inner: Any = None,
                 deadline_s: float | None = None) -> None:
        self.runner, self.limits, self.inner = runner, limits, inner
        self.scores = bool(getattr(inner, "scores", False))
        self.deadline_s = deadline_s
        """A step's calls each stop at the tool deadline, but may queue for the
        tool slots first (`thinkrl.envs.setup` sizes this for the worst queue)."""

    def reset(self, sample: Sample) -> _State:
        return _State(self.inner.reset(sample) if self.inner is not None else None)

    def step(self, state: _State, reply: str) -> EnvStep:
        pending = parse_tool_calls(reply, format=self.limits.format)
        if not pending:
            if self.inner is None:
                return EnvStep(done=True)
            return self.inner.step(state.inner, reply)
        cap = self.limits.max_parallel_calls
        calls = pending[:cap] + [ToolCall(c.name, error=f"only {cap} tool call(s) run per turn; "
                                          "this one was not run") for c in pending[cap:]]
        outcomes = self.runner.run(calls)
        messages = tuple({"role": "tool", "content": truncated(o.text, self.limits.max_tool_response_length,
                                                                self.limits.truncate_side)}
                         for o in outcomes)
        record = getattr(self.inner, "record", None)
        if record is not None:  # the other environment reads the whole conversation
            record(state.inner, [{"role": "assistant", "content": reply}, *messages])
        return EnvStep(messages=messages, metrics={
            "tool_calls": float(len(outcomes)), "tool_errors": float(sum(o.failed for o in outcomes)),
            "tool_seconds": float(sum(o.seconds for o in outcomes))})

    def close(self, state: _State) -> None:
        if self.inner is not None:
            self.inner.close(state.inner)
