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
one `ta.make` per game (its wrappers keep history across resets).
textarena seeds and draws from Python's global `random`; every call here
holds one lock, gives the game its own `random` state (seeded by the row at
reset) and puts the trainer's back after, so a game's draws come from its
seed alone and the trainer's generator never moves.

Only offline games are worth listing: Hangman, Wordle, WordLadder and
WordSearch download nltk corpora at import, TwentyQuestions calls an API.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

from thinkrl.envs.base import EnvStep
from thinkrl.errors import UserError
from thinkrl.records import Sample

DATA_SOURCE_PREFIX = "textarena/"
INSTALL = "pip install -e '.[envs]' (in thinkrl's checkout) (or pip install textarena==0.7.4)"
OFFLINE_GAMES = ("GuessTheNumber-v0", "TowerOfHanoi-v0", "FrozenLake-v0", "Mastermind-v0",
                 "LightsOut-v0", "Minesweeper-v0", "FifteenPuzzle-v0")
"""Games checked to run without network here (textarena 0.7.4). Countdown-v0
also runs but is one fixed puzzle whatever the seed: no use as a data set."""
_LOCK = threading.RLock()


def check_installed() -> None:
    try:
        import textarena  # noqa: F401
    except ImportError as err:
        raise UserError(f"textarena rows need the textarena package ({err}): {INSTALL}") from None


@dataclass
class _Game:
    env: Any
    rng: Any = None
    """The game's own state of Python's `random` (textarena draws from the global one)."""
    moves: int = 0
    over: bool = False
    """The game ended and was closed (textarena scores a game at close)."""
    first: str = ""
    """The text the game showed before the first move."""


class _OwnRandom:
    """Hold the lock and give the game its own `random` state for the call
    (the trainer's is kept aside and put back), so a game's draws come from
    its seed whatever other games or the trainer drew in between."""

    def __init__(self, game: _Game | None = None) -> None:
        self.game = game

    def __enter__(self) -> None:
        _LOCK.acquire()
        self.saved = random.getstate()
        if self.game is not None and self.game.rng is not None:
            random.setstate(self.game.rng)

    def __exit__(self, *exc) -> None:
        if self.game is not None:
            self.game.rng = random.getstate()
        random.setstate(self.saved)
        _LOCK.release()


def game_of(sample: Sample) -> tuple[str, int]:
    """(game id, seed) of a textarena row."""
    info = sample.extra_info or {}
    game = info.get("game") or sample.data_source[len(DATA_SOURCE_PREFIX):]
    if "seed" not in info:
        raise UserError(f"textarena row {sample.index}: extra_info.seed is missing; write the rows "
                         "with thinkrl prep textarena")
    return str(game), int(info["seed"])


def first_observation(game: str, seed: int) -> str:
    """The text a game shows before the first move (the row's prompt)."""
    state = _start(game, seed)
    with _OwnRandom(state):
        state.env.close()
    return state.first


def _start(game: str, seed: int) -> _Game:
    import textarena as ta

    state = _Game(env=None)
    with _OwnRandom(state):  # reset seeds `random` with the row's seed: the game keeps that state
        state.env = ta.make(f"{game}-raw")
        state.env.reset(num_players=1, seed=seed)
        _, observations = state.env.get_observation()
    state.first = _game_text(observations)
    return state


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
        with _OwnRandom(state):
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
            with _OwnRandom(state):
                state.env.close()
