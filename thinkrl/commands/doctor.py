"""`thinkrl doctor [--config RECIPE] [--target h100x8] [key=value ...] [--json]`

Runs every preflight check of a run (config, data, model and tokenizer,
versions, environment, disk, memory) and prints one row per finding:
the check, its status (ok / warn / fail / skip), what it found and how to fix
it. Exit status 1 when any check fails, else 0. `thinkrl train` runs the same
checks first. Takes the same recipe and overrides as `thinkrl train`.

`--target` judges the run for the machine it is meant for, not this one: a
device of the catalogue (h100, h200, a100, a100-40, l40s, h20, 910b, 910c)
or a size (80GiB, npu:64GB), with xN devices per node (h100x8). Memory is
then compared with that device's, `n_gpus_per_node` with N, and a logger
package missing here is a warning.
"""

from __future__ import annotations

import sys

from thinkrl.commands.common import command_parser


def add_parser(sub) -> None:
    parser = command_parser(sub, "doctor", help="check a run before starting it", doc=__doc__)
    parser.add_argument("--config", help="recipe YAML file or built-in recipe name (default: tiny)")
    parser.add_argument("--json", action="store_true", help="print the results as a JSON list")
    parser.add_argument("--target", help="judge for this machine instead of this one: h100x8, 910bx16, "
                                         "a100-40x4, 80GiBx8, ... (thinkrl.doctor.targets)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides (verl style)")


def run(args) -> int:
    from thinkrl.commands.common import load_run_config
    from thinkrl.doctor import diagnose, has_failure
    from thinkrl.doctor.report import summary, table, to_json

    def note(message: str) -> None:  # progress goes to stderr: stdout stays a table or JSON
        print(message, file=sys.stderr)

    from thinkrl.doctor.targets import parse_target

    target = parse_target(args.target) if args.target else None
    cfg = load_run_config(args.config, args.overrides, log=note)
    if target is not None:
        note(f"judged for {target.describe()}")
    results = mindspeed_results(args.config, cfg) + diagnose(cfg, log=note, target=target)
    print(to_json(results) if args.json else table(results) + f"\n\n{summary(results)}")
    return 1 if has_failure(results) else 0


def mindspeed_results(config: str | None, cfg) -> list:
    """The MindSpeed-RL data-prefix row when `config` is a MindSpeed-RL file."""
    from thinkrl.commands.common import mindspeed_translation, recipe_path
    from thinkrl.doctor.mindspeed import check_data_prefix

    translation = mindspeed_translation(recipe_path(config)) if config else None
    return [] if translation is None else [check_data_prefix(translation, cfg)]
