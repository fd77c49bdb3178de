"""`thinkrl COMMAND ...`: train, and the tools around a run.

`thinkrl train` alone runs the built-in `tiny` recipe: a tiny Qwen2 model
learns arithmetic word problems by GRPO on this machine's CPU in minutes.
Each command lives in `thinkrl.commands.<name>`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from thinkrl.commands.common import recipe_path  # noqa: F401  (public: tests and users)

COMMANDS = ("train", "rehearse", "prep", "eval", "report", "export", "doctor", "config")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thinkrl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"thinkrl.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # argparse takes positionals in one run, so `k=v --config tiny k2=v2`
    # would leave k2=v2 unparsed: such leftovers are overrides too.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any("=" not in a or a.startswith("-") for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command = importlib.import_module(f"thinkrl.commands.{args.command}")
    from thinkrl.exits import run_command

    # Every failure ends as a message (user error, stop, disk full, Ctrl-C, bug).
    return run_command(command.run, args, argv=list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
