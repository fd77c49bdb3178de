"""The multi_turn keys: bad values are refused with the fix, settings of a
disabled tool loop are noted as inactive, a bad tool file stops the build."""

import pytest

from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.config.inactive import inactive_settings

MT = "actor_rollout_ref.rollout.multi_turn"


def test_bad_multi_turn_values_are_listed_with_the_fix():
    cfg = load_config("tiny", [f"{MT}.enable=True", f"{MT}.format=xml", f"{MT}.tool_response_truncate_side=top",
                               f"{MT}.max_assistant_turns=0", f"{MT}.max_parallel_calls=0",
                               f"{MT}.tool_timeout_s=0", "env.step_timeout_s=0", "env.concurrency=0",
                               "+data.mixture.a=-1", "async_training.mode=one_step_off",
                               "async_training.partial_rollout=False"])
    with pytest.raises(ValueError) as err:
        validate(cfg)
    text = str(err.value)
    for expected in (f"{MT}.format=xml: use one of: hermes", "tool_response_truncate_side=top: use one of: left",
                     "max_assistant_turns=0: must be a whole number >= 1, or null",
                     "max_parallel_calls=0", "tool_timeout_s=0", "env.step_timeout_s=0.0: must be > 0",
                     "env.concurrency=0", "data.mixture.a=-1: give a weight >= 0",
                     "does not run tools or environments yet"):
        assert expected in text, text


def test_tool_loop_settings_without_the_loop_are_noted():
    cfg = load_config("tiny", [f"{MT}.tool_config_path=builtin:calculator", f"{MT}.max_assistant_turns=3"])
    notes = inactive_settings(cfg)
    assert any(f"{MT}.tool_config_path=builtin:calculator has no effect" in n for n in notes), notes
    assert not any("multi_turn" in n for n in inactive_settings(load_config("calculator", [])))


def test_a_bad_tool_file_stops_the_build_before_any_model_loads(asset_cache, tiny_model_dir, tmp_path):
    from thinkrl.build import build_run

    bad = tmp_path / "tools.yaml"
    bad.write_text("tools:\n  - class_name: my_tools.Missing\n")
    cfg = load_config("tiny", [f"actor_rollout_ref.model.path={tiny_model_dir}",
                               f"trainer.default_local_dir={tmp_path / 'run'}", f"{MT}.enable=True",
                               f"{MT}.tool_config_path={bad}"])
    with pytest.raises(ValueError, match=r"tools\[0\]: cannot import my_tools.Missing"):
        build_run(cfg, log=lambda *_: None)


def test_the_doctor_loads_the_tool_file(tmp_path):
    from thinkrl.doctor import DoctorContext, run_check
    from thinkrl.doctor.data import check_tools

    good = run_check(check_tools, DoctorContext(load_config("calculator", [])))
    assert [(r.status, r.found) for r in good] == [("ok", "tool loop on: calculator")], good
    bad = tmp_path / "tools.yaml"
    bad.write_text("tools: []\n")
    (result,) = run_check(check_tools, DoctorContext(load_config("calculator", [f"{MT}.tool_config_path={bad}"])))
    assert result.status == "fail" and "non-empty `tools:` list" in result.found + result.fix
    assert run_check(check_tools, DoctorContext(load_config("tiny", []))) == []
