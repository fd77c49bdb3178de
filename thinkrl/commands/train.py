"""`thinkrl train [--config RECIPE] [key=value ...]`

`thinkrl train` alone runs the built-in `tiny` recipe. Overrides use verl's
dotted keys on top of verl's defaults, so a verl launch line means the same
after `thinkrl train`; `--config tiny key=value ...` changes the tiny recipe.

Before anything is built, the checks of `thinkrl doctor` run on the same
config: their warnings are printed, and a failing check stops the run with
its fix (`--skip-doctor` starts anyway). `--cfg job` prints the resolved
config and exits.
"""

from __future__ import annotations

import time
from pathlib import Path

from thinkrl.commands.common import command_parser, console_log, load_run_config
from thinkrl.errors import UserError


def add_parser(sub) -> None:
    parser = command_parser(sub, "train", help="run GRPO training", doc=__doc__)
    parser.add_argument("--config", help="recipe YAML file or built-in recipe name (default: tiny)")
    parser.add_argument("--skip-doctor", action="store_true",
                        help="start even when a `thinkrl doctor` check fails (they are not run)")
    parser.add_argument("--cfg", choices=["job"],
                        help="print the resolved config (every key, YAML) and its problems, then exit "
                             "without running (Hydra's --cfg job, as verl's users know it)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides (verl style)")


def run(args) -> int:
    from thinkrl.trainer import train

    log = console_log()
    if args.cfg == "job":
        return print_config(args.config, args.overrides)
    cfg = load_run_config(args.config, args.overrides, log=log)
    if not args.skip_doctor:
        from thinkrl.commands.doctor import mindspeed_results
        preflight(cfg, log=log, extra=mindspeed_results(args.config, cfg))
    result = train(cfg, log=log)
    _summary(result, log)
    return 0


def print_config(config: str | None, overrides: list[str]) -> int:
    """`--cfg job`: the config a run would use, as YAML on stdout (the recipe
    named on stderr), then its problems, if any, on stderr; 2 when it has some."""
    import sys

    import yaml

    from thinkrl.config import config_to_dict
    from thinkrl.config.checks import validate

    cfg = load_run_config(config, overrides, log=lambda line: print(line, file=sys.stderr))
    print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
    try:
        validate(cfg)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    return 0


def preflight(cfg, *, log, extra: list = ()) -> None:
    """The doctor's checks: print what is not ok; raise ValueError on a failure."""
    from thinkrl.config.checks import validate
    from thinkrl.doctor import diagnose, has_failure
    from thinkrl.doctor.report import listing

    validate(cfg)  # a config error keeps its own one-message form (and skips the slow checks)
    start = time.perf_counter()
    everything = [*extra, *diagnose(cfg, log=log)]  # e.g. building the built-in model the first time
    results = [r for r in everything if r.status != "ok"]
    log(f"doctor: {len(everything) - len(results)} of {len(everything)} checks ok "
        f"({time.perf_counter() - start:.1f} s; `thinkrl doctor` shows them all)")
    if has_failure(results):
        failed = sum(r.status == "fail" for r in results)
        raise UserError(f"`thinkrl doctor` found {failed} problem(s) that would stop this run:\n"
                         f"{listing(results)}\nFix them, or pass --skip-doctor (from Python: doctor=False) to start anyway.")
    if results:
        log("doctor:\n" + listing(results))


def _summary(result, log) -> None:
    for key, after in sorted(result.last_val.items()):
        if not key.startswith("val-core/"):
            continue
        before = result.first_val.get(key)
        change = "" if before is None else f"  (before training {before:.3f}, {100 * (after - before):+.1f} points)"
        log(f"{key}: {after:.3f}{change}")
    log(f"metrics: {Path(result.run_dir) / 'metrics.jsonl'}")
