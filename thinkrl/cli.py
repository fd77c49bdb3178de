"""`thinkrl train [--config RECIPE] [key=value ...]`

`thinkrl train` alone runs the built-in `tiny` recipe: a tiny Qwen2 model
learns arithmetic word problems by GRPO on this machine's CPU in minutes.
Overrides use verl's dotted keys on top of verl's defaults, so a verl launch
line means the same after `thinkrl train`; `--config tiny key=value ...`
changes the tiny recipe instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import resources
from pathlib import Path


def recipe_path(name_or_path: str) -> Path:
    """A recipe file, or the name of a built-in one (`tiny`)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    builtin = resources.files("thinkrl") / "recipes" / f"{name_or_path}.yaml"
    if not builtin.is_file():
        known = sorted(p.name[:-5] for p in (resources.files("thinkrl") / "recipes").iterdir()
                       if p.name.endswith(".yaml"))
        raise ValueError(f"--config {name_or_path}: no such file, and no built-in recipe of that "
                         f"name (built-in: {', '.join(known)})")
    return Path(str(builtin))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thinkrl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run GRPO training")
    train.add_argument("--config", help="recipe YAML file or built-in recipe name (default: tiny)")
    train.add_argument("overrides", nargs="*", help="dotted key=value overrides (verl style)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from tqdm import tqdm

    from thinkrl.config import load_config
    from thinkrl.trainer import train

    def log(message: str) -> None:
        tqdm.write(message)  # keeps the progress bar intact

    try:
        config = args.config or (None if args.overrides else "tiny")
        path = None if config is None else recipe_path(config)
        log(f"recipe: {path}" if path else
            "recipe: none, verl's defaults + the overrides given "
            "(to change the tiny recipe instead: thinkrl train --config tiny key=value ...)")
        cfg = load_config(path, args.overrides)
        result = train(cfg, log=log)
    except ValueError as err:  # a user mistake: the message says what to do
        print(f"thinkrl: error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:
        print(f"thinkrl: training stopped: {err}", file=sys.stderr)
        return 1
    _summary(result, log)
    return 0


def _summary(result, log) -> None:
    for key, after in sorted(result.last_val.items()):
        if not key.startswith("val-core/"):
            continue
        before = result.first_val.get(key)
        change = "" if before is None else f"  (before training {before:.3f}, {100 * (after - before):+.1f} points)"
        log(f"{key}: {after:.3f}{change}")
    log(f"metrics: {Path(result.run_dir) / 'metrics.jsonl'}")


if __name__ == "__main__":
    sys.exit(main())
