"""The doctor's check for a MindSpeed-RL trainer config: its data prefix.

MindSpeed-RL's `megatron_training.data_path` is a prefix of Megatron indexed
files (`<prefix>_packed_*.bin/.idx`); a prefix that matches none of them
fails deep in the loader with `IndexError: list index out of range` (seed
000's second failure). thinkrl does not read those files at all: it reads
`<data_path>/train.parquet`, written by `thinkrl prep` from the same JSON.
This check says which it found and, when the parquet file is missing, the
exact prep command, taken from the dataset config next to the trainer config
(`datasets/*.yaml`) when there is one.
"""

from __future__ import annotations

from pathlib import Path

from thinkrl.doctor.core import CheckResult, fail, ok

CHECK = "data/mindspeed-prefix"


def check_data_prefix(translation, cfg) -> CheckResult:
    """`translation`: thinkrl.config.mindspeed.Translation; `cfg`: the run's Config."""
    from thinkrl.data.prep.mindspeed import find_dataset_configs

    prefix = translation.data_path
    train_files = cfg.data.train_files
    files = [train_files] if isinstance(train_files, str) else list(train_files)
    missing = [f for f in files if not Path(f).expanduser().exists()]
    if prefix is None:
        return ok(CHECK, "the MindSpeed-RL config has no megatron_training.data_path")
    megatron = sorted(p.name for p in Path(prefix).expanduser().parent.glob(
        f"{Path(prefix).name}_packed_*.idx"))
    seen = (f"{len(megatron)} Megatron index file(s) {prefix}_packed_*.idx" if megatron
            else f"no Megatron files {prefix}_packed_*.bin/.idx either")
    if not missing:
        return ok(CHECK, f"megatron_training.data_path={prefix} is a Megatron prefix thinkrl does "
                         f"not read; it reads {', '.join(files)} ({seen})")
    found = (f"megatron_training.data_path={prefix} is a prefix of Megatron indexed files "
             f"(.bin/.idx), which thinkrl does not read ({seen}); it reads "
             f"data.train_files={', '.join(missing)}, which does not exist.")
    # the folder `thinkrl prep --output` must write: the prefix itself unless the user moved it
    output = prefix if missing[0] == translation.data_parquet else str(Path(missing[0]).parent)
    datasets = find_dataset_configs(Path(translation.path))
    if not datasets:
        fix = (f"write it from the source JSON: thinkrl prep orz --input ORZ.json --split train "
               f"--template qwen_r1 --output {output}")
        return fail(CHECK, found, fix)
    commands = []
    for dataset in datasets:
        relative = dataset.path.relative_to(Path(translation.path).parent)
        if dataset.output_prefix.rstrip("/") != prefix.rstrip("/"):
            found += (f" {relative} writes {dataset.output_prefix}_packed_*, a prefix data_path "
                      f"{prefix} does not name (MindSpeed-RL would fail on that too).")
        commands.append(f"{dataset.prep_command(output)}  (what thinkrl prep --mindspeed-config "
                        f"{dataset.path} --output {output} runs)")
    return fail(CHECK, found, "write it from the source JSON of the dataset config: "
                + " ; or ".join(commands))
