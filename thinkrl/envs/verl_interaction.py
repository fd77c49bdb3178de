"""verl's simulated users (``BaseInteraction`` subclasses) as environments.

A verl interaction file runs unchanged: each entry's class is built as
``cls(config={**config, "name": name})``; per rollout, as verl's tool agent
loop calls them:

    instance_id = await start_interaction(request_id, **interaction_kwargs)
    after each assistant turn without tool calls:
        done, text, score, extra = await generate_response(instance_id, messages,
                                                           **interaction_kwargs)
        text becomes the next user message (written even when done, as verl does)
    await finalize_interaction(instance_id)            # verl never calls it; thinkrl does

``interaction_kwargs`` is the row's ``extra_info.interaction_kwargs`` (its
``name`` included), ``messages`` the whole conversation as chat messages (the
row's prompt, then assistant, tool and user turns). As in verl the scores
are not the reward: the run's reward function scores the whole response and
gets them as ``extra_info["turn_scores"]``.

The coroutines run on one event loop per interaction, on a thread of its
own, so an interaction's async resources (clients, locks) live on one loop
as in verl; each call has the environment deadline and is cancelled past it.

verl not installed: a file that does ``from verl.interactions.base import
BaseInteraction`` still imports: while thinkrl imports it (and only if no
``verl`` package is importable) that one module resolves to
`thinkrl.envs.verl_base` (verl's base class, same methods and defaults).
Anything else the file imports from verl (verl's own gsm8k interaction
imports ``verl.utils.reward_score``) needs verl installed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import importlib.util
import inspect
import sys
import threading
import types
import uuid
from dataclasses import dataclass, field
from typing import Any

from thinkrl.envs.base import EnvError, EnvStep
from thinkrl.records import Sample


def is_verl_interaction(cls: type) -> bool:
    """A class with verl's interaction coroutines."""
    return all(inspect.iscoroutinefunction(getattr(cls, name, None))
               for name in ("start_interaction", "generate_response"))


@contextlib.contextmanager
def verl_base_importable():
    """While it lasts, ``verl.interactions.base`` imports (thinkrl's copy of
    the base class) when no real verl is installed; the modules are removed
    again afterwards so nothing else believes verl is there."""
    if importlib.util.find_spec("verl") is not None:
        yield
        return
    from thinkrl.envs import verl_base

    names = ("verl", "verl.interactions", "verl.interactions.base")
    added = {}
    for name in names:
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so the dotted import walks through it
        added[name] = module
    added["verl.interactions.base"].BaseInteraction = verl_base.BaseInteraction
    added["verl"].interactions = added["verl.interactions"]
    added["verl.interactions"].base = added["verl.interactions.base"]
    sys.modules.update(added)
    try:
        yield
    finally:
        for name in names:
            if sys.modules.get(name) is added[name]:
                del sys.modules[name]


@dataclass
class _Conversation:
    instance_id: str
    kwargs: dict
    messages: list[dict] = field(default_factory=list)


class VerlInteraction:
    """An `Environment` around one verl interaction object."""

    scores = False  # verl: the reward function scores the response; turn scores go to it
    tool_turns = True  # verl's tool agent: tools answer the turns with calls, the interaction the others

    def __init__(self, interaction: Any, *, name: str, timeout_s: float) -> None:
        self.interaction = interaction
        self.name = name
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"interaction-{name}")
        self._thread.start()
        self._stalled = False

    def _run(self, coroutine) -> Any:
        """Run `coroutine` on the interaction's loop within the deadline; past
        it the coroutine is cancelled. A coroutine that blocks the loop itself
        (a synchronous sleep or request) stalls every later call: after a
        time-out, the loop is pinged first and a stalled loop fails at once."""
        if self._stalled:
            ping = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop)
            try:
                ping.result(timeout=1.0)
                self._stalled = False
            except concurrent.futures.TimeoutError:
                coroutine.close()
                raise EnvError("timeout", f"{self.name}: its event loop is still blocked by an earlier call "
                                          "(a coroutine that does blocking work)") from None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self._stalled = True
            raise EnvError("timeout", f"{self.name}: no answer within {self.timeout_s:g} s") from None

    def reset(self, sample: Sample) -> _Conversation:
        kwargs = dict(sample.extra_info.get("interaction_kwargs") or {})
        request_id = uuid.uuid4().hex
        instance_id = self._run(self.interaction.start_interaction(request_id, **kwargs))
        return _Conversation(instance_id if isinstance(instance_id, str) else request_id, kwargs,
                             [dict(m) for m in sample.messages])

    def record(self, state: _Conversation, messages: list[dict]) -> None:
        """Turns that did not reach the interaction (tool calls and results)
        still belong to the conversation it reads."""
        state.messages += messages

    def step(self, state: _Conversation, reply: str) -> EnvStep:
        state.messages.append({"role": "assistant", "content": reply})
        result = self._run(self.interaction.generate_response(state.instance_id, state.messages,
                                                              **state.kwargs))
        if not isinstance(result, tuple) or len(result) != 4:
            raise EnvError("invalid", f"{self.name}: generate_response returned {str(result)[:100]}, not "
                                      "(should_terminate, response, score, extra)")
        done, text, score, _extra = result
        message = {"role": "user", "content": str(text)}
        state.messages.append(message)
        return EnvStep(messages=(message,), reward=None if score is None else float(score), done=bool(done))

    def close(self, state: _Conversation) -> None:
        finalize = self.interaction.finalize_interaction
        positional = [p for p in inspect.signature(finalize).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
        # verl's base class takes no id; every interaction it ships takes (instance_id, **kwargs)
        self._run(finalize(state.instance_id) if positional else finalize())

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


def build_interaction(cls: type, *, name: str, config: dict, timeout_s: float) -> VerlInteraction:
    """verl's construction: ``cls(config=config)`` with ``config["name"] = name``."""
    return VerlInteraction(cls(config={**config, "name": name}), name=name, timeout_s=timeout_s)
