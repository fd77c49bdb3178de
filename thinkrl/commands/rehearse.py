"""`thinkrl rehearse [--config RECIPE] [key=value ...]`

A dress rehearsal of a run before the cluster is booked: the same arguments
as `thinkrl train` (a recipe, a MindSpeed-RL file, or a verl launch line as
is), run on this machine's CPU with a shrunken model of the same
architecture (random weights; the real tokenizer, template, data rows,
reward and algorithm; the same number of ranks and engine). It checks the
config and runs the doctor's checks, scores the data's gold answers with the
reward, trains 2 steps with a checkpoint, restarts from it, exports and
evaluates, then prints one table: each stage passed or failed with the fix,
what could not be rehearsed here, and a projection for the real run.
Exit status 1 when a stage fails. Never writes to the run's directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from thinkrl.commands.common import command_parser
from thinkrl.errors import UserError


def add_parser(sub) -> None:
    parser = command_parser(sub, "rehearse", doc=__doc__,
                            help="run a launch line on a shrunken model, here, before the cluster")
    parser.add_argument("--config", help="recipe YAML file, MindSpeed-RL file or built-in recipe "
                                         "name (default: tiny)")
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="the rehearsal's folder (default: a new folder under the system's "
                             "temporary directory); kept afterwards")
    parser.add_argument("--target", default=None,
                        help="the cluster's device for the projection: h100, h200, a100-40, 910b, ... "
                             "or a size (80GiB), with xN per node (default: h100 for cuda, 910b for npu)")
    parser.add_argument("--device-memory-gib", type=float, default=None,
                        help="memory of one cluster device for the projection (overrides --target's)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides (verl style)")


def run(args) -> int:
    from thinkrl.commands.common import console_log
    from thinkrl.rehearse import RunArgs, rehearse

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="thinkrl-rehearse-"))
    if workdir.exists() and any(workdir.iterdir()):
        raise UserError(f"--workdir {workdir} is not empty: give a new or empty folder "
                         "(a rehearsal starts from nothing)")
    log = console_log()
    log(f"rehearsal work folder: {workdir}")
    from thinkrl.doctor.targets import parse_target

    target = parse_target(args.target) if args.target else None
    rehearsal, report = rehearse(RunArgs(args.config, tuple(args.overrides)), workdir, log=log,
                                 device_memory_gib=args.device_memory_gib, target=target)
    print(report)
    return 1 if any(r.status == "failed" for r in rehearsal.results) else 0
