"""Which checkpoint a run starts from (trainer.resume_mode), and when it saves.

- `auto`: the latest intact checkpoint of trainer.default_local_dir, if any
  (a damaged one is skipped with a warning: thinkrl.checkpoint.verify);
- `disable`: none; a fresh start (checkpoints already in the folder are
  replaced as this run reaches their steps);
- `resume_path`: trainer.resume_from_path, a `global_step_N` folder or a run
  directory (its latest checkpoint).
"""

from __future__ import annotations

from pathlib import Path

from thinkrl.checkpoint.store import (candidates_newest_first, complete_checkpoints, remove_stale_tmp,
                                      resolve_checkpoint)
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
        log(f"resuming from {folder}, the latest checkpoint in the run directory "
            "(trainer.resume_mode=auto; set trainer.resume_mode=disable to start afresh)")
    return folder


def should_save(trainer: TrainerConfig, step: int, total_steps: int) -> bool:
    """Every trainer.save_freq steps and at the last step (as verl does);
    never when save_freq <= 0."""
    return is_save_step(trainer.save_freq, step, total_steps)


def is_save_step(save_freq: int, step: int, total_steps: int) -> bool:
    """`should_save`'s rule on its numbers."""
    return save_freq > 0 and (step % save_freq == 0 or step == total_steps)
