"""`builtin:smollm2-135m-sums-teacher`: the teacher of `--config opd`, made by
thinkrl itself on first use.

It is SmolLM2-135M-Instruct (`builtin:smollm2-135m-instruct`) after the
`smol` recipe: GRPO on the sums task, seed 1, 12 steps (a few minutes on 2
CPU cores). The run's last checkpoint is exported into the cache folder
beside PROVENANCE.json (the recipe and its overrides, the held-out accuracy
before and after, the package version, the date) and the run's metrics. Its
name carries a hash of the recipe file and the base model, so a changed
recipe makes a new teacher instead of reusing an old one.

This machine's float rounding trains it: another CPU kind gets a teacher of
its own, whose accuracy its PROVENANCE.json says.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from thinkrl.atomic import build_once
from thinkrl.errors import UserError

RECIPE = "smol"
SEED, STEPS = 1, 12
DONE = "PROVENANCE.json"


def teacher_folder(cache: Path, base_key: str) -> Path:
    """Where the teacher of today's recipe file and base model lives in the cache."""
    recipe_file = Path(__file__).resolve().parent.parent / "recipes" / f"{RECIPE}.yaml"
    text = recipe_file.read_bytes() + f"{SEED} {STEPS} {base_key}".encode()
    return cache / "models" / f"smollm2-135m-sums-teacher-{hashlib.sha256(text).hexdigest()[:10]}"


def build_sums_teacher(folder: Path, *, log=print) -> Path:
    """The teacher in `folder`, trained and exported unless it is there already.
    The GRPO run and the export are `thinkrl train` and `thinkrl export` in a
    process of their own (this one may be about to train the student)."""
    def make(tmp: Path) -> None:
        from importlib.metadata import version

        log(f"making the built-in teacher {folder}: --config {RECIPE} (GRPO, seed {SEED}, {STEPS} steps) "
            "from builtin:smollm2-135m-instruct; once, then cached")
        run_dir = tmp / "grpo-run"
        overrides = [f"trainer.seed={SEED}", f"trainer.total_training_steps={STEPS}",
                     f"trainer.save_freq={STEPS}", f"trainer.test_freq={STEPS}", "trainer.progress_bar=False",
                     f"trainer.default_local_dir={run_dir}", "trainer.logger=[console]"]
        _thinkrl(["train", "--config", RECIPE, *overrides], log=log, shown=(tmp, folder))
        _thinkrl(["export", str(run_dir), "--out", str(tmp / "model")], log=log, shown=(tmp, folder))
        for path in (tmp / "model").iterdir():
            shutil.move(str(path), tmp / path.name)
        (tmp / "model").rmdir()
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        shutil.copyfile(run_dir / "metrics.jsonl", tmp / "grpo_metrics.jsonl")
        shutil.rmtree(run_dir)
        held_out = [{k: v for k, v in r.items() if k.startswith("val-")} for r in records]
        held_out = [h for h in held_out if h]
        provenance = {
            "what": "SmolLM2-135M-Instruct after thinkrl's GRPO recipe on the sums task",
            "base": "builtin:smollm2-135m-instruct", "recipe": RECIPE, "overrides": overrides[:4],
            "held_out_before": held_out[0] if held_out else {}, "held_out_after": held_out[-1] if held_out else {},
            "thinkrl": version("thinkrl"),
            "made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        (tmp / DONE).write_text(json.dumps(provenance, indent=1) + "\n")
        accuracy = {k: round(v, 3) for k, v in provenance["held_out_after"].items() if "/acc/" in k}
        log(f"the built-in teacher is made: held-out {accuracy}")

    return build_once(folder, make, done=DONE, log=log)


def _thinkrl(arguments: list[str], *, log, shown: tuple[Path, Path]) -> None:
    """`thinkrl ARGUMENTS` in a process of its own, its lines relayed (the
    temporary folder named as the one it becomes); raises UserError when it fails."""
    process = subprocess.Popen([sys.executable, "-m", "thinkrl", *arguments], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in process.stdout:
        line = line.rstrip().replace(str(shown[0]), str(shown[1]))
        tail = (tail + [line])[-20:]
        log(f"  teacher: {line}")
    if process.wait() != 0:
        raise UserError(f"making the built-in teacher failed: thinkrl {arguments[0]} exited with "
                        f"{process.returncode}; its last lines:\n" + "\n".join(tail))
