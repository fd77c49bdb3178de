"""Multi-turn rollouts with tools: verl's ``actor_rollout_ref.rollout.multi_turn.*``
keys, and the few that thinkrl adds (its sandbox's limits, the bound on tool
calls running at once)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MultiTurnConfig:
    """The model generates, the tool calls in its turn run, their results go
    back as the chat template's tool messages, and the model continues; the
    tool turns' tokens are read but never trained on."""

    enable: bool = False
    """Run the tool loop for every prompt (verl picks it per row with
    ``agent_name: tool_agent``; thinkrl's switch is this key)."""
    max_assistant_turns: int | None = None
    """Turns the model may generate per response (any environment); None: until
    the environment ends the conversation or the response is
    ``data.max_response_length`` long."""
    max_user_turns: int | None = None
    """Environment turns (tool rounds, user replies, game messages) per response;
    None: no limit but the length."""
    tool_config_path: str | None = None
    """verl's tool file: ``tools:`` entries with ``class_name``, ``config``
    (``type: native``) and ``tool_schema`` (an OpenAI function schema).
    None: no tools."""
    max_parallel_calls: int = 1
    """Tool calls run per assistant turn (the first ones the model wrote; the
    rest are answered with an error saying so)."""
    max_tool_response_length: int = 256
    """Characters of a tool's answer kept (verl counts characters)."""
    tool_response_truncate_side: str = "middle"
    """Which part of a long tool answer is kept: "left" (its beginning),
    "right" (its end) or "middle" (both ends)."""
    format: str = "hermes"
    """How tool calls are written: "hermes" (Qwen2.5's ``<tool_call>{json}</tool_call>``)."""
    interaction_config_path: str | None = None
    """verl's interaction file: an ``interaction:`` list of ``name``, ``class_name``,
    ``config`` (simulated users, verl's ``BaseInteraction`` subclasses, run unchanged;
    thinkrl environment classes too); a row talks to the one its
    ``extra_info.interaction_kwargs.name`` names (thinkrl.envs.routing)."""
    tool_concurrency: int = 8
    """thinkrl: tool calls of a batch running at once."""
    tool_timeout_s: float = 10.0
    """thinkrl: seconds a tool call may take before it is answered with a
    time-out error (a call that hangs never hangs the step)."""
