"""What several subcommands share: finding a recipe, loading a run's config,
printing without breaking the progress bar."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Callable

from thinkrl.errors import UserError


def recipe_path(name_or_path: str) -> Path:
    """A recipe file, or the name of a built-in one (`tiny`)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    recipes = resources.files("thinkrl") / "recipes"
    builtin = recipes / f"{name_or_path}.yaml"
    if not builtin.is_file():
        known = sorted(p.name[:-5] for p in recipes.iterdir() if p.name.endswith(".yaml"))
        raise UserError(f"--config {name_or_path}: no such file, and no built-in recipe of that "
                         f"name (built-in: {', '.join(known)})")
    return Path(str(builtin))


def command_parser(sub, name: str, *, help: str, doc: str | None):
    """The subparser of one command, its module docstring as the description."""
    import argparse

    return sub.add_parser(name, help=help, description=doc,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def console_log() -> Callable[[str], None]:
    from tqdm import tqdm

    def log(message: str) -> None:
        tqdm.write(message)  # keeps a progress bar intact
    return log


def load_run_config(config: str | None, overrides: list[str], *, log=print, extra: list[str] = ()):
    """The recipe (default: tiny, unless only overrides are given: then verl's
    defaults, so a verl launch line keeps its meaning) plus the overrides,
    then `extra` (a tool's own keys, e.g. a rehearsal's: they never change
    which recipe the user's arguments name)."""
    from thinkrl.config import load_config
    from thinkrl.config.verl_defaults import differences_note

    name = config or (None if overrides else "tiny")
    path = None if name is None else recipe_path(name)
    translation = mindspeed_translation(path)
    if translation is not None:  # MindSpeed-RL's layout: its keys become overrides, the user's win
        log(translation.table())
        return load_config(None, overrides, recipe_overrides=translation.overrides(), tool_overrides=extra)
    log(f"recipe: {path}" if path else
        "recipe: none, verl's defaults + the overrides given "
        "(to change the tiny recipe instead: thinkrl ... --config tiny key=value ...)")
    if path is None and (note := differences_note(overrides)) is not None:
        log(note)
    return load_config(path, overrides, tool_overrides=extra)


def mindspeed_translation(path: Path | None):
    """The translation of a MindSpeed-RL trainer config, or None for other recipes."""
    from thinkrl.config.mindspeed import is_mindspeed_file, translate_file

    if path is None or not is_mindspeed_file(path):
        return None
    return translate_file(path)
