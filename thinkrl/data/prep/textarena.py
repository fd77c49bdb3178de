"""`thinkrl prep textarena`: rows that each start one textarena game.

    thinkrl prep textarena --games GuessTheNumber-v0,TowerOfHanoi-v0 --size 500 \\
        --test-size 50 --seed 1 --output data/games

Row k of a split plays its game reset with its own seed (train seeds from
``seed * 10**6``, test seeds from ``(seed + 1) * 10**6 - test_size``: never
the same game twice across splits): ``data_source`` = ``textarena/<game>``,
the prompt is the game's first observation as a user turn (its rules and
board), ``extra_info`` holds the game and seed the environment resets it
with (`thinkrl.envs.textarena`), and the game itself scores the rollout (no
reward function; ``reward_model.ground_truth`` is empty).
"""

from __future__ import annotations

import difflib

from thinkrl.envs.textarena import DATA_SOURCE_PREFIX, OFFLINE_GAMES, check_installed, first_observation
from thinkrl.errors import UserError

_SEED_SPAN = 10**6


def parse_games(text: str) -> tuple[str, ...]:
    """``"A-v0,B-v0"`` -> the game ids; ValueError naming the closest id of an unknown one."""
    check_installed()
    from textarena.envs.registration import ENV_REGISTRY

    known = sorted(name[:-len("-raw")] for name in ENV_REGISTRY if name.endswith("-raw"))
    games = tuple(g.strip() for g in text.split(",") if g.strip())
    if not games:
        raise UserError(f"--games: name at least one textarena game, e.g. {', '.join(OFFLINE_GAMES[:2])}")
    for game in games:
        if game not in known:
            close = difflib.get_close_matches(game, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"offline games: {', '.join(OFFLINE_GAMES)}"
            raise UserError(f"--games: textarena has no game {game!r}; {hint}")
    return games


def generate(games: tuple[str, ...], *, size: int, test_size: int, seed: int) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}, each game's rows in turn."""
    if size < 1 or test_size < 0:
        raise UserError(f"--size {size} / --test-size {test_size}: give >= 1 / >= 0 games per game id")
    if size > _SEED_SPAN - test_size:
        raise UserError(f"--size {size}: at most {_SEED_SPAN - test_size} games per game id")
    rows: dict[str, list[dict]] = {"train": [], "test": []}
    for game in games:
        starts = {"train": seed * _SEED_SPAN, "test": (seed + 1) * _SEED_SPAN - test_size}
        for split, count in (("train", size), ("test", test_size)):
            for k in range(count):
                game_seed = starts[split] + k
                rows[split].append({
                    "data_source": DATA_SOURCE_PREFIX + game,
                    "prompt": [{"role": "user", "content": first_observation(game, game_seed)}],
                    "ability": "game",
                    "reward_model": {"style": "env", "ground_truth": ""},
                    "extra_info": {"split": split, "index": len(rows[split]), "game": game, "seed": game_seed},
                })
    return rows
