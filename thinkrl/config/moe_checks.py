"""Checks of the mixture-of-experts settings (router replay) against the
rest of the run, and the mode in effect whichever key set it."""

from __future__ import annotations

from thinkrl.config.keys import ARR
from thinkrl.config.schema import Config
from thinkrl.config.schema_moe import ROUTER_REPLAY_MODES

KEYS = (f"{ARR}.actor.router_replay.mode", f"{ARR}.actor.megatron.router_replay.mode")


def router_replay_mode(cfg: Config) -> str:
    """disabled, R2 or R3: verl's Megatron key when it is set, else the actor's."""
    actor = cfg.actor_rollout_ref.actor
    megatron = actor.megatron.router_replay.mode
    return megatron if megatron != "disabled" else actor.router_replay.mode


def moe_problems(cfg: Config) -> list[str]:
    """What is wrong with router replay in this run ("  - key=value: fix" lines)."""
    arr = cfg.actor_rollout_ref
    modes = (arr.actor.router_replay.mode, arr.actor.megatron.router_replay.mode)
    problems = [f"  - {key}={mode}: use one of {', '.join(ROUTER_REPLAY_MODES)}"
                for key, mode in zip(KEYS, modes) if mode not in ROUTER_REPLAY_MODES]
    if problems:
        return problems
    if "disabled" not in modes and modes[0] != modes[1]:
        return [f"  - {KEYS[0]}={modes[0]} and {KEYS[1]}={modes[1]}: they are one setting (verl's two "
                "spellings); set one of them"]
    mode, key = router_replay_mode(cfg), KEYS[1] if modes[1] != "disabled" else KEYS[0]
    if arr.rollout.enable_rollout_routing_replay and mode == "R2":
        problems.append(f"  - {ARR}.rollout.enable_rollout_routing_replay=True with {key}=R2: R2 replays the "
                        "old-log-prob pass's routes, not the rollout's (verl refuses both at once); set the "
                        "mode to R3 or the rollout key to False")
    if mode == "disabled":
        return problems
    if mode == "R3" and arr.rollout.name != "native":
        problems.append(f"  - {key}=R3 with {ARR}.rollout.name={arr.rollout.name}: thinkrl records the rollout's "
                        "experts in its native engine only (vLLM returns them from 0.22 on, "
                        "enable_return_routed_experts, which thinkrl's vLLM engine does not ask for yet); use "
                        f"rollout.name=native, or R2")
    for on, what in ((cfg.async_training.mode != "off", f"async_training.mode={cfg.async_training.mode}"),
                     (arr.rollout.multi_turn.enable, f"{ARR}.rollout.multi_turn.enable=True"),
                     (cfg.algorithm.filter_groups.enable, "algorithm.filter_groups.enable=True"),
                     (arr.actor.use_rollout_log_probs, f"{ARR}.actor.use_rollout_log_probs=True")):
        if on:
            problems.append(f"  - {key}={mode} with {what}: router replay runs with synchronous single-turn "
                            "rollouts whose old log-probs the trainer computes; turn one of them off")
    return problems
