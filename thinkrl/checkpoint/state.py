"""What a checkpoint holds, and putting it back: everything an exact resume needs.

    global_step_N/
      actor/              Hugging Face folder: config.json, generation_config.json,
                          model.safetensors (float32 master weights), tokenizer files;
                          with LoRA, PEFT's adapter folder instead (thinkrl.checkpoint.adapter)
      optimizer.pt        AdamW moments and step counts, param groups (lr as last set)
      critic/             PPO with a critic only: the value model as a Hugging Face
                          folder (loadable as critic.model.path), or critic_dcp/
                          (shards, ray backend; see thinkrl.checkpoint.sharded); with
                          critic.model.lora_rank its adapters and value head instead
                          (thinkrl.checkpoint.adapter; for resuming, not a model folder)
      critic_optimizer.pt its AdamW state (its LR schedule and shuffle generator
                          are in trainer_state.pt)
      trainer_state.pt    LR schedule, loader (epoch, position), the actor's shuffle
                          generator, the rollout side's generators and its kind
                          (thinkrl.checkpoint.rollout_state), the KL controller,
                          the driver's global RNGs (torch CPU, python, numpy),
                          each rank's accelerator RNGs (device_rng), step and
                          the skipped-updates-in-a-row counter
      config.yaml         the run's config when it was saved
      meta.json           step, thinkrl version, config digest, what it holds
                          ("contents"); written last, it marks the checkpoint complete

`actor_rollout_ref.actor.checkpoint.save_contents` (verl's key) leaves out
the optimizer files ("optimizer") or trainer_state.pt ("extra"): such a
checkpoint serves `thinkrl export` and `thinkrl eval --model`, and resuming
from it is refused with the reason (its optimizer or position is not there
to continue from exactly).

`.pt` files hold only tensors and plain values and are read with
`torch.load(weights_only=True)`, which refuses to unpickle anything else.

Not saved, because it is rebuilt identically from the config: the reference
model (a frozen copy of the *initial* weights, built before the actor's
weights are restored), the prompts, the scorers, the derived sizes.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from importlib import metadata
from pathlib import Path

import torch
import yaml

from thinkrl.checkpoint.resume import RESUMABLE, refuse_unresumable
from thinkrl.checkpoint.rollout_state import check_resumable, rollout_kind
from thinkrl.checkpoint.sharded import ACTOR_DIR
from thinkrl.checkpoint.store import MARKER, atomic_checkpoint, kept_on_disk, rotate, step_of
from thinkrl.config.critic_checks import uses_critic
from thinkrl.config.loading import config_to_dict
from thinkrl.errors import RunStopped, UserError
from thinkrl.models.vision import copy_processor_files
from thinkrl.run import Progress, Run

FORMAT = 1
TRAINER_STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "config.yaml"
# Keys that say where the run lives and what it resumes from: they may differ
# between a run and its exact continuation.
_PLACE_KEYS = ("trainer.resume_mode", "trainer.resume_from_path", "trainer.default_local_dir")


def thinkrl_version() -> str:
    try:
        return metadata.version("thinkrl")
    except metadata.PackageNotFoundError:
        return "unknown"


def config_digest(cfg) -> str:
    flat = {k: v for k, v in flat_config(config_to_dict(cfg)).items() if k not in _PLACE_KEYS}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()


def flat_config(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def save_checkpoint(run: Run, progress: Progress, *, log=print) -> Path:
    """Write step `progress.step` of `run` atomically, then apply
    trainer.max_actor_ckpt_to_keep. Returns the checkpoint folder."""
    bad = run.roles.actor.weight_stats()["nonfinite"]
    if bad:  # never a checkpoint that cannot be resumed from
        raise RunStopped(f"step {progress.step}: not saving a checkpoint: {len(bad)} weight tensor(s) "
                         f"hold NaN or inf (first: {bad[0]}). {kept_on_disk(run.spec.run_dir)} Lower "
                         "actor_rollout_ref.actor.optim.lr or check the rewards.")
    start = time.perf_counter()
    contents = saved_contents(run.spec.cfg)
    meta = {"format": FORMAT, "step": progress.step, "thinkrl_version": thinkrl_version(),
            "config_sha256": config_digest(run.spec.cfg), "contents": contents}
    actor_state = run.roles.actor.state_dict()
    with atomic_checkpoint(run.spec.run_dir, progress.step, meta) as tmp:
        run.roles.actor.save(tmp)  # weights and optimizer, whole or sharded (checkpoint.sharded)
        if run.roles.critic is not None:
            run.roles.critic.save(tmp)
        run.spec.tokenizer.save_pretrained(tmp / ACTOR_DIR)
        copy_processor_files(run.spec.model_path, tmp / ACTOR_DIR)  # VL: the image processor
        if "extra" in contents:
            torch.save(_trainer_state(run, progress, actor_state), tmp / TRAINER_STATE_FILE)
        with (tmp / CONFIG_FILE).open("w") as f:
            yaml.safe_dump(config_to_dict(run.spec.cfg), f, sort_keys=False)
    folder = run.spec.run_dir / f"global_step_{progress.step}"
    what = "" if set(RESUMABLE) <= set(contents) else f", {'+'.join(contents)}: not resumable"
    log(f"saved checkpoint {folder} ({time.perf_counter() - start:.2f} s{what})")
    rotate(run.spec.run_dir, keep=run.spec.cfg.trainer.max_actor_ckpt_to_keep,
           current_step=progress.step, log=log)
    return folder


def saved_contents(cfg) -> list[str]:
    """What this run's checkpoints hold, from the actor's save_contents and,
    for the optimizer, the critic's ("hf_model" is "model": the weights are a
    Hugging Face folder anyway)."""
    named = {"model" if c == "hf_model" else c for c in cfg.actor_rollout_ref.actor.checkpoint.save_contents}
    if uses_critic(cfg) and "optimizer" not in cfg.critic.checkpoint.save_contents:
        named.discard("optimizer")
    return [c for c in RESUMABLE if c in named]


def _trainer_state(run: Run, progress: Progress, actor_state: dict) -> dict:
    kl_controller = run.state.kl_controller
    return {
        "step": progress.step,
        "skipped_updates_in_a_row": progress.skipped_updates_in_a_row,
        "actor": actor_state,  # LR schedule and mini-batch shuffle generator
        "engine_generator": run.roles.engine.generator_state(),
        "engine_kind": rollout_kind(run.spec.cfg),  # which of its shapes (`rollout_state`)
        "loader": run.state.train_loader.state_dict(),
        "kl_controller": None if kl_controller is None else kl_controller.state_dict(),
        "rng": capture_rng(),  # this (the driver's) process
        "device_rng": run.roles.actor.device_rng_states(),  # each rank's accelerator, None on a CPU
        "critic": None if run.roles.critic is None else run.roles.critic.state_dict(),
    }


def load_checkpoint(run: Run, folder: Path, *, log=print) -> Progress:
    """Restore every saved state of `folder` into a freshly built `run`."""
    start = time.perf_counter()
    meta = json.loads((folder / MARKER).read_text())
    if meta.get("format") != FORMAT:
        raise UserError(f"{folder}: checkpoint format {meta.get('format')} is not the format "
                         f"{FORMAT} this thinkrl ({thinkrl_version()}) reads")
    refuse_unresumable(folder)  # checked at start already; a folder given here directly too
    _note_config_changes(run.spec.cfg, folder, meta, log=log)
    state = torch.load(folder / TRAINER_STATE_FILE, map_location="cpu", weights_only=True)
    check_resumable(state, run.spec.cfg, folder)  # before anything is read into the run
    run.roles.actor.load(folder)  # weights and optimizer, either layout, read before set
    run.roles.actor.load_state_dict(state["actor"])
    if run.roles.critic is not None:
        run.roles.critic.load(folder)  # refuses a checkpoint saved without a critic
        run.roles.critic.load_state_dict(state["critic"])
    run.roles.engine.set_generator_state(state["engine_generator"])
    run.state.train_loader.load_state_dict(state["loader"])
    if run.state.kl_controller is not None and state["kl_controller"] is not None:
        run.state.kl_controller.load_state_dict(state["kl_controller"])
    restore_rng(state["rng"])
    # Checkpoints of releases before per-rank states kept the one process's device state in "rng".
    run.roles.actor.load_device_rng_states(state.get("device_rng") or [state["rng"].get("device")])
    assert state["step"] == step_of(folder), (folder, state["step"])
    log(f"restored {folder.name} ({time.perf_counter() - start:.2f} s): model, optimizer, "
        f"LR schedule, data position (epoch {run.state.train_loader.epoch}, batch "
        f"{run.state.train_loader.position}), RNG states")
    return Progress(step=state["step"], skipped_updates_in_a_row=state["skipped_updates_in_a_row"])


def _note_config_changes(cfg, folder: Path, meta: dict, *, log) -> None:
    if meta.get("config_sha256") == config_digest(cfg) or not (folder / CONFIG_FILE).is_file():
        return
    saved = flat_config(yaml.safe_load((folder / CONFIG_FILE).read_text()) or {})
    now = flat_config(config_to_dict(cfg))
    # A key added to thinkrl after the save, at its default, is no change.
    defaults = flat_config(config_to_dict(type(cfg)()))
    changed = sorted(k for k in saved.keys() | now.keys()
                     if k not in _PLACE_KEYS and saved.get(k) != now.get(k)
                     and not (k not in saved and now.get(k) == defaults.get(k)))
    if not changed:  # the digests differ by such keys only
        return
    shown = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed[:8])
    more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
    log(f"note: the config differs from the one {folder.name} was saved with ({shown}{more}); "
        "the run continues with the new values, so it is not an exact continuation")


def capture_rng() -> dict:
    """This process's global generators (CPU torch, python, numpy), which code
    outside thinkrl (a reward function, a library) may draw from."""
    version, mt_state, gauss_next = random.getstate()
    state = {"torch_cpu": torch.get_rng_state(),
             "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64),
                        "gauss_next": gauss_next}}
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                      "has_gauss": has_gauss, "cached_gaussian": cached}
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch_cpu"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss_next"]))
    if "numpy" in state:
        import numpy as np

        s = state["numpy"]
        np.random.set_state((s["kind"], s["keys"].numpy().astype(np.uint32), s["pos"],
                             s["has_gauss"], s["cached_gaussian"]))


def device_rng_state(device: torch.device) -> list[torch.Tensor] | None:
    """The generators of `device`'s accelerator (a rank's), None on a CPU."""
    accelerator = _accelerator_module(device)
    return None if accelerator is None else accelerator.get_rng_state_all()


def set_device_rng_state(state: list[torch.Tensor] | None, device: torch.device) -> None:
    accelerator = _accelerator_module(device)
    if accelerator is not None and state is not None:
        accelerator.set_rng_state_all(state)


def _accelerator_module(device: torch.device):
    if device.type == "cpu":
        return None
    module = torch.get_device_module(device.type)
    return module if hasattr(module, "get_rng_state_all") else None
