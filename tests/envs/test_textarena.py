"""textarena games as environments, on the installed package (skipped
without it): the rows `thinkrl prep textarena` writes start the game the
environment resets, a bisecting player wins GuessTheNumber through the
environment, Python's global random state is left alone, and rows route to
the built-in environment by data source."""

from __future__ import annotations

import random
import re

import pytest

pytest.importorskip("textarena")

from thinkrl.data.prep.textarena import generate, parse_games  # noqa: E402
from thinkrl.envs.routing import EnvRouter  # noqa: E402
from thinkrl.envs.textarena import TextArenaEnv, first_observation  # noqa: E402
from thinkrl.records import SINGLE_TURN, Sample  # noqa: E402

GAME = "GuessTheNumber-v0"


def sample_of(row: dict) -> Sample:
    return Sample(row["data_source"], row["reward_model"]["ground_truth"], row["prompt"][0]["content"],
                  extra_info=row["extra_info"], index=row["extra_info"]["index"])


def test_prep_writes_one_game_per_row_seeded_apart():
    rows = generate((GAME,), size=3, test_size=2, seed=1)
    seeds = [r["extra_info"]["seed"] for split in ("train", "test") for r in rows[split]]
    assert len(set(seeds)) == 5 and rows["train"][0]["data_source"] == "textarena/" + GAME
    assert rows["test"][0]["prompt"][0]["content"].startswith("You are Player 0. You are playing Guess The Number.")
    with pytest.raises(ValueError, match="did you mean GuessTheNumber-v0"):
        parse_games("GuesTheNumber-v0")


def test_a_bisecting_player_wins_through_the_environment():
    env = TextArenaEnv()
    row = generate((GAME,), size=1, test_size=0, seed=3)["train"][0]
    state = env.reset(sample_of(row))
    low, high, turns = 1, 20, 0
    while True:
        guess = (low + high) // 2
        step = env.step(state, f"I think it is [{guess}]")
        turns += 1
        if step.done:
            break
        hint = step.messages[0]["content"]
        assert step.messages[0]["role"] == "user" and "[Player]" not in hint  # only the game's words
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
    assert step.reward == 1.0 and step.metrics == {"win": 1.0, "invalid_move": 0.0} and turns <= 5
    env.close(state)  # after the game ended: nothing left to close


def test_a_game_is_the_same_game_for_its_seed_and_leaves_random_alone():
    random.seed(123)
    before = random.random()
    random.seed(123)
    first = first_observation(GAME, 7)
    env = TextArenaEnv()
    row = {"data_source": "textarena/" + GAME, "prompt": [{"content": first}],
           "reward_model": {"ground_truth": ""}, "extra_info": {"game": GAME, "seed": 7, "index": 0}}
    targets = []
    for _ in range(2):
        state = env.reset(sample_of(row))
        text = env.step(state, "[10]").messages
        targets.append(text)
        env.close(state)
    assert targets[0] == targets[1]
    assert random.random() == before  # textarena's reset seeded its own copy of the state, not ours


def test_a_games_later_draws_come_from_its_seed_not_from_what_ran_between():
    # Minesweeper lays its mines at the first reveal, drawing from `random` then
    env = TextArenaEnv()
    row = {"data_source": "textarena/Minesweeper-v0", "prompt": [{"content": ""}],
           "reward_model": {"ground_truth": ""}, "extra_info": {"game": "Minesweeper-v0", "seed": 5, "index": 0}}
    boards = []
    for k in range(2):
        state = env.reset(sample_of(row))
        random.seed(k)  # the trainer (or another game) draws in between
        random.random()
        boards.append(env.step(state, "[3 3]").messages)
        env.close(state)
    assert boards[0] == boards[1]


def test_rows_reach_the_built_in_environment_by_data_source():
    router = EnvRouter(named={}, by_data_source={}, default=SINGLE_TURN, wrap_tools=None,
                       builtins={"textarena": TextArenaEnv})
    row = generate((GAME,), size=1, test_size=0, seed=1)["train"][0]
    assert router.name_for(sample_of(row)) == "textarena"
    assert router.owns_reward(sample_of(row))
    assert re.search(r"\[5\]", row["prompt"][0]["content"])  # the game's own example of a move
