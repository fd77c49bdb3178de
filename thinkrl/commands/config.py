"""`thinkrl config convert FILE --out thinkrl.yaml`

Translates a MindSpeed-RL trainer config (configs/grpo_trainer_*.yaml, with
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
    parser = command_parser(sub, "config", help="convert a MindSpeed-RL config into a thinkrl "
                                                "recipe", doc=__doc__)
    actions = parser.add_subparsers(dest="action", required=True)
    convert = actions.add_parser("convert", help="write the thinkrl recipe of a MindSpeed-RL file")
    convert.add_argument("file", help="a MindSpeed-RL trainer config (YAML)")
    convert.add_argument("--out", required=True, help="the thinkrl recipe to write")


def run(args) -> int:
    from thinkrl.config import load_config
    from thinkrl.config.checks import validate
    from thinkrl.config.mindspeed import translate_file, write_recipe

    translation = translate_file(args.file)
    print(translation.table())
    out = write_recipe(translation, args.out)
    validate(load_config(out))  # what was written loads as a thinkrl recipe
    print(f"wrote {out}; run it with: thinkrl train --config {out}")
    return 0
