"""`thinkrl config show [--config RECIPE] [key=value ...]`
`thinkrl config convert FILE --out thinkrl.yaml`

`show` prints the config a `thinkrl train` with the same arguments would
run (every key resolved, YAML on stdout) and its problems on stderr, without
running anything (the same as `thinkrl train ... --cfg job`; exit 2 when the
config has problems).

`convert` translates a MindSpeed-RL trainer config (configs/grpo_trainer_*.yaml, with
its `defaults: model:` file next to it) into a thinkrl recipe: every
MindSpeed-RL key becomes the thinkrl key it means, or is explained in the
translation table written at the top of the recipe (and printed). Then
`thinkrl train --config thinkrl.yaml` runs it, and the recipe can be edited
like any other. `thinkrl train --config FILE` reads the MindSpeed-RL file
directly with the same translation.
"""

from __future__ import annotations

from thinkrl.commands.common import command_parser


def add_parser(sub) -> None:
    parser = command_parser(sub, "config", help="print a run's resolved config, or convert a MindSpeed-RL "
                                                "config into a thinkrl recipe", doc=__doc__)
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="print the resolved config of `thinkrl train` with these arguments")
    show.add_argument("--config", help="recipe YAML file or built-in recipe name (default: tiny)")
    show.add_argument("overrides", nargs="*", help="dotted key=value overrides (verl style)")
    convert = actions.add_parser("convert", help="write the thinkrl recipe of a MindSpeed-RL file")
    convert.add_argument("file", help="a MindSpeed-RL trainer config (YAML)")
    convert.add_argument("--out", required=True, help="the thinkrl recipe to write")


def run(args) -> int:
    if args.action == "show":
        from thinkrl.commands.train import print_config

        return print_config(args.config, args.overrides)
    from thinkrl.config import load_config
    from thinkrl.config.checks import validate
    from thinkrl.config.mindspeed import translate_file, write_recipe

    translation = translate_file(args.file)
    print(translation.table())
    out = write_recipe(translation, args.out)
    validate(load_config(out))  # what was written loads as a thinkrl recipe
    print(f"wrote {out}; run it with: thinkrl train --config {out}")
    return 0
