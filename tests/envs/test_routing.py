"""Which environment a row talks to: verl's agent_name and
interaction_kwargs.name first, then env.by_data_source, then the built-in
routes, then the run's default; the tools wrap verl interactions (verl's
tool agent); a misnamed environment is refused with the closest name; the
doctor resolves every row and leaves game rows out of the reward check."""

from __future__ import annotations

import pytest

from thinkrl.envs.routing import TOOL_AGENT, EnvRouter
from thinkrl.envs.setup import check_rows
from thinkrl.envs.tool_env import ToolEnvironment, ToolLimits
from thinkrl.records import SINGLE_TURN, Sample
from thinkrl.tools.registry import ToolRunner

from toy_envs import Guess


class Interaction(Guess):
    tool_turns = True  # as verl interactions say


def router(*, tools: bool, by_data_source=None, named=None) -> EnvRouter:
    runner = ToolRunner([], concurrency=1, timeout_s=1)
    wrap = (lambda inner: ToolEnvironment(runner, ToolLimits(), inner=inner)) if tools else None
    return EnvRouter(named=named if named is not None else {"guess": Guess(), "users": Interaction()},
                     by_data_source=by_data_source or {}, default=TOOL_AGENT if tools else SINGLE_TURN,
                     wrap_tools=wrap, builtins={"retry_user": Guess})


def row(source="a/b", **extra) -> Sample:
    return Sample(source, "1", "p", extra_info=extra)


def test_the_first_rule_that_applies_picks_the_environment():
    r = router(tools=False, by_data_source={"games/*": "guess", "a/b": "users"})
    assert r.name_for(row(agent_name="single_turn_agent", interaction_kwargs={"name": "users"})) == SINGLE_TURN
    assert r.name_for(row("games/x", agent_name="guess")) == "guess"
    assert r.name_for(row("games/x", interaction_kwargs={"name": "users"})) == "users"
    assert r.name_for(row("games/x")) == "guess"  # env.by_data_source, a glob
    assert r.name_for(row("a/b")) == "users"  # env.by_data_source, an exact name
    assert r.name_for(row("textarena/GuessTheNumber-v0")) == "textarena"  # the built-in route
    assert r.name_for(row("other/c")) == SINGLE_TURN  # no tools: one turn
    assert router(tools=True).name_for(row("other/c")) == TOOL_AGENT  # multi_turn.enable: the tool loop
    assert r.name_for(row(interaction_kwargs={"name": "retry_user"})) == "retry_user"  # a built-in by name


def test_tools_wrap_interactions_and_tool_agent_but_not_games():
    r = router(tools=True)
    assert isinstance(r.env("users"), ToolEnvironment) and r.env("users").inner is r.named["users"]
    assert isinstance(r.env(TOOL_AGENT), ToolEnvironment) and r.env(TOOL_AGENT).inner is None
    assert isinstance(r.env("guess"), Guess)  # a thinkrl environment answers every turn itself
    assert r.env(SINGLE_TURN) is None
    plain = router(tools=False)
    assert plain.env("users") is plain.named["users"]
    assert plain.owns_reward(row(agent_name="guess")) and not plain.owns_reward(row())


def test_an_unknown_environment_is_refused_at_start_with_the_closest_name():
    r = router(tools=False)
    with pytest.raises(ValueError, match=r"data.train_files: row 0 .* 'gues', .*did you mean 'guess'"):
        check_rows(r, [row(agent_name="gues")], key="data.train_files", log=lambda *_: None)
    notes = []
    counts = check_rows(router(tools=False, named={}), [row(interaction_kwargs={"name": "sums"})] * 2,
                        key="data.val_files", log=notes.append)
    assert counts == {SINGLE_TURN: 2}  # as verl: no interaction file, one turn ...
    assert "2 row(s) name an interaction" in notes[0]  # ... said at start


def test_the_doctor_resolves_rows_and_a_game_needs_no_reward_function(tmp_path):
    pytest.importorskip("textarena")
    from thinkrl.config import load_config
    from thinkrl.data.prep import write_splits
    from thinkrl.data.prep.textarena import generate
    from thinkrl.doctor import DoctorContext, run_check
    from thinkrl.doctor.data import check_environments, check_reward

    write_splits(generate(("GuessTheNumber-v0",), size=2, test_size=1, seed=1), output=tmp_path, overwrite=True)
    cfg = load_config("tiny", [f"data.train_files={tmp_path / 'train.parquet'}",
                               f"data.val_files={tmp_path / 'test.parquet'}"])
    ctx = DoctorContext(cfg)
    (found,) = run_check(check_environments, ctx)
    assert found.status == "ok" and found.found == "textarena: 3 rows"
    (reward,) = run_check(check_reward, ctx)
    assert reward.status == "ok" and "scored by its environment" in reward.found
