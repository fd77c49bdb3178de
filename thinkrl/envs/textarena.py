"""textarena's single-player text games as environments (``pip install
'thinkrl[envs]'``): rows with ``data_source`` ``textarena/<game id>`` play
that game (``thinkrl prep textarena`` writes them).

A rollout is one game: the row's prompt is the game's first observation
(its rules and board, reset with the row's seed), each turn of the policy is
a move, the game's messages since the move come back as the next user turn,
and when the game ends its reward is the rollout's score (GuessTheNumber: 1
for a win, else closeness of the last guess; TowerOfHanoi: 1 solved, else
the share of disks in place). Step metrics: ``win`` (reward 1) and
``invalid_move``.

Games run on the ``-raw`` wrapper (only the new messages after each move,
not textarena's running transcript, which the conversation already holds),
one `ta.make` per game (its wrappers keep history across resets). textarena
seeds Python's global `random` at reset; every call here holds one lock and
restores `random`'s state after, so games on several threads neither
interleave their draws nor move the trainer's generator.

Only offline games are worth listing: Hangman, Wordle, WordLadder and
WordSearch download nltk corpora at import, TwentyQuestions calls an API.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

from thinkrl.envs.base import EnvStep
from thinkrl.records import Sample

DATA_SOURCE_PREFIX = "textarena/"
INSTALL = "pip install 'thinkrl[envs]' (or pip install textarena==0.7.4)"
OFFLINE_GAMES = ("GuessTheNumber-v0", "TowerOfHanoi-v0", "FrozenLake-v0", "Mastermind-v0",
                 "LightsOut-v0", "Minesweeper-v0", "FifteenPuzzle-v0", "Countdown-v0")
"""Games checked to run without network here (textarena 0.7.4)."""
_LOCK = threading.RLock()


def check_installed() -> None:
    try:
        import textarena  # noqa: F401
    except ImportError as err:
        raise ValueError(f"textarena rows need the textarena package ({err}): {INSTALL}") from None


class _Seeded:
    """Hold the lock; leave Python's `random` as it was found."""

    def __enter__(self) -> None:
        _LOCK.acquire()
        self.saved = random.getstate()

    def __exit__(self, *exc) -> None:
        random.setstate(self.saved)
        _LOCK.release()


@dataclass
class _Game:
    env: Any
    moves: int = 0
    over: bool = False
    """The game ended and was closed (textarena scores a game at close)."""


def game_of(sample: Sample) -> tuple[str, int]:
    """(game id, seed) of a textarena row."""
    info = sample.extra_info or {}
    game = info.get("game") or sample.data_source[len(DATA_SOURCE_PREFIX):]
    if "seed" not in info:
        raise ValueError(f"textarena row {sample.index}: extra_info.seed is missing; write the rows "
                         "with thinkrl prep textarena")
    return str(game), int(info["seed"])


def first_observation(game: str, seed: int) -> str:
    """The text a game shows before the first move (the row's prompt)."""
    state = _start(game, seed)
    with _Seeded():
        state.env.close()
    return state.first


@dataclass
class _Started(_Game):
    first: str = ""


def _start(game: str, seed: int) -> _Started:
    import textarena as ta

    with _Seeded():
        env = ta.make(f"{game}-raw")
        env.reset(num_players=1, seed=seed)
        _, observations = env.get_observation()
    return _Started(env, first=_game_text(observations))


def _game_text(observations) -> str:
    """The game's own messages (not the echo of the player's move), joined."""
    return "\n".join(str(message) for sender, message, *_ in observations if sender == -1).strip()


class TextArenaEnv:
    """Any textarena single-player game; the row says which (and its seed)."""

    scores = True

    def __init__(self, config: dict | None = None) -> None:
        check_installed()
        self.config = dict(config or {})

    def reset(self, sample: Sample) -> _Game:
        game, seed = game_of(sample)
        return _start(game, seed)

    def step(self, state: _Game, reply: str) -> EnvStep:
        with _Seeded():
            done, _info = state.env.step(reply)
            state.moves += 1
            if not done:
                _, observations = state.env.get_observation()
                return EnvStep(messages=({"role": "user", "content": _game_text(observations)},))
            rewards, game_info = state.env.close()
            state.over = True
        reward = float(rewards.get(0, 0.0)) if isinstance(rewards, dict) else 0.0
        info = (game_info or {}).get(0, {}) if isinstance(game_info, dict) else {}
        return EnvStep(reward=reward, done=True,
                       metrics={"win": float(reward >= 1.0), "invalid_move": float(bool(info.get("invalid_move")))})

    def close(self, state: _Game) -> None:
        if not state.over:  # cut short (length, turn limit, a failure)
            with _Seeded():
                state.env.close()
