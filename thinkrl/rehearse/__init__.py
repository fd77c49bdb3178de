"""`thinkrl rehearse`: the cluster's own launch line, run on a laptop in minutes.

The same arguments as `thinkrl train` (a recipe, a MindSpeed-RL file, or a
verl launch line as is) run for real on a shrunken model of the same
architecture (`shrink`), with the real tokenizer, template, data rows,
reward and algorithm, the same number of ranks and engine (`plan`): the
config and the doctor's checks, the model, the data, the reward on the
data's own gold answers (`gold`), 2 training steps with a checkpoint, a
restart that must continue from it, an export and an eval (`stages`). One
table says what passed, what failed with its fix, what could not be
rehearsed here, and what the real run will need (`report`). The run's own
directory is never written: runs, data samples, the model and logs go to
the rehearsal's work folder (besides it only the caches every command
shares, a hub model's config and tokenizer files, and Ray's temporary files).
"""

from __future__ import annotations

import time
from pathlib import Path

from thinkrl.rehearse.plan import RunArgs
from thinkrl.rehearse.stages import Rehearsal, StageResult

__all__ = ["Rehearsal", "RunArgs", "StageResult", "rehearse"]


def rehearse(args: RunArgs, workdir: Path, *, log=print, device_memory_gib: float | None = None,
             target=None) -> tuple[Rehearsal, str]:
    """Run every stage; returns the rehearsal and its report."""
    from thinkrl.rehearse.report import project, render

    start = time.perf_counter()
    rehearsal = Rehearsal(args, Path(workdir), log=log)
    rehearsal.run()
    projection = None
    if rehearsal.real is not None and rehearsal.prompt_tokens:
        try:
            projection = project(rehearsal.real, prompt_tokens=rehearsal.prompt_tokens,
                                 last_step=(rehearsal.step_metrics or [{}])[-1],
                                 device_memory_gib=device_memory_gib, target=target)
        except Exception as err:  # noqa: BLE001 - a projection that fails must not hide the table
            rehearsal.notes.append(f"no projection: {type(err).__name__}: {err}")
    return rehearsal, render(rehearsal, projection, seconds=time.perf_counter() - start)
