"""Images, data and configs for the vision-language tests."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from thinkrl.data.image_arith import render

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
SEED_004 = next(iter(sorted((SHARED / "seeds").glob("004_*.txt"))), None) if SHARED.is_dir() else None


def png(text: str, *, size: tuple[int, int] = (112, 56)) -> bytes:
    """A white PNG with `text` drawn in black."""
    return render(text, size=size)


def seed_004_overrides() -> list[str]:
    """The `python3 -m verl.trainer.main_ppo` arguments of seed 004, as its
    shell script passes them ($ENGINE is vllm, $@ empty)."""
    text = SEED_004.read_text()
    line = text.split("python3 -m verl.trainer.main_ppo", 1)[1].split("$@", 1)[0]
    line = re.sub(r"\\\s*\n", " ", line).replace("$ENGINE", "vllm")
    return shlex.split(line)


def small_run(model_dir: Path, run_dir: Path, train: Path, test: Path) -> list[str]:
    """Overrides that make a seed-sized run fit a CPU test: one device, tiny batches."""
    return [f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
            f"data.train_files={train}", f"data.val_files={test}",
            "actor_rollout_ref.rollout.name=native", "trainer.device=cpu",
            "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "data.max_response_length=8", "data.val_batch_size=4",
            "trainer.progress_bar=False", "trainer.logger=[]"]
