"""Which checkpoint a run starts from (trainer.resume_mode), and when it saves.

- `auto`: the latest intact checkpoint of trainer.default_local_dir, if any
  (a damaged one is skipped with a warning: thinkrl.checkpoint.verify);
- `disable`: none; a fresh start (checkpoints already in the folder are
  replaced as this run reaches their steps);
- `resume_path`: trainer.resume_from_path, a `global_step_N` folder or a run
  directory (its latest checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path

from thinkrl.checkpoint.store import (MARKER, candidates_newest_first, complete_checkpoints,
                                      remove_stale_tmp, resolve_checkpoint)
from thinkrl.checkpoint.verify import newest_intact
from thinkrl.config.schema import TrainerConfig
from thinkrl.errors import SetupError, UserError


def checkpoint_to_resume(trainer: TrainerConfig, run_dir: Path, *, log=print) -> Path | None:
    remove_stale_tmp(run_dir, log=log)
    if trainer.resume_mode == "disable":
        existing = complete_checkpoints(run_dir)
        if existing:
            log(f"trainer.resume_mode=disable: starting from step 0; the {len(existing)} "
                f"checkpoint(s) in {run_dir} are replaced as this run reaches their steps")
        return None
    if trainer.resume_mode == "resume_path":
        try:
            folder = resolve_checkpoint(trainer.resume_from_path, log=log)
        except ValueError as err:
            raise UserError(f"trainer.resume_from_path={trainer.resume_from_path}: {err}") from None
        refuse_unresumable(folder)
        log(f"resuming from {folder} (trainer.resume_mode=resume_path)")
        return folder
    candidates = candidates_newest_first(run_dir, log=log)
    folder = newest_intact(candidates, log=log)  # warns about each damaged one it skips
    if folder is None and candidates:
        raise SetupError(
            f"every checkpoint in {run_dir} is damaged ({', '.join(p.name for p in candidates)}; "
            "see the warnings above), so this run cannot resume",
            "to start afresh anyway set trainer.resume_mode=disable (the damaged checkpoints are "
            "replaced as the run reaches their steps), or move them out of the folder")
    if folder is not None:
        refuse_unresumable(folder)
        log(f"resuming from {folder}, the latest checkpoint in the run directory "
            "(trainer.resume_mode=auto; set trainer.resume_mode=disable to start afresh)")
    return folder


RESUMABLE = ("model", "optimizer", "extra")
"""What a checkpoint must hold to be resumed from (`meta.json`'s "contents";
checkpoints saved before it was written hold all three)."""


def missing_for_resume(folder: Path) -> list[str]:
    """What `folder` lacks of `RESUMABLE` (saved with a reduced
    checkpoint.save_contents); [] when it can be resumed from."""
    contents = json.loads((folder / MARKER).read_text()).get("contents", RESUMABLE)
    return [c for c in RESUMABLE if c not in contents]


def refuse_unresumable(folder: Path) -> None:
    """A UserError naming what `folder` lacks and what it can be used for."""
    missing = missing_for_resume(folder)
    if missing:
        raise UserError(
            f"{folder} holds no {' and no '.join(missing)} state (it was saved with "
            "actor_rollout_ref.actor.checkpoint.save_contents or critic.checkpoint.save_contents "
            "leaving it out), so a run cannot resume from it exactly. Use it with "
            f"`thinkrl export {folder} --out DIR` (then actor_rollout_ref.model.path=DIR starts a "
            "new run from its weights) or `thinkrl eval --model`; to resume later runs, keep the "
            "default save_contents=[model,optimizer,extra]; to start afresh here, "
            "trainer.resume_mode=disable")


def should_save(trainer: TrainerConfig, step: int, total_steps: int) -> bool:
    """Every trainer.save_freq steps and at the last step (as verl does);
    never when save_freq <= 0."""
    return is_save_step(trainer.save_freq, step, total_steps)


def is_save_step(save_freq: int, step: int, total_steps: int) -> bool:
    """`should_save`'s rule on its numbers."""
    return save_freq > 0 and (step % save_freq == 0 or step == total_steps)
