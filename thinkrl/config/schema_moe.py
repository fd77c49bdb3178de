"""Mixture-of-experts settings of the actor (verl's keys): router replay.

verl reads ``actor_rollout_ref.actor.megatron.router_replay.mode`` (its
Megatron and VeOmni engines; its FSDP engine has none) and keeps
``actor_rollout_ref.actor.router_replay.mode`` from before; thinkrl takes
either as the same setting (`thinkrl.config.moe_checks.router_replay_mode`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")


@dataclass
class RouterReplayConfig:
    """Replay of the experts each token was routed to (`thinkrl.models.routing`)."""
    mode: str = "disabled"
    """disabled; R2: the update replays the routes of the old-log-prob pass;
    R3: the old-log-prob pass and the update replay the rollout's routes."""
    record_file: str | None = None
    """verl: declared, never read (routes travel in the batch)."""
    replay_file: str | None = None
    """verl: declared, never read."""


@dataclass
class MegatronActorConfig:
    """verl's ``actor.megatron`` group: of it, only ``router_replay`` (thinkrl
    trains with FSDP2; ``actor.strategy=megatron`` is refused)."""
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    """The same setting as ``actor.router_replay`` (verl's live spelling)."""
